"""A leader lease: the ``coordination.k8s.io/v1`` Lease through which exactly one replica of a
controller writes. The compiler (``label-rbac compile``) and the reporter (``label-rbac report``)
each hold one of their own; the primitive sits here, below both, so that neither process imports
the other's code.

Acquired and renewed as client-go's leader election does, expiry judged on the local clock from
when the record was last seen to change, so clock skew between replicas does not matter.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from app.source.api import ApiError, KubeClient

LEASE_API = "/apis/coordination.k8s.io/v1"


def micro_time() -> str:
    """The current time as a Kubernetes ``MicroTime`` (RFC 3339, microseconds, UTC)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def identity() -> str:
    """A replica's identity when none is given: its host name and a start-time suffix."""
    return f"{socket.gethostname()}-{int(time.time() * 1000) % 10**9}"


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
        now = micro_time()
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
