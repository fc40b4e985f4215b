"""``label-rbac report``: the background audit, kept current as policy reports.

RBAC comes from the webhook's own cluster source (informers and the incremental snapshot); the
labels of every object of a restricted resource from metadata-only informers (names and labels
only, never a Secret's data). Either changing marks the audit dirty; a pass (at most one per
``interval`` seconds) judges the objects held in those caches (no relist) with
``app.engine.reverse.audit``, renders one report per namespace and one cluster report
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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from app.compiled.compiler import LeaderLease
from app.engine.incremental import Change, LiveSnapshot
from app.engine.kinds import KindSpec
from app.engine.model import Resource
from app.engine.reverse import Existing, audit, is_restricted
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
from app.source.listing import ApiResource, discover
from app.source.metadata import MetadataInformer, _labels

log = logging.getLogger("label_rbac.report")

FIELD_MANAGER = "label-rbac-reporter"
APPLY = "application/apply-patch+yaml"
_APPLY_QUERY = [("fieldManager", FIELD_MANAGER), ("force", "true")]
DISCOVERY_INTERVAL = 60.0
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
        self._tuning = Tuning(start_wait=0)
        self.source = ClusterSource(
            client, settings.compiler, tuning=self._tuning, on_applied=self._applied
        )
        self._informers: dict[Resource, MetadataInformer] = {}
        self._served: list[ApiResource] = []
        self._discovered_at = -DISCOVERY_INTERVAL
        self._written: dict[tuple[str, str, str], bytes] = {}  # (resource, ns, name) → digest
        self._seen: dict[str, int] = {}  # finding → when first seen (its result's timestamp)
        self._limit = RateLimit(options.writes_per_second)
        self.leading = False

    def _applied(self, live: LiveSnapshot, changes: list[Change]) -> None:
        self._dirty.set()

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
            spec = KindSpec(str(resource), api.group, api.resource, lambda _c, o: _labels(o),
                            api.version)  # fmt: skip
            informer = MetadataInformer(spec, self._client, _labels, self._dirty.set, self._tuning)
            self._informers[resource] = informer
            informer.start()
            log.info("auditing %s (metadata-only list/watch)", resource)

    def _objects(self) -> tuple[list[Existing], dict[Resource, str]] | None:
        """Every watched object, and the resources that cannot be listed (with why); None
        while an informer is still making its first list."""
        found: list[Existing] = []
        unreadable: dict[Resource, str] = {}
        for resource, informer in self._informers.items():
            if not informer.synced:
                if not informer.last_error:
                    return None
                # Forbidden or failing: said in the cluster report, never silently skipped.
                unreadable[resource] = informer.last_error
                continue
            found += [Existing(resource, ns, name, labels) for ns, name, labels in
                      informer.objects()]  # fmt: skip
        return found, unreadable

    def _first_seen(self, key: str) -> int:
        return self._seen.setdefault(key, int(time.time()))

    def render(self) -> dict[tuple[str, str, str], dict[str, Any]] | None:
        """Every report due: (resource, namespace, name) → the report."""
        snapshot = self.source.snapshot()
        listed = self._objects()
        if snapshot is None or listed is None:
            return None
        objects, unreadable = listed
        report = audit(snapshot, objects, self._settings.allow_unlabeled)
        scopes = findings(snapshot, report, self._first_seen)
        count_passes(objects, report, scopes)
        due: dict[tuple[str, str, str], dict[str, Any]] = {}
        cluster = scopes.setdefault("", Scope())  # the cluster report exists even when empty
        cluster.results += [unaudited(r, why, self._first_seen) for r, why in unreadable.items()]
        for namespace, scope in scopes.items():
            for kind in self._options.kinds:
                resource = kind.resource if namespace else kind.cluster_resource
                for item in reports(namespace, scope, kind, self._options.max_results):
                    due[(f"{kind.api_version}/{resource}", namespace, item["metadata"]["name"])] = (
                        item
                    )
        counts = {"pass": 0, "fail": 0, "error": 0}
        for item in due.values():
            for result in counts:
                counts[result] += item["summary"][result]
        for result, count in counts.items():
            RESULTS.labels(result).set(count)
        return due

    def step(self) -> None:
        leading = self._lease.keep(self._lease.duration / 3)
        if leading and not self.leading:
            log.info("leading: writing every report")
            self._written = self._stored()
            self._dirty.set()
        self.leading = leading
        if not leading:
            return
        self._watch_restricted()
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

    def _write(self, due: Mapping[tuple[str, str, str], dict[str, Any]]) -> None:
        for key, body in due.items():
            text = json.dumps(body, sort_keys=True).encode()
            digest = hashlib.sha256(text).digest()
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

    def _stored(self) -> dict[tuple[str, str, str], bytes]:
        """The reports a previous leader wrote (their content unknown: all are rewritten, and
        the ones no longer due are deleted)."""
        found: dict[tuple[str, str, str], bytes] = {}
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
