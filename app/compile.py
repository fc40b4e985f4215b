"""``label-rbac compile``: keep every namespace's ``LabelRbacParams`` in step with RBAC.

The compiler watches RBAC through the webhook's own cluster source (``ClusterSource``: the same
informers and incremental snapshot) and renders parameters with ``app.engine.params``. Each batch
of changes the source applies marks the namespaces it touches (``params.touched``); the writer
renders only those and writes each with server-side apply under its own field manager, skipping
an object whose content did not change. A namespace too large to compile is written
``delegated`` and an Event says so. A compiled namespace is labeled ``labelrbac.io/compiled``
(``params.MARK``) once its parameters are written, and the label is taken off before they are
written delegated: with the label, the webhook leaves the namespace's plain writes to the policy.

Exactly one replica writes: the one holding the ``coordination.k8s.io`` Lease (``LeaderLease``,
acquired and renewed as client-go's leader election does, expiry judged on the local clock from
when the record was last seen to change, so clock skew between replicas does not matter). A
replica writes only while its lease is current; one that gains the lease renders every namespace
again, so nothing its predecessor had not written yet is lost.

The leader also keeps the webhook registration's ``skip-unjudged`` conditions in step with the
roles and the served resources (``app.coverage.CoverageWriter``).
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from app.coverage import CoverageWriter
from app.engine.context import Options
from app.engine.incremental import Change, LiveSnapshot
from app.engine.model import Resource
from app.engine.params import (
    ALL,
    API_VERSION,
    MARK,
    MAX_BYTES,
    NAME,
    PLURAL,
    Rendered,
    Target,
    namespaces_of,
    render,
    touched,
)
from app.engine.rbac import Snapshot
from app.settings import Settings
from app.source.api import ApiError, KubeClient, KubeError
from app.source.cluster import ClusterSource
from app.source.informer import Tuning

log = logging.getLogger("label_rbac.compile")

FIELD_MANAGER = "label-rbac-compiler"
APPLY = "application/apply-patch+yaml"
# The Namespace mark is merge-patched: unlike an apply, a merge patch never creates the object
# (a namespace known only from its RoleBindings, or deleted meanwhile, stays absent).
MERGE = "application/merge-patch+json"
LEASE_API = "/apis/coordination.k8s.io/v1"
# How often the served resources are listed again (a new CRD becomes compilable).
DISCOVERY_INTERVAL = 60.0
# Namespaces written at once. Each is two or three requests in a row, and the API server answers
# many at a time: one by one, a batch of changes touching a hundred namespaces waited for two
# hundred round trips, each behind the one before.
WRITERS = 8


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderLease:
    """A ``coordination.k8s.io/v1`` Lease held by one identity at a time.

    ``renew()`` takes the lease when it is free or expired, keeps it when held, and says whether
    this replica holds it now; ``current()`` says whether a write may still be made under it.
    """

    def __init__(
        self,
        client: KubeClient,
        namespace: str,
        name: str,
        identity: str,
        duration: float = 15.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._path = f"{LEASE_API}/namespaces/{namespace}/leases/{name}"
        self._collection = f"{LEASE_API}/namespaces/{namespace}/leases"
        self.namespace, self.name, self.identity = namespace, name, identity
        self.duration = duration
        self._clock = clock
        self._seen: tuple[str, float] | None = None  # (the record's version, when it changed)
        self._held_until = 0.0
        self._renewed_at = 0.0

    def current(self) -> bool:
        """Whether this replica holds the lease and it has not run out since the last renewal."""
        return self._clock() < self._held_until

    def keep(self, period: float) -> bool:
        """``renew()``, unless this replica renewed less than ``period`` seconds ago."""
        if self.current() and self._clock() - self._renewed_at < period:
            return True
        return self.renew()

    def renew(self) -> bool:
        started = self._clock()
        try:
            lease = self._client.get(self._path)
        except ApiError as exc:
            if exc.status != 404:
                raise
            return self._write("POST", self._collection, self._record(None), started)
        spec = lease.get("spec") or {}
        version = str((lease.get("metadata") or {}).get("resourceVersion", ""))
        holder = spec.get("holderIdentity") or ""
        record = f"{version}/{holder}/{spec.get('renewTime')}"
        if self._seen is None or self._seen[0] != record:
            self._seen = (record, started)
        duration = float(spec.get("leaseDurationSeconds") or self.duration)
        expired = started - self._seen[1] > duration
        if holder and holder != self.identity and not expired:
            self._held_until = 0.0
            return False
        return self._write("PUT", self._path, self._record(lease), started)

    def _record(self, lease: Mapping[str, Any] | None) -> dict[str, Any]:
        spec = dict((lease or {}).get("spec") or {})
        now = _now()
        if spec.get("holderIdentity") != self.identity:
            spec["acquireTime"] = now
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (lease is not None)
        spec.update(
            holderIdentity=self.identity,
            leaseDurationSeconds=max(1, round(self.duration)),
            renewTime=now,
        )
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if lease is not None:  # an update only succeeds against the version read
            meta["resourceVersion"] = lease["metadata"]["resourceVersion"]
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": spec,
        }

    def _write(self, method: str, path: str, body: Mapping[str, Any], started: float) -> bool:
        try:
            self._client.send(method, path, body)
        except ApiError as exc:
            if exc.status == 409:  # another replica wrote first
                self._held_until = 0.0
                return False
            raise
        # Counted from before the read: the other replicas' clocks started no earlier.
        self._held_until = started + self.duration
        self._renewed_at = started
        return True


def served_resources(client: KubeClient) -> list[Resource]:
    """Namespaced resources the API server serves and lets be created (discovery)."""
    found: list[Resource] = []
    versions = [("", "/api/v1")]
    for group in client.get("/apis").get("groups") or ():
        preferred = (group.get("preferredVersion") or {}).get("groupVersion")
        if preferred:
            versions.append((group.get("name", ""), f"/apis/{preferred}"))
    for group_name, path in versions:
        try:
            listing = client.get(path)
        except KubeError as exc:  # an aggregated API down: its resources wait for the next try
            log.warning("discovery of %s failed: %s", path, exc)
            continue
        for res in listing.get("resources") or ():
            name = res.get("name", "")
            if res.get("namespaced") and "/" not in name and "create" in (res.get("verbs") or ()):
                found.append(Resource(group_name, name))
    return found


@dataclass
class Written:
    """What was last written for a namespace (to skip writes that change nothing)."""

    spec: str
    delegated: bool
    marked: bool


class ParamsWriter:
    """Renders the namespaces that changes touched and writes them while the lease is held."""

    def __init__(
        self,
        client: KubeClient,
        lease: LeaderLease,
        options: Options,
        max_bytes: int = MAX_BYTES,
        discover: Callable[[KubeClient], Iterable[Resource]] = served_resources,
        coverage: CoverageWriter | None = None,
    ) -> None:
        self._client = client
        self._lease = lease
        self._options = options
        self._max_bytes = max_bytes
        self._discover = discover
        self._coverage = coverage
        self._target: Target | None = None
        # The namespaced resources discovery last listed (the coverage is computed over them).
        self.served: tuple[Resource, ...] = ()
        self._discovered_at = -DISCOVERY_INTERVAL
        self._pending: set[str] = set(ALL)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._written: dict[str, Written] = {}
        self._pool = ThreadPoolExecutor(WRITERS, thread_name_prefix="params-writer")
        self._version = ""
        self.leading = False

    def applied(self, live: LiveSnapshot, changes: list[Change], version: str) -> None:
        """Called by the cluster source's builder after each batch: mark what it touches."""
        found = touched(live, changes)
        with self._lock:
            self._pending |= found
            self._version = version or self._version
        self._wake.set()

    def step(self, snapshot: Snapshot | None) -> int:
        """One round: keep the lease, then write what is pending. The objects written."""
        leading = self._lease.keep(self._lease.duration / 3)
        if leading and not self.leading:
            log.info("leading (lease %s/%s): rendering every namespace", *self._lease_name())
            with self._lock:
                self._pending = set(ALL)
            self._written.clear()
            if self._coverage is not None:
                self._coverage.reset()
        elif self.leading and not leading:
            log.info("lost the lease; no longer writing")
        self.leading = leading
        if not leading or snapshot is None:
            return 0
        target = self._refresh_target()
        with self._lock:
            pending, self._pending = self._pending, set()
        names = namespaces_of(snapshot) if pending >= ALL else pending & namespaces_of(snapshot)
        rendered = (render(snapshot, namespace, target) for namespace in sorted(names))
        done = self._write_all([(r, text) for r in rendered if (text := self._due(r))])
        if done:
            log.info("wrote the parameters of %d namespaces", done)
        if self._coverage is not None and self._lease.current():
            try:
                self._coverage.step(snapshot, self.served)
            except KubeError as exc:
                log.warning("could not update %s: %s", self._coverage.name, exc)
        return done

    def _lease_name(self) -> tuple[str, str]:
        return self._lease.namespace, self._lease.name

    def _refresh_target(self) -> Target:
        now = time.monotonic()
        if self._target is None or now - self._discovered_at > DISCOVERY_INTERVAL:
            self.served = tuple(self._discover(self._client))
            target = Target.of(self.served, self._options, self._max_bytes)
            if self._target is not None and target != self._target:
                with self._lock:
                    self._pending = set(ALL)
            self._target, self._discovered_at = target, now
        return self._target

    def _due(self, rendered: Rendered) -> str:
        """The spec's text when ``rendered`` differs from what was last written (content or
        mark), else ""."""
        text = json.dumps(rendered.spec, sort_keys=True)
        previous = self._written.get(rendered.namespace)
        unchanged = (
            previous is not None
            and previous.spec == text
            and previous.marked != (rendered.delegated is not None)
        )
        return "" if unchanged else text

    def _write_all(self, due: Sequence[tuple[Rendered, str]]) -> int:
        """Write ``due`` (each with its spec's text), ``WRITERS`` namespaces at a time; the
        namespaces written. One that fails, or is left because the lease may have moved on,
        stays pending."""
        done = 0
        futures = {
            self._pool.submit(self._write, r, text, self._written.get(r.namespace)): r
            for r, text in due
        }
        for future in as_completed(futures):
            namespace = futures[future].namespace
            try:
                written = future.result()
            except KubeError as exc:
                log.warning("could not write the parameters of %s: %s", namespace, exc)
                written = None
            if written is None:
                with self._lock:
                    self._pending.add(namespace)
            else:
                self._written[namespace] = written
                done += 1
        return done

    def _write(self, rendered: Rendered, text: str, previous: Written | None) -> Written | None:
        """Write a namespace's parameters, and its mark after them (before them when it loses
        it), so that at every moment the webhook or the policy judges its writes. None, writing
        nothing, once the lease may have moved on."""
        if not self._lease.current():
            return None
        delegated = rendered.delegated is not None
        marked = previous is None or previous.marked
        if delegated and marked:
            marked = self._mark(rendered.namespace, False)
        path = f"/apis/{API_VERSION}/namespaces/{rendered.namespace}/{PLURAL}/{NAME}"
        query = [("fieldManager", FIELD_MANAGER), ("force", "true")]
        self._client.send("PATCH", path, rendered.manifest(), query, APPLY)
        self._client.send("PATCH", f"{path}/status", self._status(rendered), query, APPLY)
        if delegated and (previous is None or not previous.delegated):
            self._event(rendered)
        if not delegated and (previous is None or not previous.marked):
            marked = self._mark(rendered.namespace, True)
        return Written(text, delegated, marked)

    def _mark(self, namespace: str, compiled: bool) -> bool:
        """Label the Namespace compiled, or take the label off; whether it now carries it."""
        body = {"metadata": {"labels": {MARK: "true" if compiled else None}}}
        query = [("fieldManager", FIELD_MANAGER)]
        try:
            self._client.send("PATCH", f"/api/v1/namespaces/{namespace}", body, query, MERGE)
        except ApiError as exc:
            if exc.status != 404:
                raise
            return False  # no such Namespace: nothing to mark, nothing to unmark
        return compiled

    def _status(self, rendered: Rendered) -> dict[str, Any]:
        condition = {
            "type": "Compiled",
            "status": "False" if rendered.delegated else "True",
            "reason": "TooLarge" if rendered.delegated else "Compiled",
            "message": rendered.delegated or "the label rule of this namespace is compiled",
            "lastTransitionTime": _now().split(".")[0] + "Z",
        }
        return {
            **{k: v for k, v in rendered.manifest().items() if k != "spec"},
            "status": {
                "observedResourceVersion": self._version,
                "grants": rendered.grants,
                "bytes": rendered.size,
                "conditions": [condition],
            },
        }

    def _event(self, rendered: Rendered) -> None:
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{NAME}.", "namespace": rendered.namespace},
            "involvedObject": {
                "apiVersion": API_VERSION,
                "kind": "LabelRbacParams",
                "name": NAME,
                "namespace": rendered.namespace,
            },
            "reason": "TooLarge",
            "message": rendered.delegated,
            "type": "Warning",
            "source": {"component": FIELD_MANAGER},
            "firstTimestamp": _now().split(".")[0] + "Z",
            "lastTimestamp": _now().split(".")[0] + "Z",
            "count": 1,
        }
        try:
            self._client.send("POST", f"/api/v1/namespaces/{rendered.namespace}/events", event)
        except KubeError as exc:
            log.warning("could not record an Event in %s: %s", rendered.namespace, exc)

    def wait(self, seconds: float) -> None:
        self._wake.wait(seconds)
        self._wake.clear()


