"""``label-rbac report``: the background audit, kept current as policy reports.

RBAC comes from the webhook's own cluster source (informers and the incremental snapshot); the
labels of every object of a restricted resource from metadata-only informers (names, uids and
labels only, never a Secret's data). A change marks the namespaces it touches: an object's own,
the namespaces an RBAC change reaches (``app.engine.params.touched``, every one for a
cluster-wide binding) and a changed role's own. A pass (at most one per ``interval`` seconds)
judges the objects of those namespaces held in the caches (no relist) with
``app.engine.reverse.audit``, keeps the other namespaces' findings, renders one report per
namespace and one cluster report (``app.reports.render``), and writes the reports whose content
changed with server-side apply, at most ``writes_per_second``. System namespaces and the
reporter's own are left out unless asked for (``Options.excluded``).

While some role carries a placement (``app.engine.reverse.places_pods``), the pods bound to a
node are watched too, whole (a pod's node is in its spec), keeping of each only what the
placement audit reads (``app.source.listing.bound_pod``: namespace, name, uid, labels, node);
the Nodes' labels are the cluster source's. A pod bound, relabelled or deleted marks its
namespace; a Node whose labels change marks the namespaces of the pods bound to it.

What is written is reconciled with what is **stored**, not with what was last sent: a
metadata-only watch of the reports carrying the reporter's label tells every change. A report
changed by anyone else (its resourceVersion is not the one the reporter's write returned),
deleted, or stripped of the label is written again at the next pass; a report carrying the label
that is not due (a stray) is deleted. A report the API server refuses as too large or invalid is
deleted rather than left stale. A report kind whose CRD is not served is said once, with the CRD
to install, and not written until discovery finds it.

Exactly one replica writes: the holder of a ``coordination.k8s.io`` Lease
(``app.source.lease``). A replica that takes over reads the stored reports once for when each
finding was first seen (a result's ``timestamp`` survives leader changes). Every write counts in
``label_rbac_report_writes_total`` by outcome.
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

from app.engine.incremental import CATEGORIES, NODES, ROLES, Change, LiveSnapshot
from app.engine.kinds import KindSpec
from app.engine.model import Resource
from app.engine.params import ALL, touched
from app.engine.rbac import RoleRef, Snapshot
from app.engine.reverse import (
    PODS,
    AuditCache,
    BoundPod,
    Existing,
    audit,
    is_restricted,
    places_pods,
)
from app.reports.render import (
    MANAGED_BY,
    MAX_BYTES,
    MAX_PASSES,
    MAX_RESULTS,
    SOURCE,
    WGPOLICY,
    ReportKind,
    Scope,
    count_passes,
    findings,
    reports,
    seen_key,
    unaudited,
)
from app.settings import Settings
from app.source.api import ApiError, KubeClient, KubeError, object_path
from app.source.cluster import ClusterSource
from app.source.informer import Informer, Tuning
from app.source.lease import LeaderLease
from app.source.listing import ApiResource, bound_pod, discover
from app.source.metadata import MetadataInformer, _labels

log = logging.getLogger("label_rbac.report")

FIELD_MANAGER = "label-rbac-reporter"
APPLY = "application/apply-patch+yaml"
_APPLY_QUERY = [("fieldManager", FIELD_MANAGER), ("force", "true")]
DISCOVERY_INTERVAL = 60.0
# The most first sightings a new leader reads from the stored reports.
MAX_CARRIED = 500_000
MANAGED = f"{MANAGED_BY}={SOURCE}"
# Namespaces left out unless asked for: the cluster's own, whose objects no tenant labels.
SYSTEM_NAMESPACES = frozenset({"kube-system", "kube-public", "kube-node-lease"})
# Stored reports read per page when a replica takes over (a report may be up to 1 MB).
STORED_PAGE = 10
# Refusals that writing the same report again cannot cure: the stored one is deleted instead.
UNWRITABLE = frozenset({400, 413, 422})

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
    max_bytes: int = MAX_BYTES
    max_passes: int = MAX_PASSES
    # Namespaces neither audited nor reported (any report of the reporter's there is deleted).
    excluded: frozenset[str] = SYSTEM_NAMESPACES


@dataclass(frozen=True)
class Labeled:
    """What the audit keeps of an object: its namespace, labels and uid."""

    namespace: str
    labels: Mapping[str, str]
    uid: str = ""


def _text(meta: Any, key: str) -> str:
    value = meta.get(key) if isinstance(meta, Mapping) else None
    return value if isinstance(value, str) else ""


def _labeled(obj: Mapping[str, Any]) -> Labeled:
    meta = obj.get("metadata") or {}
    return Labeled(_text(meta, "namespace"), _labels(obj), _text(meta, "uid"))


@dataclass(frozen=True)
class Stored:
    """A report as stored: where it is and the version the API server gave it."""

    key: tuple[str, str, str]
    version: str


class StoredReports(MetadataInformer):
    """A metadata-only watch of one report resource, of the reports carrying the label."""

    def version(self, namespace: str, name: str) -> str | None:
        """The stored version of a report, None when it is not stored (or not labeled)."""
        cached = self._items.get(f"{namespace}/{name}")  # one dict read: no lock needed
        return None if cached is None else cached.value.version

    def __init__(self, kind: ReportKind, resource: str, client: KubeClient, tuning: Tuning,
                 on_update: Callable[[Any, Any], None]) -> None:  # fmt: skip
        group, _, version = kind.api_version.partition("/")
        api = f"{kind.api_version}/{resource}"

        def stored(obj: Mapping[str, Any]) -> Stored:
            meta = obj.get("metadata") or {}
            key = (api, _text(meta, "namespace"), _text(meta, "name"))
            return Stored(key, _text(meta, "resourceVersion"))

        spec = KindSpec(api, group, resource, lambda _c, o: stored(o), version)
        super().__init__(spec, client, stored, _nothing, tuning, on_update=on_update,
                         label_selector=MANAGED)  # fmt: skip


def _nothing() -> None:
    """Each change of a stored report is told one by one (``on_update``)."""


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


class BoundPods(Informer):
    """The pods bound to a node, listed and watched whole (the node is in the spec) but kept
    as ``BoundPod`` only: what the placement audit reads."""

    def __init__(self, client: KubeClient, tuning: Tuning,
                 on_update: Callable[[Any, Any], None]) -> None:  # fmt: skip
        spec = KindSpec("bound pods", "", "pods", lambda _c, o: bound_pod(o))
        super().__init__(spec, client, bound_pod, _nothing, tuning, on_update=on_update,
                         field_selector="spec.nodeName!=")  # fmt: skip

    def pods(self, namespaces: frozenset[str] | None = None) -> list[BoundPod]:
        """The cached pods, in ``namespaces`` when given."""
        with self._lock:
            found = [cached.value for cached in self._items.values()]
        return [
            pod for pod in found
            if isinstance(pod, BoundPod) and (namespaces is None or pod.namespace in namespaces)
        ]  # fmt: skip

    def namespaces_on(self, nodes: frozenset[str]) -> set[str]:
        """The namespaces of the pods bound to ``nodes``."""
        return {pod.namespace for pod in self.pods() if pod.node in nodes}


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
        self._pods: BoundPods | None = None  # while some role carries a placement
        # The snapshot the last batch of changes made, set with the namespaces it marks: a pass
        # never judges them with the snapshot before (the source publishes it just after).
        self._latest: Snapshot | None = None
        self._served: list[ApiResource] = []
        self._reports_served: set[tuple[str, str]] = set()  # (api version, resource)
        self._discovered_at = -DISCOVERY_INTERVAL
        self._scopes: dict[str, Scope] = {}  # the findings of each namespace, as last judged
        self._rendered: dict[str, Due] = {}  # the reports of each namespace, as last rendered
        self._written: dict[Key, bytes] = {}  # what each report was last written with
        self._versions: dict[Key, str] = {}  # the resourceVersion each write of ours returned
        self._stored: dict[tuple[str, str], StoredReports] = {}  # (api version, resource) →
        self._missing: set[str] = set()  # report resources said to be unserved
        # When each result being rendered again was first seen: its timestamp as last rendered.
        self._previous: dict[str, int] = {}
        self._cache = AuditCache()  # answers kept while RBAC does not change
        self._limit = RateLimit(options.writes_per_second)
        self._carried: dict[str, int] = {}  # first sightings read from the stored reports
        self._uids: tuple[object, dict[RoleRef, str]] = (None, {})  # (snapshot, role → uid)
        self.leading = False

    def _mark(self, namespaces: Iterable[str]) -> None:
        with self._lock:
            self._pending.update(namespaces)
        self._dirty.set()

    def _applied(self, live: LiveSnapshot, changes: list[Change]) -> None:
        """After each batch of RBAC changes: the namespaces whose findings they may alter."""
        found = set(touched(live, changes))
        nodes: set[str] = set()
        for kind, old, new in changes:
            if CATEGORIES.get(kind) == ROLES:  # a role's own annotation finding
                found.update(role.ref.namespace for role in (old, new) if role is not None)
            elif CATEGORIES.get(kind) == NODES:  # (name, KnownNode): told only when it changed
                nodes.update(node[0] for node in (old, new) if node is not None)
        pods = self._pods
        if nodes and pods is not None:
            found |= pods.namespaces_on(frozenset(nodes))
        with self._lock:
            self._latest = live.snapshot
        self._mark(found)

    def _pod_changed(self, old: BoundPod | None, new: BoundPod | None) -> None:
        self._mark(pod.namespace for pod in (old, new) if pod is not None)

    def _object_changed(self, old: Labeled | None, new: Labeled | None) -> None:
        self._mark(value.namespace for value in (old, new) if value is not None)

    def start(self) -> None:
        self.source.start()

    def stop(self) -> None:
        self.source.stop()
        for informer in [*self._informers.values(), *self._stored.values()]:
            informer.stop()
        if self._pods is not None:
            self._pods.stop()

    def _stored_changed(self, old: Stored | None, new: Stored | None) -> None:
        """A stored report changed: unless it is our own last write, a pass compares it again
        (``_write``: written again, or deleted when not due)."""
        if new is None or self._versions.get(new.key) != new.version:
            self._dirty.set()

    def _serving(self) -> set[tuple[str, str]]:
        """(api version, resource) of the report kinds the API server serves, at the very
        version written (a group's preferred version may be another)."""
        found = set()
        for api_version in {kind.api_version for kind in self._options.kinds}:
            try:
                listed = self._client.get(f"/apis/{api_version}").get("resources") or ()
            except ApiError as exc:
                if exc.status != 404:
                    raise
                continue
            found |= {(api_version, str(r.get("name"))) for r in listed if isinstance(r, Mapping)}
        return found

    def _watch_reports(self) -> None:
        """Watch the stored reports of every kind written, once its CRD is served; say once,
        with the CRD to install, when it is not."""
        served = self._reports_served
        for kind in self._options.kinds:
            for resource in (kind.resource, kind.cluster_resource):
                where = (kind.api_version, resource)
                name = f"{resource}.{kind.api_version.partition('/')[0]}"
                if where not in served:
                    gone = self._stored.pop(where, None)
                    if gone is not None:  # its CRD deleted: nothing to watch any more
                        gone.stop()
                    if name not in self._missing:
                        self._missing.add(name)
                        log.error(
                            "%s is not served: no %s is written until the "
                            "CustomResourceDefinition %s is installed (%s)",
                            f"{kind.api_version}/{resource}", resource, name, kind.crds,
                        )  # fmt: skip
                    continue
                if name in self._missing:
                    self._missing.discard(name)
                    log.info("%s is served now: writing its reports", name)
                    self._mark(ALL)
                if where not in self._stored:
                    informer = StoredReports(kind, resource, self._client, self._tuning,
                                             self._stored_changed)  # fmt: skip
                    self._stored[where] = informer
                    informer.start()

    def _stored_version(self, key: Key) -> str | None:
        """The version of the report as the watch last saw it stored; None when absent."""
        api, _, resource = key[0].rpartition("/")
        informer = self._stored.get((api, resource))
        return None if informer is None else informer.version(key[1], key[2])

    def _writable(self, key: Key) -> bool:
        """Whether the report's kind is served and its stored copies are known (when served but
        not listed yet, the pass is made again)."""
        api, _, resource = key[0].rpartition("/")
        informer = self._stored.get((api, resource))
        if informer is not None and not informer.synced:
            self._dirty.set()
        return informer is not None and informer.synced

    def _watch_restricted(self) -> None:
        """Start a metadata informer for every served resource some role restricts now."""
        snapshot = self.source.snapshot()
        if snapshot is None:
            return
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

    def _watch_pods(self) -> None:
        """Watch the bound pods while some role carries a placement; drop them once none does
        (no pod can be misplaced then)."""
        snapshot = self.source.snapshot()
        if snapshot is None:
            return
        placing = places_pods(snapshot)
        if placing and self._pods is None:
            self._pods = BoundPods(self._client, self._tuning, self._pod_changed)
            self._pods.start()
            log.info("auditing where pods run (list/watch of the pods bound to a node)")
            self._mark(ALL)
        elif not placing and self._pods is not None:
            self._pods.stop()
            self._pods = None
            self._mark(ALL)

    def _unreadable(self) -> dict[Resource, str] | None:
        """The resources that cannot be listed (and why); None while an informer is still
        making its first list."""
        found = {}
        watched: list[tuple[Resource, Informer]] = list(self._informers.items())
        if self._pods is not None:
            watched.append((PODS, self._pods))
        for resource, informer in watched:
            if not informer.synced:
                if not informer.last_error:
                    return None
                # Forbidden or failing: said in the cluster report, never silently skipped.
                found[resource] = informer.last_error
        return found

    def _bound_pods(self, namespaces: frozenset[str] | None) -> list[BoundPod]:
        """The pods bound to a node (in ``namespaces`` when given), but those of excluded
        namespaces; none unless some role carries a placement."""
        pods = self._pods
        if pods is None or not pods.synced:
            return []
        return [pod for pod in pods.pods(namespaces) if pod.namespace not in self._options.excluded]

    def _objects(self, namespaces: frozenset[str] | None) -> list[Existing]:
        """The watched objects (in ``namespaces`` when given), from the caches, but those of
        excluded namespaces."""
        excluded = self._options.excluded
        return [
            Existing(resource, kept.namespace, name, kept.labels, kept.uid)
            for resource, informer in self._informers.items()
            if informer.synced
            for name, kept in informer.objects(namespaces)
            if kept.namespace not in excluded
        ]

    def _role_uids(self, snapshot: object) -> dict[RoleRef, str]:
        """Each role's uid, from the RBAC informers (keyed by uid); read again when the
        snapshot is a new one (RBAC changed)."""
        if self._uids[0] is not snapshot:
            uids = {
                value.ref: uid
                for informer in self.source.informers
                if informer.kind in ("Role", "ClusterRole")
                for uid, value in informer.items()
                if isinstance(getattr(value, "ref", None), RoleRef)
            }
            self._uids = (snapshot, uids)
        return self._uids[1]

    def _first_seen(self, key: str) -> int:
        """A result's timestamp: as last rendered, else as the stored reports said when this
        replica took over, else now. Nothing else is kept: what is remembered is bounded by the
        results held."""
        return self._previous.get(key) or self._carried.get(key) or int(time.time())

    def _rendered_sightings(self, namespaces: Iterable[str]) -> dict[str, int]:
        """The timestamps of the results last rendered for ``namespaces``."""
        return {
            seen_key(r["result"], r["rule"], r["resources"][0]): r["timestamp"]["seconds"]
            for namespace in namespaces
            for body, _ in self._rendered.get(namespace, {}).values()
            for r in body["results"]
        }

    def render(self) -> Due | None:
        """Judge the namespaces marked since the last pass; every report due."""
        unreadable = self._unreadable()
        with self._lock:
            snapshot = self._latest if self._latest is not None else self.source.snapshot()
            if snapshot is None or unreadable is None:
                return None
            pending, self._pending = self._pending, set()
        everything = bool(pending & ALL)
        namespaces = None if everything else frozenset(pending)
        again = list(self._rendered) if everything else [*pending, ""]
        self._previous = self._rendered_sightings(again)
        objects = self._objects(namespaces)
        report = audit(snapshot, objects, self._settings.allow_unlabeled, with_buckets=False,
                       cache=self._cache, pods=self._bound_pods(namespaces))  # fmt: skip
        most = self._options.max_passes
        uids = self._role_uids(snapshot)
        fresh = findings(snapshot, report, self._first_seen, most, lambda ref: uids.get(ref, ""))
        count_passes(objects, report, fresh, self._first_seen, most)
        for namespace in self._options.excluded:
            fresh.pop(namespace, None)
        if everything:
            self._scopes, self._rendered = fresh, {}
        for namespace in fresh if namespaces is None else namespaces:
            if namespace in fresh:
                self._scopes[namespace] = fresh[namespace]
            else:
                self._scopes.pop(namespace, None)
            self._rendered.pop(namespace, None)
        # The cluster scope says which resources cannot be listed: rendered on every pass.
        kept = self._scopes.get("", Scope())
        cluster = Scope(list(kept.results), kept.passed, kept.passes, kept.max_passes)
        cluster.results += [unaudited(r, why, self._first_seen) for r, why in unreadable.items()]
        self._rendered[""] = self._render("", cluster)
        for namespace, scope in self._scopes.items():
            if namespace not in self._rendered:
                self._rendered[namespace] = self._render(namespace, scope)
        self._previous = {}
        if everything:
            self._carried = {}  # every scope is dated now: the stored dates served their turn
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
            found_reports = reports(namespace, scope, kind, self._options.max_results,
                                    self._options.max_bytes)  # fmt: skip
            for body in found_reports:
                digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).digest()
                key = (f"{kind.api_version}/{resource}", namespace, body["metadata"]["name"])
                found[key] = (body, digest)
        return found

    def step(self) -> None:
        leading = self._lease.keep(self._lease.duration / 3)
        if leading and not self.leading:
            log.info("leading: writing every report")
            self._discover(force=True)
            self._written, self._versions = {}, {}
            self._carried = self._first_sightings()
            self._mark(ALL)
        self.leading = leading
        if not leading:
            return
        self._discover()
        self._watch_reports()
        known = len(self._informers)
        self._watch_pods()
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

    def _discover(self, force: bool = False) -> None:
        """What the API server serves, again once ``DISCOVERY_INTERVAL`` has passed."""
        if force or time.monotonic() - self._discovered_at >= DISCOVERY_INTERVAL:
            self._served = discover(self._client)
            self._reports_served = self._serving()
            self._discovered_at = time.monotonic()

    def _path(self, key: tuple[str, str, str]) -> str:
        api_resource, namespace, name = key
        group_version, _, resource = api_resource.rpartition("/")
        group, _, version = group_version.partition("/")
        return f"{object_path(group, version, resource, namespace)}/{name}"

    def _write(self, due: Due) -> None:
        for key, (body, digest) in due.items():
            if not self._writable(key):
                continue  # unserved (said once) or its stored reports not listed yet
            # Unchanged only if stored as our last write left it: a report someone else wrote,
            # deleted or unlabeled since is written again. (Our own write's echo may not have
            # come yet: then it is written once more, unchanged, which makes no new version.)
            version = self._versions.get(key)
            if self._written.get(key) == digest and self._stored_version(key) == version:
                WRITES.labels("unchanged").inc()
                continue
            if not self._lease.current():
                self._dirty.set()  # the lease renewed, the pass goes on where it stopped
                return
            self._limit.wait()
            try:
                stored = self._client.send("PATCH", self._path(key), body, _APPLY_QUERY, APPLY)
            except KubeError as exc:
                WRITES.labels("failed").inc()
                log.warning("could not write %s: %s", self._path(key), exc)
                if isinstance(exc, ApiError) and exc.status in UNWRITABLE:
                    self._delete(key)  # never leave a stale (or forged) report in its place
                self._rendered.pop(key[1], None)  # rendered (and tried) again next pass
                self._dirty.set()
                continue
            with self._lock:
                self._written[key] = digest
                self._versions[key] = _text(stored.get("metadata"), "resourceVersion")
            WRITES.labels("written").inc()
        stored_keys = {s.key for i in self._stored.values() for s in i.values()}
        for key in sorted((stored_keys | self._written.keys()) - due.keys()):
            if not self._lease.current():
                self._dirty.set()
                return
            if self._delete(key):
                self._written.pop(key, None)
                self._versions.pop(key, None)

    def _delete(self, key: Key) -> bool:
        """Delete a report; whether it is gone."""
        self._limit.wait()
        try:
            self._client.send("DELETE", self._path(key), {})
        except ApiError as exc:
            if exc.status != 404:
                WRITES.labels("failed").inc()
                return False
        except KubeError:
            WRITES.labels("failed").inc()
            return False
        WRITES.labels("deleted").inc()
        return True

    def _first_sightings(self) -> dict[str, int]:
        """When each finding of the stored reports was first seen, as their results say: a new
        leader keeps the dates. Read from the reporter's own reports only, at most ``MAX_CARRIED``
        findings, and never later than now (a date a tenant forged can make a finding look old,
        never hide it)."""
        found: dict[str, int] = {}
        now = int(time.time())
        own = {(kind.api_version, r) for kind in self._options.kinds
               for r in (kind.resource, kind.cluster_resource)} & self._reports_served  # fmt: skip
        for api_version, resource in sorted(own):
            group, _, version = api_version.partition("/")
            path = object_path(group, version, resource)

            def read(item: Mapping[str, Any]) -> None:
                results = item.get("results")
                for result in results if isinstance(results, list) else ():
                    if len(found) >= MAX_CARRIED:
                        return
                    if not isinstance(result, Mapping):
                        continue  # the schema makes it one; anything else is skipped
                    refs = result.get("resources")
                    stamp = result.get("timestamp")
                    seconds = stamp.get("seconds") if isinstance(stamp, Mapping) else None
                    if (isinstance(seconds, int) and isinstance(refs, list) and refs
                            and isinstance(refs[0], Mapping)):  # fmt: skip
                        key = seen_key(str(result.get("result")), str(result.get("rule")),
                                       refs[0])  # fmt: skip
                        found[key] = max(0, min(seconds, now))

            try:
                self._client.list_each(path, STORED_PAGE, (5.0, 60.0), read,
                                       selector=(("labelSelector", MANAGED),))  # fmt: skip
            except KubeError as exc:
                log.info("could not read the stored %s: %s (findings dated anew)", resource, exc)
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
