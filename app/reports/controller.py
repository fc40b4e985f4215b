"""``label-rbac report``: the background audit, kept current as policy reports.

RBAC comes from the webhook's own cluster source (informers and the incremental snapshot); the
labels of every object of a restricted resource from metadata-only informers (names and labels
only, never a Secret's data). A change marks the namespaces it touches: an object's own, the
namespaces an RBAC change reaches (``app.engine.params.touched``, every one for a cluster-wide
binding) and a changed role's own. A pass (at most one per ``interval`` seconds) judges the
objects of those namespaces held in the caches (no relist) with ``app.engine.reverse.audit``,
keeps the other namespaces' findings, renders one report per namespace and one cluster report
(``app.reports.render``), and writes only the reports whose content changed, with server-side
apply, at most ``writes_per_second``. Reports of namespaces left without findings or passes are
deleted. Exactly one replica writes: the holder of a ``coordination.k8s.io`` Lease (the
compiler's ``LeaderLease``). Every write counts in ``label_rbac_report_writes_total`` by outcome.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from app.engine.incremental import CATEGORIES, ROLES, Change, LiveSnapshot
from app.engine.kinds import KindSpec
from app.engine.model import Resource
from app.engine.params import ALL, touched
from app.engine.reverse import AuditCache, Existing, audit, is_restricted
from app.reports.render import (
    MAX_RESULTS,
    NAME,
    WGPOLICY,
    ReportKind,
    Scope,
    count_passes,
    findings,
    reports,
    unaudited,
)
from app.settings import Settings
from app.source.api import ApiError, KubeClient, KubeError, object_path
from app.source.cluster import ClusterSource
from app.source.informer import Tuning
from app.source.lease import LeaderLease
from app.source.listing import ApiResource, discover
from app.source.metadata import MetadataInformer, _labels

log = logging.getLogger("label_rbac.report")

FIELD_MANAGER = "label-rbac-reporter"
APPLY = "application/apply-patch+yaml"
_APPLY_QUERY = [("fieldManager", FIELD_MANAGER), ("force", "true")]
DISCOVERY_INTERVAL = 60.0
# The most findings whose first sighting is remembered (a result's timestamp).
MAX_SEEN = 200_000
MANAGED = "app.kubernetes.io/managed-by=label-rbac"

REGISTRY = CollectorRegistry()
WRITES = Counter(
    "label_rbac_report_writes",
    "Report writes by outcome (written, unchanged, deleted, failed)",
    ["outcome"],
    registry=REGISTRY,
)
PASSES = Counter("label_rbac_report_passes", "Background audit passes", registry=REGISTRY)
RESULTS = Gauge(
    "label_rbac_report_results", "Results in the reports, by result", ["result"], registry=REGISTRY
)
PASS_SECONDS = Gauge(
    "label_rbac_report_pass_seconds", "How long the last audit pass took", registry=REGISTRY
)


@dataclass(frozen=True)
class Options:
    interval: float = 2.0
    writes_per_second: float = 20.0
    max_results: int = MAX_RESULTS
    kinds: tuple[ReportKind, ...] = (WGPOLICY,)


@dataclass(frozen=True)
class Labeled:
    """What the audit keeps of an object: its namespace and labels."""

    namespace: str
    labels: Mapping[str, str]


def _labeled(obj: Mapping[str, Any]) -> Labeled:
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace") if isinstance(meta, Mapping) else None
    return Labeled(namespace if isinstance(namespace, str) else "", _labels(obj))


class AuditedInformer(MetadataInformer):
    """A metadata informer of one audited resource, telling which namespace each change is in."""

    def objects(self, namespaces: frozenset[str] | None = None) -> list[tuple[str, Labeled]]:
        """(name, what is kept) of the cached objects, in ``namespaces`` when given."""
        with self._lock:
            items = list(self._items.items())
        return [
            (key.partition("/")[2], cached.value)
            for key, cached in items
            if namespaces is None or cached.value.namespace in namespaces
        ]


class RateLimit:
    """At most ``per_second`` calls of ``wait`` return per second (a plain spacing)."""

    def __init__(self, per_second: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._spacing = 1.0 / per_second if per_second > 0 else 0.0
        self._next = 0.0
        self._clock = clock

    def wait(self) -> None:
        now = self._clock()
        if now < self._next:
            time.sleep(self._next - now)
        self._next = max(now, self._next) + self._spacing


Key = tuple[str, str, str]  # (group/version/resource, namespace, name) of a report
Due = dict[Key, tuple[dict[str, Any], bytes]]  # each report due, with its content's digest


class Reporter:
    """Watches, audits and writes the reports while the lease is held."""

    def __init__(
        self, client: KubeClient, settings: Settings, lease: LeaderLease, options: Options
    ) -> None:
        self._client = client
        self._settings = settings
        self._lease = lease
        self._options = options
        self._dirty = threading.Event()
        self._lock = threading.Lock()
        # Namespaces whose findings are out of date ("" the cluster scope; ALL: every one).
        self._pending: set[str] = set(ALL)
        self._tuning = Tuning(start_wait=0)
        self.source = ClusterSource(
            client, settings.compiler, tuning=self._tuning, on_applied=self._applied
        )
        self._informers: dict[Resource, AuditedInformer] = {}
        self._served: list[ApiResource] = []
        self._discovered_at = -DISCOVERY_INTERVAL
        self._scopes: dict[str, Scope] = {}  # the findings of each namespace, as last judged
        self._rendered: dict[str, Due] = {}  # the reports of each namespace, as last rendered
        self._written: dict[Key, bytes] = {}  # what each report was last written with
        self._seen: dict[str, int] = {}  # finding → when first seen (its result's timestamp)
        self._cache = AuditCache()  # answers kept while RBAC does not change
        self._limit = RateLimit(options.writes_per_second)
        self.leading = False

    def _mark(self, namespaces: Iterable[str]) -> None:
        with self._lock:
            self._pending.update(namespaces)
        self._dirty.set()

    def _applied(self, live: LiveSnapshot, changes: list[Change]) -> None:
        """After each batch of RBAC changes: the namespaces whose findings they may alter."""
        found = set(touched(live, changes))
        for kind, old, new in changes:
            if CATEGORIES.get(kind) == ROLES:  # a role's own annotation finding
                found.update(role.ref.namespace for role in (old, new) if role is not None)
        self._mark(found)

    def _object_changed(self, old: Labeled | None, new: Labeled | None) -> None:
        self._mark(value.namespace for value in (old, new) if value is not None)

    def start(self) -> None:
        self.source.start()

    def stop(self) -> None:
        self.source.stop()
        for informer in self._informers.values():
            informer.stop()

    def _watch_restricted(self) -> None:
        """Start a metadata informer for every served resource some role restricts now."""
        snapshot = self.source.snapshot()
        if snapshot is None:
            return
        if time.monotonic() - self._discovered_at >= DISCOVERY_INTERVAL:
            self._served = discover(self._client)
            self._discovered_at = time.monotonic()
        for api in self._served:
            resource = api.as_resource
            if resource in self._informers or not is_restricted(snapshot, resource):
                continue
            spec = KindSpec(str(resource), api.group, api.resource,
                            lambda _c, o: _labeled(o), api.version)  # fmt: skip
            informer = AuditedInformer(
                spec, self._client, _labeled, self._dirty.set, self._tuning,
                on_update=self._object_changed,
            )  # fmt: skip
            self._informers[resource] = informer
            informer.start()
            log.info("auditing %s (metadata-only list/watch)", resource)

    def _unreadable(self) -> dict[Resource, str] | None:
        """The resources that cannot be listed (and why); None while an informer is still
        making its first list."""
        found = {}
        for resource, informer in self._informers.items():
            if not informer.synced:
                if not informer.last_error:
                    return None
                # Forbidden or failing: said in the cluster report, never silently skipped.
                found[resource] = informer.last_error
        return found

    def _objects(self, namespaces: frozenset[str] | None) -> list[Existing]:
        """The watched objects (in ``namespaces`` when given), from the caches."""
        return [
            Existing(resource, kept.namespace, name, kept.labels)
            for resource, informer in self._informers.items()
            if informer.synced
            for name, kept in informer.objects(namespaces)
        ]

    def _first_seen(self, key: str) -> int:
        if len(self._seen) > MAX_SEEN:  # bounded: past it, findings are dated anew
            self._seen.clear()
        return self._seen.setdefault(key, int(time.time()))

    def render(self) -> Due | None:
        """Judge the namespaces marked since the last pass; every report due."""
        snapshot = self.source.snapshot()
        unreadable = self._unreadable()
        if snapshot is None or unreadable is None:
            return None
        with self._lock:
            pending, self._pending = self._pending, set()
        everything = bool(pending & ALL)
        namespaces = None if everything else frozenset(pending)
        objects = self._objects(namespaces)
        report = audit(
            snapshot, objects, self._settings.allow_unlabeled, with_buckets=False, cache=self._cache
        )
        fresh = findings(snapshot, report, self._first_seen)
        count_passes(objects, report, fresh)
        if everything:
            self._scopes, self._rendered = fresh, {}
        for namespace in fresh if namespaces is None else namespaces:
            if namespace in fresh:
                self._scopes[namespace] = fresh[namespace]
            else:
                self._scopes.pop(namespace, None)
            self._rendered.pop(namespace, None)
        # The cluster scope says which resources cannot be listed: rendered on every pass.
        cluster = Scope(list(self._scopes.get("", Scope()).results),
                        self._scopes.get("", Scope()).passed)  # fmt: skip
        cluster.results += [unaudited(r, why, self._first_seen) for r, why in unreadable.items()]
        self._rendered[""] = self._render("", cluster)
        for namespace, scope in self._scopes.items():
            if namespace not in self._rendered:
                self._rendered[namespace] = self._render(namespace, scope)
        due: Due = {key: item for found in self._rendered.values() for key, item in found.items()}
        counts = {"pass": 0, "fail": 0, "error": 0}
        for body, _ in due.values():
            for result in counts:
                counts[result] += body["summary"][result]
        for result, count in counts.items():
            RESULTS.labels(result).set(count)
        return due

    def _render(self, namespace: str, scope: Scope) -> Due:
        found: Due = {}
        for kind in self._options.kinds:
            resource = kind.resource if namespace else kind.cluster_resource
            for body in reports(namespace, scope, kind, self._options.max_results):
                digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).digest()
                key = (f"{kind.api_version}/{resource}", namespace, body["metadata"]["name"])
                found[key] = (body, digest)
        return found

    def step(self) -> None:
        leading = self._lease.keep(self._lease.duration / 3)
        if leading and not self.leading:
            log.info("leading: writing every report")
            self._written = self._stored()
            self._mark(ALL)
        self.leading = leading
        if not leading:
            return
        known = len(self._informers)
        self._watch_restricted()
        if len(self._informers) != known:
            self._mark(ALL)  # a resource newly restricted: its objects are new to every scope
        if not self._dirty.is_set():
            return
        self._dirty.clear()
        started = time.monotonic()
        due = self.render()
        if due is None:
            self._dirty.set()  # not synced yet: again next round
            return
        self._write(due)
        PASSES.inc()
        PASS_SECONDS.set(time.monotonic() - started)

    def _path(self, key: tuple[str, str, str]) -> str:
        api_resource, namespace, name = key
        group_version, _, resource = api_resource.rpartition("/")
        group, _, version = group_version.partition("/")
        return f"{object_path(group, version, resource, namespace)}/{name}"

    def _write(self, due: Due) -> None:
        for key, (body, digest) in due.items():
            if self._written.get(key) == digest:
                WRITES.labels("unchanged").inc()
                continue
            if not self._lease.current():
                return
            self._limit.wait()
            try:
                self._client.send("PATCH", self._path(key), body, _APPLY_QUERY, APPLY)
            except KubeError as exc:
                WRITES.labels("failed").inc()
                log.warning("could not write %s: %s", self._path(key), exc)
                self._rendered.pop(key[1], None)  # rendered (and tried) again next pass
                self._dirty.set()
                continue
            self._written[key] = digest
            WRITES.labels("written").inc()
        for key in [k for k in self._written if k not in due]:
            self._limit.wait()
            try:
                self._client.send("DELETE", self._path(key), {})
            except ApiError as exc:
                if exc.status != 404:
                    WRITES.labels("failed").inc()
                    continue
            except KubeError:
                WRITES.labels("failed").inc()
                continue
            del self._written[key]
            WRITES.labels("deleted").inc()

    def _stored(self) -> dict[Key, bytes]:
        """The reports a previous leader wrote (their content unknown: all are rewritten, and
        the ones no longer due are deleted)."""
        found: dict[Key, bytes] = {}
        for kind in self._options.kinds:
            group, _, version = kind.api_version.partition("/")
            for resource in (kind.resource, kind.cluster_resource):
                path = object_path(group, version, resource)
                try:
                    items, _ = self._client.list_each(
                        path,
                        500,
                        (5.0, 60.0),
                        lambda item: item,
                        metadata_only=True,
                        selector=(("labelSelector", MANAGED),),
                    )
                except KubeError as exc:
                    log.warning("could not list %s: %s", path, exc)
                    continue
                for item in items:
                    meta = item.get("metadata") or {}
                    key = (f"{kind.api_version}/{resource}", str(meta.get("namespace") or ""),
                           str(meta.get("name") or NAME))  # fmt: skip
                    found[key] = b""
        return found

    def wait(self, seconds: float) -> None:
        self._dirty.wait(seconds)


def run(
    client: KubeClient,
    settings: Settings,
    lease: LeaderLease,
    stop: threading.Event,
    options: Options,
) -> None:
    """Watch, audit and write until ``stop`` is set."""
    reporter = Reporter(client, settings, lease, options)
    reporter.start()
    try:
        while not stop.is_set():
            try:
                reporter.step()
            except KubeError as exc:
                log.warning("report round failed: %s", exc)
            reporter.wait(options.interval)
            stop.wait(options.interval if reporter.leading else 0)
    finally:
        reporter.stop()
