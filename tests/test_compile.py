"""The compiler's writer and lease, against a recording client: what is written, when, by whom.

(tests/kube/test_compile.py runs two compilers against a real kube-apiserver.)
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from app.compile import FIELD_MANAGER, MERGE, LeaderLease, ParamsWriter
from app.coverage import CoverageWriter
from app.engine.context import Options
from app.engine.incremental import LiveSnapshot
from app.engine.kinds import BY_KIND
from app.engine.model import Resource
from app.engine.params import MARK, NAME
from app.engine.policy import DEFAULT_ANNOTATION_KEY
from app.engine.rbac import Compiler, Snapshot
from app.source.api import ApiError
from tests.support import binding, role, rule

COMPILER = Compiler((DEFAULT_ANNOTATION_KEY,))
LEASE = "/apis/coordination.k8s.io/v1/namespaces/label-rbac/leases/lead"


class Client:
    """Answers GETs of the lease from ``lease`` and records every write."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.writes: list[tuple[str, str, Mapping[str, Any], list[tuple[str, str]]]] = []
        self.types: list[str] = []
        self.missing: set[str] = set()  # paths answered 404
        self.meet: threading.Barrier | None = None  # parameter writes wait for each other
        self._lock = threading.Lock()  # the writer writes namespaces from several threads

    def get(self, path: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
        if path == LEASE:
            if self.lease is None:
                raise ApiError(404, "NotFound")
            return self.lease
        raise AssertionError(path)

    def send(
        self, method: str, path: str, body: Mapping[str, Any], query: Any = (), *a: Any
    ) -> Any:
        with self._lock:
            self.writes.append((method, path, body, list(query)))
            self.types.append(a[0] if a else "")
        if self.meet is not None and path.endswith(f"/labelrbacparams/{NAME}"):
            self.meet.wait()
        if path in self.missing:
            raise ApiError(404, "NotFound")
        if "leases" in path:
            self.lease = {**body, "metadata": {**body["metadata"], "resourceVersion": "1"}}
        return body

    def params_written(self) -> list[str]:
        return [p.split("/")[5] for m, p, _, _ in self.writes if "labelrbacparams" in p and
                not p.endswith("/status")]  # fmt: skip


def live(*objects: tuple[str, dict[str, Any]]) -> LiveSnapshot:
    by_kind: dict[str, list[Any]] = defaultdict(list)
    for kind, obj in objects:
        by_kind[kind].append(BY_KIND[kind].compile(COMPILER, obj))
    return LiveSnapshot.build(by_kind)


def namespace(name: str) -> tuple[str, dict[str, Any]]:
    return "Namespace", {"kind": "Namespace", "metadata": {"name": name}}


TEAM = role("team-a", "t1", [rule("*", "configmaps")], {"configmaps": {"team": ["a"]}})
OBJECTS = (TEAM, binding("a", "team-a", "User:alice", namespace="t1"), namespace("t1"),
           namespace("t2"))  # fmt: skip


def writer(client: Client, clock: list[float], max_bytes: int = 1_400_000) -> ParamsWriter:
    lease = LeaderLease(client, "label-rbac", "lead", "me", 15.0, clock=lambda: clock[0])  # type: ignore[arg-type]
    return ParamsWriter(
        client,  # type: ignore[arg-type]
        lease,
        Options(),
        max_bytes,
        discover=lambda _: [Resource("", "configmaps")],
    )


def story(client: Client, namespace: str) -> list[str]:
    """What was written for ``namespace``, in order: params, status, or the mark set/removed."""
    told = []
    for (method, path, body, _), kind in zip(client.writes, client.types, strict=True):
        if path == f"/api/v1/namespaces/{namespace}":
            assert (method, kind) == ("PATCH", MERGE)
            told.append(f"mark={body['metadata']['labels'][MARK]}")
        elif f"/namespaces/{namespace}/labelrbacparams" in path:
            told.append("status" if path.endswith("/status") else "params")
    return told


def test_the_leader_writes_every_namespace_then_only_what_a_change_touches() -> None:
    client, clock = Client(), [0.0]
    state = live(*OBJECTS)
    params = writer(client, clock)
    assert params.step(state.snapshot) == 2
    assert sorted(client.params_written()) == ["t1", "t2"]
    queries = {tuple(q) for _, p, _, q in client.writes if "labelrbacparams" in p}
    assert queries == {(("fieldManager", FIELD_MANAGER), ("force", "true"))}
    # Nothing changed: nothing written.
    client.writes.clear()
    assert params.step(state.snapshot) == 0
    # A binding in t1: t1 alone is rendered and written again.
    change = ("RoleBinding", None, BY_KIND["RoleBinding"].compile(
        COMPILER, binding("b", "team-a", "User:bob", namespace="t1")[1]))  # fmt: skip
    state = state.apply([change])
    params.applied(state, [change], "42")
    assert params.step(state.snapshot) == 1
    assert client.params_written() == ["t1"]
    status = next(b for _, p, b, _ in client.writes if p.endswith("/status"))
    assert status["status"]["observedResourceVersion"] == "42"


def test_a_replica_that_does_not_hold_the_lease_writes_nothing() -> None:
    client, clock = Client(), [0.0]
    client.lease = {
        "metadata": {"name": "lead", "resourceVersion": "7"},
        "spec": {"holderIdentity": "other", "leaseDurationSeconds": 15, "renewTime": "t"},
    }
    params = writer(client, clock)
    assert params.step(live(*OBJECTS).snapshot) == 0
    assert client.writes == []
    # The holder stops renewing: once the lease has run out on our clock, we take it.
    clock[0] = 16.0
    assert params.step(live(*OBJECTS).snapshot) == 2
    lease = next(b for m, p, b, _ in client.writes if p == LEASE)
    assert lease["spec"]["holderIdentity"] == "me"
    assert lease["metadata"]["resourceVersion"] == "7"  # an update of the version read


def test_namespaces_are_written_at_the_same_time() -> None:
    client, clock = Client(), [0.0]
    # Each namespace's write waits for the other's: one at a time, the barrier would break.
    client.meet = threading.Barrier(2, timeout=10)
    assert writer(client, clock).step(live(*OBJECTS).snapshot) == 2
    assert not client.meet.broken


def test_a_namespace_is_marked_after_its_parameters_and_unmarked_before_delegating() -> None:
    client, clock = Client(), [0.0]
    state = live(*OBJECTS)
    params = writer(client, clock)
    params.step(state.snapshot)
    # Marked once the policy can read what it needs; never marked again while unchanged.
    assert story(client, "t1") == ["params", "status", "mark=true"]
    client.writes.clear()
    client.types.clear()
    assert params.step(state.snapshot) == 0 and client.writes == []
    # Too large now: the mark goes first (the webhook judges again), then the delegation.
    small = writer(client, clock, max_bytes=200)
    small.step(state.snapshot)
    assert story(client, "t1") == ["mark=None", "params", "status"]


def test_a_namespace_that_does_not_exist_is_not_marked_and_is_tried_again() -> None:
    client, clock = Client(), [0.0]
    client.missing.add("/api/v1/namespaces/t2")
    params = writer(client, clock)
    state = live(*OBJECTS)
    assert params.step(state.snapshot) == 2
    client.writes.clear()
    client.types.clear()
    client.missing.clear()
    # Its Namespace appears: the same parameters, and now the mark.
    change = ("Namespace", None, ("t2", {}))
    params.applied(state, [change], "43")
    params.step(state.snapshot)
    assert story(client, "t2") == ["params", "status", "mark=true"]


def test_the_leader_keeps_the_registration_in_step_and_a_follower_does_not() -> None:
    """The writer hands the coverage the served resources discovery listed, while leading."""
    client, clock = Client(), [0.0]
    seen: list[tuple[Snapshot, tuple[Resource, ...]]] = []

    class Recording(CoverageWriter):
        def step(self, snapshot: Snapshot, served: Sequence[Resource]) -> bool:
            seen.append((snapshot, tuple(served)))
            return False

    coverage = Recording(client, FIELD_MANAGER)  # type: ignore[arg-type]
    lease = LeaderLease(client, "label-rbac", "lead", "me", 15.0, clock=lambda: clock[0])  # type: ignore[arg-type]
    served = [Resource("", "configmaps"), Resource("example.com", "widgets")]
    params = ParamsWriter(
        client,  # type: ignore[arg-type]
        lease,
        Options(),
        discover=lambda _: served,
        coverage=coverage,
    )
    state = live(*OBJECTS).snapshot
    params.step(state)
    assert seen == [(state, tuple(served))]
    client.lease = {
        "metadata": {"name": "lead", "resourceVersion": "8"},
        "spec": {"holderIdentity": "other", "leaseDurationSeconds": 15, "renewTime": "u"},
    }
    clock[0] = 6.0  # past a renewal period: the lease is read again, and is someone else's
    params.step(state)
    assert len(seen) == 1