def _rbac_version(source: ClusterSource) -> str:
    """The newest resourceVersion the RBAC informers have seen (etcd revisions)."""
    versions = [int(i.resource_version) for i in source.informers if i.resource_version.isdigit()]
    return str(max(versions)) if versions else ""


def run(
    client: KubeClient,
    settings: Settings,
    lease: LeaderLease,
    stop: threading.Event,
    max_bytes: int = MAX_BYTES,
) -> None:
    """Watch, render and write until ``stop`` is set."""
    coverage = CoverageWriter(client, FIELD_MANAGER, settings.webhook_configuration)
    writer = ParamsWriter(client, lease, settings.engine_options, max_bytes, coverage=coverage)

    def applied(live: LiveSnapshot, changes: list[Change]) -> None:
        writer.applied(live, changes, _rbac_version(source))

    source = ClusterSource(
        client, settings.compiler, tuning=Tuning(start_wait=0), on_applied=applied
    )
    source.start()
    retry = max(0.2, lease.duration / 6)
    try:
        while not stop.is_set():
            try:
                writer.step(source.snapshot())
            except KubeError as exc:
                log.warning("compile round failed: %s", exc)
            writer.wait(retry)
    finally:
        source.stop()


def identity() -> str:
    return f"{socket.gethostname()}-{int(time.time() * 1000) % 10**9}"
