"""The live-cluster RBAC source: six informers, an atomically swapped snapshot, parent lookups.

Each worker process runs one ``ClusterSource``: an informer per kind (Role, ClusterRole,
RoleBinding, ClusterRoleBinding, Namespace, Node) keeps compiled objects current and reports each
change (old and new compiled object) to a builder thread. The builder waits a few milliseconds
(to fold bursts together), applies the changes to the current snapshot incrementally
(``app.engine.incremental``: a change costs what the changed object touches, not the size of the
cluster) and swaps in the new immutable ``Snapshot`` with a single attribute assignment, so a
decision never waits for a lock and never sees half an update. The request path calls the API
server for one thing only: a GET of the parent object of a CONNECT/subresource request, with a
short timeout and a tiny cache.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Mapping
from contextlib import nullcontext
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from app.engine.context import ObjectRef, ParentUnavailable, Registration
from app.engine.incremental import Change, LiveSnapshot
from app.engine.kinds import (
    GRAPH_KINDS,
    KINDS,
    PERSISTENT_VOLUME,
    POD,
    VOLUME_ATTACHMENT,
    WEBHOOK_CONFIGURATION,
)
from app.engine.model import Request, Resource
from app.engine.nodegraph import NodeGraph
from app.engine.rbac import Compiler, Snapshot
from app.source.api import ApiError, KubeClient, KubeError, object_path
from app.source.base import SourceStatus, bulk_load
from app.source.informer import (
    Informer,
    InformerObserver,
    NullObserver,
    Tuning,
    Update,
)
from app.source.metadata import WATCHED_RESOURCES, MetadataCache

if TYPE_CHECKING:
    from app.settings import Settings

log = logging.getLogger("label_rbac.source")

# The parents this webhook may read, with the API version to read them at. The ClusterRole in
# manifests/deploy/rbac.yaml grants ``get`` on exactly these and on the resources whose metadata
# the workload rules read (``app.engine.workloads.METADATA_RESOURCES``); keep them in step.
PARENT_RESOURCES: Mapping[tuple[str, str], str] = {
    ("", "pods"): "v1",  # exec, attach, portforward, eviction, ...
    ("apps", "deployments"): "v1",  # scale
    ("apps", "replicasets"): "v1",  # scale
    ("apps", "statefulsets"): "v1",  # scale
    ("", "replicationcontrollers"): "v1",  # scale
}
# Parents whose labels are all a rule reads (a token request is judged by its ServiceAccount's):
# read as metadata, from the metadata-only watch when it knows the object (``fetch_metadata``).
METADATA_PARENTS: Mapping[tuple[str, str], str] = {
    ("", "serviceaccounts"): "v1",  # token
}

# A freshly forked worker waits this long for its first sync before it accepts requests, so a
# respawned worker does not answer "not synced" while its siblings could have answered.
# (gunicorn's worker timeout is 30 s; this must stay well below it.)
WORKER_START_WAIT = 10.0
# A batch this large (the first lists, a re-list) is applied with the garbage collector paused
# (``bulk_load``); a few changes at a time allocate too little for it to matter.
BULK_CHANGES = 1000


class SourceObserver(InformerObserver, Protocol):
    """Everything the cluster source reports (the metrics implement this)."""

    def synced(self, synced: bool) -> None: ...

    def parent_lookup(self, resource: str, result: str) -> None: ...


class NullSourceObserver(NullObserver):
    def synced(self, synced: bool) -> None:
        pass

    def parent_lookup(self, resource: str, result: str) -> None:
        pass


# What the parent cache may hold, in characters of the objects' JSON: a tenant chooses which
# objects are looked up (their names are in the requests) and how big they are (a pod may take
# 1.5 MiB in etcd), and the entries stay for ``parent_ttl`` whoever sends the next review. Real
# parents (pods, workloads) are a few KiB; an object over an eighth of this is not cached.
PARENT_CACHE_CHARS = 8 * 1024 * 1024


class TtlCache:
    """A small, thread-safe cache whose entries expire ``ttl`` seconds after they were stored,
    bounded in entries and in the weight (a size) of what it holds, oldest out first."""

    def __init__(
        self, ttl: float, max_entries: int = 256, max_weight: int = PARENT_CACHE_CHARS
    ) -> None:
        self._ttl = ttl
        self._max = max_entries
        self._max_weight = max_weight
        self._weight = 0
        self._entries: OrderedDict[Hashable, tuple[float, Any, int]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def weight(self) -> int:
        return self._weight

    def get(self, key: Hashable) -> Any | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            if entry[0] <= time.monotonic():
                self._remove(key)
                return None
            return entry[1]

    def put(self, key: Hashable, value: Any, weight: int = 0) -> None:
        if self._ttl <= 0 or weight > self._max_weight // 8:
            return
        with self._lock:
            if key in self._entries:
                self._remove(key)
            self._entries[key] = (time.monotonic() + self._ttl, value, weight)
            self._weight += weight
            while len(self._entries) > self._max or self._weight > self._max_weight:
                self._remove(next(iter(self._entries)))

    def _remove(self, key: Hashable) -> None:
        _, _, weight = self._entries.pop(key)
        self._weight -= weight


class ClusterSource:
    """An ``RbacSource`` fed by list/watch from the API server (see the module docstring)."""

    def __init__(
        self,
        client: KubeClient,
        compiler: Compiler,
        *,
        tuning: Tuning | None = None,
        observer: SourceObserver | None = None,
        max_staleness: float | None = None,
        parent_resources: Mapping[tuple[str, str], str] = PARENT_RESOURCES,
        watched_labels: frozenset[tuple[str, str]] = WATCHED_RESOURCES,
        node_graph: NodeGraph | None = None,
        on_applied: Callable[[LiveSnapshot, list[Change]], None] | None = None,
        webhook_configuration: str | None = None,
    ) -> None:
        self._client = client
        # Told every batch of changes once applied (the compiler re-renders what they touch).
        self._on_applied = on_applied
        self._tuning = tuning or Tuning()
        self._observer: SourceObserver = observer or NullSourceObserver()
        self._max_staleness = max_staleness
        self._parent_versions = dict(parent_resources)
        self._parents = TtlCache(self._tuning.parent_ttl)
        # Labels of objects read by name (label-scoped gets), from metadata-only watches.
        self.metadata = MetadataCache(client, self._tuning, self._observer, watched_labels)
        self.informers: tuple[Informer, ...] = tuple(
            Informer(
                spec,
                client,
                partial(spec.compile, compiler),
                self._changed,
                self._tuning,
                self._observer,
                on_update=partial(self._updated, spec.kind),
            )
            for spec in KINDS
        )
        self._graph = node_graph
        if node_graph is not None:
            updates: dict[str, Update] = {
                POD.kind: node_graph.update_pod,
                PERSISTENT_VOLUME.kind: node_graph.update_volume,
                VOLUME_ATTACHMENT.kind: node_graph.update_attachment,
            }
            # Pods, PVs and VolumeAttachments feed the node graph one change at a time; they do
            # not rebuild the snapshot (pods churn), except to become ready once listed.
            self.informers += tuple(
                Informer(
                    spec,
                    client,
                    partial(spec.compile, compiler),
                    self._graph_listed,
                    self._tuning,
                    self._observer,
                    on_update=updates[spec.kind],
                )
                for spec in GRAPH_KINDS
            )
        # The webhook's own registration, watched by name (read-only): what it leaves unjudged.
        # Listed before the first snapshot like every kind, so a decision never runs without it.
        self._unjudged: frozenset[str] | None = None
        if webhook_configuration is not None:
            self.informers += (
                Informer(
                    WEBHOOK_CONFIGURATION,
                    client,
                    partial(WEBHOOK_CONFIGURATION.compile, compiler),
                    self._changed,
                    self._tuning,
                    self._observer,
                    on_update=self._registration_updated,
                    field_selector=f"metadata.name={webhook_configuration}",
                ),
            )
            self._unjudged = frozenset()
        self._snapshot: Snapshot | None = None
        # Changes reported by the informers, in order, until the builder applies them.
        self._changes: deque[Change] = deque()
        self._live = LiveSnapshot.empty()
        self._dirty = threading.Event()
        self._stop = threading.Event()
        self._synced = threading.Event()
        self._threads: list[threading.Thread] = []
        self._start_lock = threading.Lock()

    @classmethod
    def from_settings(
        cls, settings: Settings, observer: SourceObserver | None = None
    ) -> ClusterSource:
        """Connect with the settings' kubeconfig or in-cluster credentials (nothing starts yet)."""
        client = KubeClient.connect(settings.kubeconfig, settings.in_cluster)
        return cls(
            client,
            settings.compiler,
            tuning=Tuning(start_wait=WORKER_START_WAIT),
            observer=observer,
            max_staleness=settings.max_staleness,
            node_graph=NodeGraph() if settings.node_authorizer else None,
            watched_labels=WATCHED_RESOURCES | settings.watched_labels,
            webhook_configuration=settings.webhook_configuration,
        )

    # RbacSource

    def start(self) -> None:
        """Start the informers and the builder; wait up to ``tuning.start_wait`` for a sync."""
        with self._start_lock:
            if self._threads:
                return
            self._observer.synced(False)
            log.info("watching RBAC at %s", self._client.host)
            self._spawn(self._build_loop, "snapshot-builder")
            if self._tuning.resync_interval > 0:
                self._spawn(self._resync_loop, "resync")
            for informer in self.informers:
                informer.start()
        wait = self._tuning.start_wait
        if wait > 0 and not self.wait_synced(wait):
            log.warning("not synced after %.0fs; answering 503 until synced", wait)

    def stop(self) -> None:
        self._stop.set()
        self._dirty.set()
        for informer in self.informers:
            informer.stop()
        for informer in self.informers:
            informer.join(5.0)
        self.metadata.stop()
        for thread in self._threads:
            thread.join(5.0)
        self._client.close()

    def snapshot(self) -> Snapshot | None:
        return self._snapshot

    def node_graph(self) -> NodeGraph | None:
        return self._graph

    def registration(self) -> Registration | None:
        unjudged = self._unjudged
        if unjudged is None:
            return None
        # Every binding's role, existing or not: a role created after its binding is bound.
        return Registration(unjudged, self._live.referrers)

    def status(self) -> SourceStatus:
        pending = [i for i in self.informers if not i.synced]
        if pending or self._snapshot is None:
            if not pending:
                return SourceStatus(False, "building the first snapshot")
            detail = "waiting for the initial list of " + ", ".join(
                i.spec.resource for i in pending
            )
            errors = sorted({i.last_error for i in pending if i.last_error})
            return SourceStatus(False, f"{detail} ({'; '.join(errors)})" if errors else detail)
        stale = self.stale_seconds()
        if stale is None:
            counts = ", ".join(f"{len(i)} {i.spec.resource}" for i in self.informers)
            return SourceStatus(True, f"synced: {counts}")
        lost = [i for i in self.informers if not i.connected]
        errors = sorted({i.last_error for i in lost if i.last_error})
        detail = (
            f"lost the watch of {', '.join(i.spec.resource for i in lost)}"
            f"{' (' + '; '.join(errors) + ')' if errors else ''}; "
            f"serving the state of {stale:.0f}s ago"
        )
        if self._max_staleness is not None and stale > self._max_staleness:
            # Not ready: a Service sends the API server to replicas that are still current.
            return SourceStatus(
                False, f"{detail}, beyond --max-staleness {self._max_staleness:g}s", stale
            )
        return SourceStatus(True, detail, stale)

    def fetch_parent(self, request: Request) -> Mapping[str, Any]:
        """GET the parent object of the request (cached for ``tuning.parent_ttl`` seconds)."""
        res = request.resource
        by_labels = METADATA_PARENTS.get((res.group, res.resource))
        if by_labels is not None:
            ref = ObjectRef(res.group, by_labels, res.resource, request.namespace, request.name)
            return self.fetch_metadata(ref)
        version = self._parent_versions.get((res.group, res.resource))
        ref = ObjectRef(res.group, version or "", res.resource, request.namespace, request.name)
        if version is None:
            self._observer.parent_lookup(_metric_name(ref), "unsupported")
            raise ParentUnavailable(
                f"could not read {ref}: label-rbac is not set up to look up "
                f"{Resource(res.group, res.resource)}"
            )
        return self._get(ref, metadata_only=False)

    def fetch_metadata(self, ref: ObjectRef) -> Mapping[str, Any]:
        """An object's metadata: from the metadata-only watch of its resource when that knows
        the object, else a GET of ``PartialObjectMetadata`` (cached like parents).

        Only ``metadata`` is kept, even if the server answered with the whole object.
        """
        watched = self.metadata.lookup(ref)
        if watched is not None:
            self._observer.parent_lookup(_metric_name(ref), "watched")
            return watched
        return self._get(ref, metadata_only=True)

    def _get(self, ref: ObjectRef, *, metadata_only: bool) -> Mapping[str, Any]:
        name = _metric_name(ref)
        if not ref.name:
            raise ParentUnavailable(f"could not read {name}: the request names no object")
        key = (ref, metadata_only)
        found = self._parents.get(key)
        if found is not None:
            self._observer.parent_lookup(name, "cached")
            return found
        path = object_path(ref.group, ref.version, ref.resource, ref.namespace, ref.name)
        timeout = self._tuning.parent_timeout
        try:
            obj = self._client.get(path, timeout=timeout, metadata_only=metadata_only)
        except ApiError as exc:
            self._observer.parent_lookup(name, str(exc.status))
            reason = f" {exc.reason}" if exc.reason else ""
            raise ParentUnavailable(f"could not read {ref}: HTTP {exc.status}{reason}") from None
        except KubeError as exc:
            self._observer.parent_lookup(name, "unreachable")
            raise ParentUnavailable(f"could not read {ref}: {exc} (limit {timeout:g}s)") from None
        if metadata_only:
            metadata = obj.get("metadata")
            obj = {"metadata": metadata if isinstance(metadata, Mapping) else {}}
        self._parents.put(key, obj, len(json.dumps(obj, separators=(",", ":"), default=str)))
        self._observer.parent_lookup(name, "ok")
        return obj

    # Beyond the protocol.

    def wait_synced(self, timeout: float | None = None) -> bool:
        """Block until the first snapshot exists (True) or ``timeout`` passes (False)."""
        return self._synced.wait(timeout)

    def stale_seconds(self) -> float | None:
        """Seconds since the stalest disconnected informer last heard from the API server."""
        now = time.monotonic()
        ages = [
            now - i.last_contact
            for i in self.informers
            if not i.connected and i.last_contact is not None
        ]
        return max(ages) if ages else None

    def _spawn(self, target: Any, name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _changed(self) -> None:
        self._dirty.set()

    def _updated(self, kind: str, old: object, new: object) -> None:
        # On the informer thread; deque appends are atomic, and the builder pops from the left.
        self._changes.append((kind, old, new))

    def _registration_updated(self, old: object, new: object) -> None:
        # One object (selected by name): absent means nothing is left out.
        self._unjudged = new if isinstance(new, frozenset) else frozenset()

    def _graph_listed(self) -> None:
        if not self._synced.is_set():
            self._dirty.set()

    def _build_loop(self) -> None:
        while True:
            self._dirty.wait()
            if self._stop.is_set():
                return
            # A burst (a re-list, ``kubectl apply`` of a directory) becomes one snapshot.
            self._stop.wait(self._tuning.coalesce)
            self._dirty.clear()
            if not all(i.synced for i in self.informers):
                continue
            try:
                snapshot = self._build()
            except Exception:
                log.exception("could not build a snapshot; keeping the previous one")
                continue
            # One reference assignment: a decision sees the old snapshot or the new, never a mix.
            self._snapshot = snapshot
            if not self._synced.is_set():
                self._synced.set()
                self._observer.synced(True)
                log.info("synced: %s", self.status().detail.removeprefix("synced: "))

    def _build(self) -> Snapshot:
        """Apply the changes reported since the last snapshot (all of them at the first)."""
        changes: list[Change] = []
        while self._changes:
            changes.append(self._changes.popleft())
        try:
            with bulk_load() if len(changes) > BULK_CHANGES else nullcontext():
                self._live = self._live.apply(changes)
        except Exception:
            # A safety net that should never be needed: index everything again (should counting
            # the changes itself fail, the builder keeps the previous snapshot and says so).
            log.exception("could not apply %d changes incrementally; indexing all", len(changes))
            self._live = self._live.apply(changes, whole=True)
        if self._on_applied is not None:
            self._on_applied(self._live, changes)
        return self._live.snapshot

    def _resync_loop(self) -> None:
        """Re-list one kind at a time, so that each is re-listed once per interval."""
        step = self._tuning.resync_interval / len(self.informers)
        turn = 0
        while not self._stop.wait(step):
            informer = self.informers[turn % len(self.informers)]
            turn += 1
            # A disconnected informer re-lists when needed anyway; skip its turn.
            if informer.synced and informer.connected:
                informer.request_resync()


def _metric_name(ref: ObjectRef) -> str:
    """The resource as the lookup metric labels it (``pods``, ``deployments.apps``)."""
    return str(Resource(ref.group, ref.resource))
