"""The compiler's writer and lease, against a recording client: what is written, when, by whom.

(tests/kube/test_compile.py runs two compilers against a real kube-apiserver.)
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import pytest

from app.compiled import compiler as compile_module
from app.compiled.admission_policy import (
    ACTIONS,
    EPOCH,
    EPOCH_MESSAGE,
    POLICY,
    PROBE_LABEL,
    PROBE_MESSAGE,
    SHIPPED,
    UNJUDGED,
    Install,
    policy,
    unjudged_of,
)
from app.compiled.compiler import (
    APPLY,
    BACKOFF_MAX,
    BATCH,
    DISCOVERY_INTERVAL,
    FIELD_MANAGER,
    KEEP_INDEXED,
    MERGE,
    NOT_SEEN,
    POLICIES,
    POLICY_LOADED,
    LeaderLease,
    ParamsWriter,
    PendingNamespaces,
    PolicyWriter,
    ServedResources,
    backoff,
)
from app.compiled.proof import SEEN_RETRIES
from app.compiled.registration import API as REGISTRATIONS
from app.compiled.registration import COMPILED_ENTRY, CONDITION, CoverageWriter, expression
from app.engine.context import Options
from app.engine.incremental import LiveSnapshot
from app.engine.kinds import BY_KIND
from app.engine.model import Resource
from app.engine.params import (
    ALL,
    LAYOUT,
    LAYOUT_ANNOTATION,
    MARK,
    MAX_WORK,
    NAME,
    SOFTENED_MARK,
    ClusterPart,
)
from app.engine.policy import DEFAULT_ANNOTATION_KEY
from app.engine.rbac import Compiler, Snapshot
from app.source.api import ApiError, Unreachable
from app.source.listing import discover
from tests.support import binding, role, rule

COMPILER = Compiler((DEFAULT_ANNOTATION_KEY,))
LEASE = "/apis/coordination.k8s.io/v1/namespaces/label-rbac/leases/lead"
# An earlier release's enforcing policy: no constant of the unjudged resources.
EARLIER_POLICY = [{"name": "clusterChunks", "expression": "dyn([])"}]
THIS_LAYOUT = {"annotations": {LAYOUT_ANNOTATION: LAYOUT}}


def found_policy(variables: list[dict[str, str]], layout: bool) -> dict[str, Any]:
    """A live enforcing policy as a new leader reads it: with this release's layout named on
    it, or an earlier release's."""
    return {"metadata": THIS_LAYOUT if layout else {}, "spec": {"variables": variables}}


class Client:
    """Answers GETs of the lease from ``lease`` and records every write."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.writes: list[tuple[str, str, Mapping[str, Any], list[tuple[str, str]]]] = []
        self.types: list[str] = []
        self.missing: set[str] = set()  # paths answered 404
        self.meet: threading.Barrier | None = None  # parameter writes wait for each other
        self.during: Callable[[str], None] | None = None  # called once a parameter write is sent
        self.listed: dict[str, list[dict[str, Any]]] = {}  # what the API server lists, by path
        self.hold: dict[str, threading.Event] = {}  # namespace → its parameter writes wait for it
        self.failing: dict[str, Exception] = {}  # namespace → what its parameter writes raise
        self.registration: dict[str, Any] | None = None  # the webhook configuration, if any
        self.policies: dict[str, dict[str, Any]] = {}  # policies found before any write, by path
        # namespace → how many updates of its parameters (writes after the first) are refused
        # as the API server refuses them while its informer does not hold them yet
        self.unseen: dict[str, int] = {}
        # The compiler's probes (dry runs: not in ``writes``), and how many are not refused yet
        # (the API server has not loaded the enforcing policy).
        self.probes: list[str] = []
        self.unloaded = 0
        # The epochs set on parameters (``app.compiled.proof``), the asks for one refused before
        # the informer holds it, and whether the policy checks epochs at all.
        self.epochs: dict[str, str] = {}
        self.epoch_lag = 0
        self.checks_epochs = True
        self.asked: list[str] = []
        self.policy_written = False
        self.policy = POLICY  # the enforcing policy's name (the install's)
        self.never_judged: set[str] = set()  # namespaces it does not judge: probes there pass
        self._created: set[str] = set()
        self._lock = threading.Lock()  # the writer writes namespaces from several threads

    def get(self, path: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
        if path == LEASE:
            if self.lease is None:
                raise ApiError(404, "NotFound")
            return self.lease
        if path.startswith(REGISTRATIONS) and self.registration is not None:
            return self.registration
        if path.startswith(REGISTRATIONS):
            raise ApiError(404, "NotFound")
        if path.startswith(POLICIES):  # as last written, else as found
            written = [body for _, p, body, _ in self.writes if p == path]
            if written:
                return dict(written[-1])
            if path in self.policies:
                return self.policies[path]
            raise ApiError(404, "NotFound")
        raise AssertionError(path)

    def send(
        self, method: str, path: str, body: Mapping[str, Any], query: Any = (), *a: Any
    ) -> Any:
        params = path.endswith(f"/labelrbacparams/{NAME}")
        if params and ("dryRun", "All") in list(query):
            return self._probe(path, body)
        with self._lock:
            self.writes.append((method, path, body, list(query)))
            self.types.append(a[0] if a else "")
        if self.meet is not None and params:
            self.meet.wait()
        if params and (held := self.hold.get(path.split("/")[5])):
            held.wait(10)
        if self.during is not None and params:
            during, self.during = self.during, None
            during(path.split("/")[5])
        if path in self.missing:
            raise ApiError(404, "NotFound")
        if params and (failure := self.failing.get(path.split("/")[5])):
            raise failure
        if params and path in self._created and self.unseen.get(path.split("/")[5], 0) > 0:
            self.unseen[path.split("/")[5]] -= 1
            raise ApiError(422, "Invalid", f"... denied request: {NOT_SEEN} for policy binding")
        if params:
            self._created.add(path)
        if params and EPOCH in (body.get("metadata") or {}).get("annotations", {}):
            self.epochs[path] = body["metadata"]["annotations"][EPOCH]
        if path == f"{POLICIES}/{self.policy}":
            self.policy_written = True
        if "leases" in path:
            self.lease = {**body, "metadata": {**body["metadata"], "resourceVersion": "1"}}
        return body

    def _probe(self, path: str, body: Mapping[str, Any]) -> Any:
        """The compiler's probe (a dry-run update): refused by the enforcing policy once it is
        written and loaded (after ``unloaded`` probes), where the parameters are. A dry run
        asking for an epoch is refused until the epoch was set and ``epoch_lag`` asks for it
        were refused (unless the policy does not check epochs)."""
        if EPOCH in body["metadata"]["labels"]:
            asked = body["metadata"]["labels"][EPOCH]
            with self._lock:
                self.asked.append(asked)
                lagging = self.epoch_lag > 0 and self.epochs.get(path) == asked
                self.epoch_lag -= lagging
            if self.checks_epochs and (lagging or self.epochs.get(path) != asked):
                raise ApiError(422, "Invalid", f"... denied request: {EPOCH_MESSAGE}")
            if self.epochs.get(path) == asked:  # seen (a proof's, not its check of the policy)
                with self._lock:
                    self.writes.append(("ASK", path, body, []))
                    self.types.append("")
            return body
        assert body["metadata"]["labels"] == {PROBE_LABEL: "true"}
        with self._lock:
            self.probes.append(path.split("/")[5])
            if self.unloaded > 0:
                self.unloaded -= 1
                return body
        judged = path.split("/")[5] not in self.never_judged
        if self.policy_written and path in self._created and judged:
            raise ApiError(422, "Invalid", f"... denied request: {PROBE_MESSAGE}")
        return body

    def list_each(
        self, path: str, page: int, timeout: Any, each: Callable[[Any], Any], **kw: Any
    ) -> tuple[list[Any], str]:
        return [each(item) for item in self.listed.get(path, [])], "1"

    def params_written(self) -> list[str]:
        """The namespaces whose parameters were written, once per write: parameters just
        created are sent twice, the same body, the second time before the mark (``story``)."""
        found, last = [], {}
        for _, path, body, _ in self.writes:
            if "labelrbacparams" in path:
                namespace = path.split("/")[5]
                if last.get(namespace) is not body:
                    found.append(namespace)
                last[namespace] = body
        return found


def live(*objects: tuple[str, dict[str, Any]]) -> LiveSnapshot:
    by_kind: dict[str, list[Any]] = defaultdict(list)
    for kind, obj in objects:
        by_kind[kind].append(BY_KIND[kind].compile(COMPILER, obj))
    return LiveSnapshot.build(by_kind)


def compiled(kind_obj: tuple[str, dict[str, Any]]) -> Any:
    return BY_KIND[kind_obj[0]].compile(COMPILER, kind_obj[1])


def namespace(name: str) -> tuple[str, dict[str, Any]]:
    return "Namespace", {"kind": "Namespace", "metadata": {"name": name}}


TEAM = role("team-a", "t1", [rule("*", "configmaps")], {"configmaps": {"team": ["a"]}})
OBJECTS = (TEAM, binding("a", "team-a", "User:alice", namespace="t1"), namespace("t1"),
           namespace("t2"))  # fmt: skip


def writer(
    client: Client,
    clock: list[float],
    max_bytes: int = 1_400_000,
    snapshots: Callable[[], Snapshot | None] | None = None,
    lease_seconds: float = 15.0,
    max_work: int = MAX_WORK,
    discover: Callable[[Any], Sequence[Resource]] = lambda _: [Resource("", "configmaps")],
    coverage: CoverageWriter | None = None,
    timed: bool = False,
    install: Install = SHIPPED,
    compile_softened: bool = False,
) -> ParamsWriter:
    """A writer whose lease (and, with ``timed``, its discovery and retries) follows ``clock``."""
    lease = LeaderLease(client, "label-rbac", "lead", "me", lease_seconds, clock=lambda: clock[0])  # type: ignore[arg-type]
    return ParamsWriter(
        client,  # type: ignore[arg-type]
        lease,
        Options(),
        max_bytes,
        discover=discover,
        snapshots=snapshots,
        max_work=max_work,
        coverage=coverage,
        install=install,
        compile_softened=compile_softened,
        **({"clock": lambda: clock[0]} if timed else {}),
    )


def story(client: Client, namespace: str) -> list[str]:
    """What was written for ``namespace``, in order: params (with their status), or the mark
    set/removed (``+softened``: labeled softened too)."""
    told = []
    for (method, path, body, _), kind in zip(client.writes, client.types, strict=True):
        if path == f"/api/v1/namespaces/{namespace}":
            assert (method, kind) == ("PATCH", MERGE)
            labels = body["metadata"]["labels"]
            assert set(labels) == {MARK, SOFTENED_MARK}  # a stale softened label never stays
            softened = "+softened" if labels[SOFTENED_MARK] == "true" else ""
            told.append(f"mark={labels[MARK]}{softened}")
        elif f"/namespaces/{namespace}/labelrbacparams" in path:
            assert not path.endswith("/status")  # the status goes with the parameters
            told.append("params")
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
    status = next(b for _, p, b, _ in client.writes if "labelrbacparams" in p)["status"]
    assert status["observedResourceVersion"] == "42"
    assert status["grants"] == 1 and status["conditions"][0]["status"] == "True"


def test_a_new_leader_writes_only_the_parameters_that_differ_from_those_stored() -> None:
    first, clock = Client(), [0.0]
    state = live(*OBJECTS)
    writer(first, clock).step(state.snapshot)
    stored = [b for _, p, b, _ in first.writes if p.endswith(f"/labelrbacparams/{NAME}")]
    # Another replica takes over after RBAC changed in t2 (t1's parameters are as it renders
    # them, and t1 is marked): it writes t2 alone, and does not mark t1 again.
    client = Client()
    client.listed = {
        "/apis/labelrbac.io/v1alpha1/labelrbacparams": stored,
        "/api/v1/namespaces": [{"metadata": {"name": "t1"}}],
    }
    t2_team = role("team-a", "t2", [rule("*", "configmaps")], {"configmaps": {"team": ["a"]}})
    changed = live(*OBJECTS, t2_team, bound("carol", "t2"))
    assert writer(client, clock).step(changed.snapshot) == 1
    assert client.params_written() == ["t2"]
    assert story(client, "t1") == []
    # Unreadable, they are all written again.
    client = Client()
    client.listed = {"/api/v1/namespaces": [{"metadata": {"name": "t1"}}]}
    client.list_each = _unreachable  # type: ignore[method-assign]
    assert writer(client, clock).step(changed.snapshot) == 2


@pytest.mark.parametrize(
    ("variables", "layout", "earlier"),
    [
        pytest.param(EARLIER_POLICY, False, True, id="before-0.3.4"),
        pytest.param([{"name": UNJUDGED, "expression": "{}"}], False, True, id="0.3.4"),
        pytest.param([{"name": UNJUDGED, "expression": "{}"}], True, False, id="this-layout"),
    ],
)
def test_parameters_keep_the_earlier_layout_while_an_earlier_policy_may_be_in_force(
    variables: list[dict[str, str]], layout: bool, earlier: bool
) -> None:
    """An earlier release's policy, found on taking the lease, reads each namespace's
    parameters in the earlier layout (``Target.earlier``): before 0.3.4 the resources no
    annotation restricts listed there, before 0.3.5 every entry a map of operations and every
    requirement with its four lists. Until ``POLICY_LOADED`` seconds after this leader wrote its
    own policy (which reads both layouts), the parameters it writes keep that layout, so no
    write is refused meanwhile; then every namespace is written in this release's. Taking over
    from a policy named with this release's ``LAYOUT``, they never do."""
    client, clock = Client(), [0.0]
    client.policies[f"{POLICIES}/{POLICY}"] = found_policy(variables, layout)
    params = writer(client, clock, discover=lambda _: SERVED_TWO, timed=True)
    state = live(*OBJECTS)
    params.step(state.snapshot)
    params.settle(10)
    paths = [p for _, p, _, _ in client.writes]
    first_params = min(i for i, p in enumerate(paths) if "labelrbacparams" in p)
    assert paths.index(f"{POLICIES}/{POLICY}") < first_params
    specs = {
        b["metadata"]["namespace"]: b["spec"]
        for _, p, b, _ in client.writes
        if p.endswith(f"/labelrbacparams/{NAME}")
    }
    assert sorted(specs) == ["t1", "t2"]
    assert all(
        spec.get("unjudged") == (["secrets"] if earlier else None) for spec in specs.values()
    )
    assert entry_types(specs.values()) == ({dict} if earlier else {str})
    client.writes.clear()
    clock[0] = POLICY_LOADED + 1
    params.step(state.snapshot)
    params.settle(10)
    specs = {
        b["metadata"]["namespace"]: b["spec"]
        for _, p, b, _ in client.writes
        if p.endswith(f"/labelrbacparams/{NAME}")
    }
    assert sorted(specs) == (["t1", "t2"] if earlier else [])
    assert all("unjudged" not in spec for spec in specs.values())
    assert entry_types(specs.values()) == ({str} if earlier else set())


def entry_types(specs: Iterable[Mapping[str, Any]]) -> set[type]:
    """The types of the role entries of namespaces' ``specs`` (each ``OBJECTS`` role grants
    every operation alike: one grant id in layout 2, a map in the earlier one)."""
    return {type(e) for s in specs for entries in s["roles"].values() for e in entries.values()}


def test_what_was_written_is_remembered_in_a_fixed_size_whatever_the_parameters() -> None:
    """A leader remembers every namespace it wrote: at 100k RBAC objects the parameters of one
    namespace can take a hundred kilobytes, so it keeps a digest, not the text."""
    client, clock = Client(), [0.0]
    many = [bound(f"user-{i:04}", "t1") for i in range(2000)]
    state = live(*OBJECTS, *many)
    params = writer(client, clock)
    params.step(state.snapshot)
    # Sent twice (created, then again before the mark), the same body.
    body, again = [b for _, p, b, _ in client.writes if "/namespaces/t1/labelrbacparams" in p]
    assert again is body
    assert len(json.dumps(body["spec"])) > 40_000
    kept = params._written["t1"]
    assert sys.getsizeof(kept.spec) + sys.getsizeof(kept.since) < 200
    # And it still tells a change from none.
    client.writes.clear()
    assert params.step(state.snapshot) == 0
    change = ("RoleBinding", None, compiled(bound("one-more", "t1")))
    changed = state.apply([change])
    params.applied(changed, [change], "")
    assert params.step(changed.snapshot) == 1


def _unreachable(*args: Any, **kwargs: Any) -> Any:
    raise Unreachable("connection refused")


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


def bound(user: str, namespace: str) -> tuple[str, dict[str, Any]]:
    return binding(user, "team-a", f"User:{user}", namespace=namespace)


def test_a_namespace_touched_while_others_are_written_is_written_in_the_same_step() -> None:
    client, clock = Client(), [0.0]
    t2_team = role("team-a", "t2", [rule("*", "configmaps")], {"configmaps": {"team": ["a"]}})
    steps = [(*OBJECTS, t2_team), (*OBJECTS, t2_team, bound("bob", "t1"))]
    steps.append((*steps[1], bound("dave", "t1"), bound("carol", "t2")))
    state = [live(*steps[0])]
    params = writer(client, clock, snapshots=lambda: state[0].snapshot)

    def move(to: int, *added: tuple[str, dict[str, Any]]) -> None:
        state[0] = live(*steps[to])
        params.applied(state[0], [("RoleBinding", None, compiled(b)) for b in added], str(to))

    params.step(state[0].snapshot)
    client.writes.clear()
    client.types.clear()
    move(1, bound("bob", "t1"))
    # While t1's parameters are written, RBAC changes in t1 again and in t2.
    client.during = lambda namespace: move(2, bound("dave", "t1"), bound("carol", "t2"))
    assert params.step(state[0].snapshot) == 3
    # Both without waiting for another step, t1 twice and in order: the second write is newer.
    written = client.params_written()
    assert sorted(written) == ["t1", "t1", "t2"] and written[0] == "t1"
    t1 = [b["spec"] for _, p, b, _ in client.writes if p.endswith(f"t1/labelrbacparams/{NAME}")]
    assert ("bob" in t1[0]["users"], "dave" in t1[0]["users"]) == (True, False)
    assert {"bob", "dave"} <= set(t1[1]["users"])


def test_a_namespace_is_marked_after_its_parameters_and_unmarked_before_delegating() -> None:
    client, clock = Client(), [0.0]
    state = live(*OBJECTS)
    params = writer(client, clock)
    params.step(state.snapshot)
    # Marked once the policy can read what it needs; never marked again while unchanged.
    # Created, then written again before the mark: the API server admits that update only once
    # the policies' informer holds the parameters (label-rbac-params-visible).
    assert story(client, "t1") == ["params", "params", "mark=true"]
    client.writes.clear()
    client.types.clear()
    assert params.step(state.snapshot) == 0 and client.writes == []
    # Too large now: the mark goes first (the webhook judges again), then the delegation.
    small = writer(client, clock, max_bytes=200)
    small.step(state.snapshot)
    assert story(client, "t1") == ["mark=None", "params"]


@pytest.mark.parametrize(
    ("refused", "marked"),
    [
        pytest.param(0, True, id="admitted-at-once"),
        pytest.param(2, True, id="admitted-on-the-third-try"),
        pytest.param(len(SEEN_RETRIES) + 1, False, id="not-admitted-yet"),
    ],
)
def test_a_namespace_is_marked_only_once_an_update_of_its_new_parameters_is_admitted(
    refused: int, marked: bool
) -> None:
    """The policy stands aside where the API server's informer finds no parameters: the mark
    waits until that informer holds them, which the API server's admitting an update of them
    proves (label-rbac-params-visible); until then the webhook judges the namespace."""
    client, clock = Client(), [0.0]
    client.unseen["t1"] = refused
    writer(client, clock).step(live(*OBJECTS).snapshot)
    told = story(client, "t1")
    tries = min(refused + 1, len(SEEN_RETRIES) + 1)
    assert told == ["params"] * (1 + tries) + (["mark=true"] if marked else [])


def many_namespaces(n: int, deleted: str = "") -> LiveSnapshot:
    objects: list[tuple[str, dict[str, Any]]] = []
    for i in range(n):
        if (name := f"n{i:02d}") == deleted:
            continue
        team = role("team-a", name, [rule("*", "configmaps")], {"configmaps": {"team": ["a"]}})
        objects += [team, binding("a", "team-a", "User:alice", namespace=name), namespace(name)]
    return live(*objects)


def proofs(client: Client) -> tuple[dict[str, int], dict[str, int]]:
    """Check that every namespace was marked only once the policies were proven to see its
    parameters: by an update of them admitted (one namespace), or by an epoch set after they
    were created and then seen (a batch; the epoch before the one seen, as an informer that
    coalesces one object's changes needs). The namespaces proven each way, by their marks."""
    created: dict[str, int] = {}
    one: dict[str, int] = {}
    sets: list[tuple[str, int]] = []  # (epoch, when set)
    seen_from = -1  # parameters created before this write are proven seen
    batch: dict[str, int] = {}
    for i, (method, path, body, _) in enumerate(client.writes):
        name = path.split("/")[5] if path.count("/") > 5 else path.rsplit("/", 1)[-1]
        annotations = (body.get("metadata") or {}).get("annotations") or {}
        if method == "ASK":
            asked = body["metadata"]["labels"][EPOCH]
            (k,) = [k for k, (epoch, _) in enumerate(sets) if epoch == asked]
            seen_from = max(seen_from, sets[k - 1][1] if k else -1)
        elif "labelrbacparams" in path and EPOCH in annotations:
            sets.append((annotations[EPOCH], i))
        elif "labelrbacparams" in path:
            if name in created:
                one.setdefault(name, i)
            created.setdefault(name, i)
        elif path.startswith("/api/v1/namespaces/") and body["metadata"]["labels"][MARK]:
            if name in one and one[name] < i:
                continue
            assert created[name] < seen_from, f"{name} marked unproven"
            batch[name] = i
    return one, batch


def test_many_new_namespaces_are_proven_seen_by_a_batch_before_they_are_marked() -> None:
    """A first compile: each namespace's parameters are sent once, and a few proofs of a batch
    (an epoch set, then seen) stand for the update each would otherwise need."""
    client, clock = Client(), [0.0]
    client.epoch_lag = 3
    state = many_namespaces(40)
    writer(client, clock).step(state.snapshot)
    one, batch = proofs(client)
    assert sorted(batch) + sorted(one) == sorted(f"n{i:02d}" for i in range(40))
    assert len(batch) > 40 - BATCH
    assert len([1 for method, *_ in client.writes if method == "ASK"]) < 10


def test_a_policy_that_does_not_check_epochs_leaves_each_namespace_proven_on_its_own() -> None:
    """An older release's policy admits any epoch: proofs of a batch would prove nothing, so
    each namespace's update proves it, once a few sentinels were refused."""
    client, clock = Client(), [0.0]
    client.checks_epochs = False
    writer(client, clock).step(many_namespaces(30).snapshot)
    one, batch = proofs(client)
    assert batch == {} and sorted(one) == [f"n{i:02d}" for i in range(30)]
    assert not [1 for method, *_ in client.writes if method == "ASK"]


def test_a_batch_never_seen_is_not_marked_and_is_proven_again_later() -> None:
    client, clock = Client(), [0.0]
    client.epoch_lag = 10**6  # the informer never gets there
    state = many_namespaces(30)
    params = writer(client, clock, timed=True)
    params.step(state.snapshot)
    assert not [w for w in client.writes if w[1].startswith("/api/v1/namespaces/n")][BATCH:]
    client.epoch_lag = 0
    clock[0] += BACKOFF_MAX
    for _ in range(3):
        params.step(state.snapshot)
    one, batch = proofs(client)
    assert len(one) + len(batch) == 30


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
    # The same parameters, written before: only the mark is due.
    assert story(client, "t2") == ["mark=true"]


def test_the_leader_keeps_the_registration_in_step_and_a_follower_does_not() -> None:
    """The writer hands the coverage the served resources discovery listed, while leading."""
    client, clock = Client(), [0.0]
    seen: list[tuple[Snapshot, tuple[Resource, ...]]] = []

    class Recording(CoverageWriter):
        def step(
            self, snapshot: Snapshot, served: Sequence[Resource], listed: Iterable[str] = ()
        ) -> bool:
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
    params.settle(10)  # the check runs beside the writes (before and after them)
    assert seen and all(s is state and found == tuple(served) for s, found in seen)
    checks = len(seen)
    client.lease = {
        "metadata": {"name": "lead", "resourceVersion": "8"},
        "spec": {"holderIdentity": "other", "leaseDurationSeconds": 15, "renewTime": "u"},
    }
    clock[0] = 6.0  # past a renewal period: the lease is read again, and is someone else's
    params.step(state)
    params.settle(10)
    assert len(seen) == checks


class Recording(CoverageWriter):
    """Records what each check is told the policies may let pass unjudged."""

    def __init__(self, client: Client) -> None:
        super().__init__(client, FIELD_MANAGER)  # type: ignore[arg-type]
        self.listed: list[frozenset[str]] = []

    def step(
        self, snapshot: Snapshot, served: Sequence[Resource], found: Iterable[str] = ()
    ) -> bool:
        self.listed.append(frozenset(found))
        return False


SERVED_TWO = [Resource("", "configmaps"), Resource("", "secrets")]


def test_the_coverage_is_told_what_the_policies_in_force_may_still_let_pass_unjudged() -> None:
    """A key restricted a moment ago stays named to the coverage (and so in the annotation the
    webhook's fence reads) until no policy letting its writes pass unjudged can still be in
    force: the API server loads a written policy within ``POLICY_LOADED`` seconds."""
    client, clock = Client(), [0.0]
    coverage = Recording(client)
    params = writer(client, clock, discover=lambda _: SERVED_TWO, coverage=coverage, timed=True)

    def step(when: float, snapshot: Snapshot) -> frozenset[str]:
        """What the coverage is told at a step at ``when``, before its writes."""
        clock[0] = when
        coverage.listed.clear()
        params.step(snapshot)
        params.settle(10)
        return coverage.listed[0]

    state = live(*OBJECTS)
    assert step(0.0, state.snapshot) == frozenset()  # no policy yet: nothing let pass
    assert step(POLICY_LOADED + 1, state.snapshot) == {"secrets"}
    assert policy_unjudged(client) == ["secrets"]
    a = {"team": ["a"]}
    restricting = compiled(
        role("team-a", "t1", [rule("*", "configmaps")], {"configmaps": a, "secrets": a})
    )
    after = state.apply([("Role", state.snapshot.roles[restricting.ref], restricting)]).snapshot
    at = POLICY_LOADED + 2
    assert step(at, after) == {"secrets"}  # checked before the writes: still let through
    # A Role's restriction: the policy judges it once every namespace indexes it, here in the
    # same step, after both namespaces' writes (``settling``).
    assert policy_unjudged(client) == []
    assert step(at + POLICY_LOADED - 1, after) == {"secrets"}  # maybe not loaded yet
    assert step(at + POLICY_LOADED + 1, after) == frozenset()


LISTS_TWO = [{"name": UNJUDGED, "expression": '{"secrets":true,"widgets.example.com":true}'}]


@pytest.mark.parametrize(
    ("variables", "stored", "told"),
    [
        pytest.param(None, None, frozenset(), id="no-policy-yet"),
        pytest.param(
            LISTS_TWO, None, {"secrets", "widgets.example.com"}, id="a-leader-s-of-this-release"
        ),
        pytest.param(LISTS_TWO, ["configmaps"], {"secrets", "widgets.example.com"}, id="0.3.4"),
        pytest.param(
            EARLIER_POLICY,
            ["widgets.example.com"],
            {"widgets.example.com"},
            id="an-earlier-release-s: what its parameters list",
        ),
    ],
)
def test_a_new_leader_tells_the_coverage_what_the_policy_it_found_lets_pass(
    variables: list[dict[str, str]] | None, stored: list[str] | None, told: frozenset[str]
) -> None:
    """Before its first write of the policies, a new leader's first check is told what the
    enforcing policy it found (a previous leader's) lets pass unjudged: its constant, or for
    an earlier release's, what the parameters it reads list; a resource it let pass stays named
    ``POLICY_LOADED`` seconds after this leader's policy no longer does."""
    client, clock = Client(), [0.0]
    if variables is not None:
        client.policies[f"{POLICIES}/{POLICY}"] = found_policy(variables, stored is None)
    if stored is not None:
        spec = {"mode": "enforce", "allowUnlabeled": False, "indexed": [], "unjudged": stored}
        params_of = {"metadata": {"name": NAME, "namespace": "t1"}, "spec": spec}
        client.listed = {"/apis/labelrbac.io/v1alpha1/labelrbacparams": [params_of]}
    coverage = Recording(client)
    params = writer(client, clock, discover=lambda _: SERVED_TWO, coverage=coverage, timed=True)
    params.step(live(*OBJECTS).snapshot)
    params.settle(10)
    assert coverage.listed[0] == told
    assert coverage.listed[-1] == told | {"secrets"}  # the policy just written lists secrets


def test_the_writer_keeps_each_snapshots_restrictions_known_for_the_next_one() -> None:
    """So the coverage of a snapshot derived by a batch costs that batch's role changes, not a
    pass over every role (``Snapshot.restrictions``)."""
    client = Client()
    coverage = CoverageWriter(client, FIELD_MANAGER)  # type: ignore[arg-type]
    lease = LeaderLease(client, "label-rbac", "lead", "me", 15.0)  # type: ignore[arg-type]
    params = ParamsWriter(client, lease, Options(), coverage=coverage)  # type: ignore[arg-type]
    state = live(*OBJECTS)
    params.applied(state, [], "1")
    known = state.snapshot.known_restrictions
    assert known is not None
    edited = compiled(role("team-a", "t1", [rule("*", "configmaps")], {"secrets": {"team": ["a"]}}))
    change = ("Role", state.snapshot.roles[edited.ref], edited)
    after = state.apply([change]).snapshot
    assert after.known_restrictions is not None and after.known_restrictions is not known
    assert [p.resource.text for p in after.restrictions().patterns] == ["secrets"]


def test_pending_namespaces_are_taken_oldest_first_a_few_at_a_time() -> None:
    pending = PendingNamespaces()  # every namespace, at first
    known = {"a", "b", "c", "d"}
    assert pending.take(known, set(), 3) == ["a", "b", "c"]
    pending.add(["b", "gone"])
    # d was touched first; b is being written, so it waits; a namespace no longer known goes.
    assert pending.take(known, {"b"}, 8) == ["d"]
    assert pending.take(known - {"gone"}, set(), 8) == ["b"]
    assert pending.take(known, set(), 8) == []
    pending.add(ALL)
    assert pending.take(known, {"a"}, 8) == ["b", "c", "d"]
    assert pending.take(known, set(), 8) == ["a"]


def test_a_touched_namespace_goes_before_the_rest_of_a_full_render() -> None:
    pending = PendingNamespaces()
    known = {f"n{i}" for i in range(10)}
    assert pending.take(known, set(), 2) == ["n0", "n1"]
    pending.add(["n7"])
    assert pending.take(known, set(), 2) == ["n7", "n2"]
    assert pending.take(known, set(), 10) == ["n3", "n4", "n5", "n6", "n8", "n9"]


def test_the_compiled_condition_keeps_its_transition_time_while_it_says_the_same() -> None:
    def condition(client: Client, namespace: str) -> dict[str, Any]:
        # Sent twice when unmarked: the apply, then the update proving the policies see it.
        *_, body = [b for _, p, b, _ in client.writes if f"{namespace}/labelrbacparams" in p]
        return dict(body["status"]["conditions"][0])

    first, clock = Client(), [0.0]
    state = live(*OBJECTS)
    writer(first, clock).step(state.snapshot)
    stored = [b for _, p, b, _ in first.writes if p.endswith(f"/labelrbacparams/{NAME}")]
    for obj in stored:
        obj["status"]["conditions"][0]["lastTransitionTime"] = "2020-01-01T00:00:00Z"
    changed = live(*OBJECTS, bound("carol", "t1"), bound("dave", "t2"))
    # A new leader writes t1 and t2 again: still compiled, since the time it read.
    client = Client()
    client.listed = {"/apis/labelrbac.io/v1alpha1/labelrbacparams": stored}
    writer(client, clock).step(changed.snapshot)
    assert condition(client, "t1")["lastTransitionTime"] == "2020-01-01T00:00:00Z"
    # Too large now: the condition turns, at a new time.
    client = Client()
    client.listed = {"/apis/labelrbac.io/v1alpha1/labelrbacparams": stored}
    writer(client, clock, max_bytes=200).step(changed.snapshot)
    turned = condition(client, "t1")
    assert (turned["status"], turned["reason"]) == ("False", "TooLarge")
    assert turned["lastTransitionTime"] != "2020-01-01T00:00:00Z"


def test_a_step_leaves_a_slow_write_in_flight_and_goes_on_with_the_others() -> None:
    """A step ends after a third of the lease without waiting for the writes in flight: a
    namespace touched meanwhile is written while a slow one is still being written."""
    client, clock = Client(), [0.0]
    client.hold["t1"] = threading.Event()
    t2_team = role("team-a", "t2", [rule("*", "configmaps")], {"configmaps": {"team": ["a"]}})
    state = [live(*OBJECTS, t2_team)]
    params = writer(client, clock, snapshots=lambda: state[0].snapshot, lease_seconds=0.3)
    assert params.step(state[0].snapshot) == 1  # t2; t1 still held
    change = ("RoleBinding", None, compiled(bound("bob", "t2")))
    state[0] = state[0].apply([change])
    params.applied(state[0], [change], "2")
    assert params.step(state[0].snapshot) == 1  # t2 again, t1 still held
    assert client.params_written() == ["t1", "t2", "t2"]
    client.hold["t1"].set()
    params.settle(10)
    assert params.step(state[0].snapshot) == 1  # t1's write, counted once finished


def test_a_slow_coverage_check_does_not_hold_up_the_parameters() -> None:
    client, clock = Client(), [0.0]
    gate, checked = threading.Event(), threading.Event()

    class Slow(CoverageWriter):
        def step(
            self, snapshot: Snapshot, served: Sequence[Resource], listed: Iterable[str] = ()
        ) -> bool:
            gate.wait(10)
            checked.set()
            return False

    lease = LeaderLease(client, "label-rbac", "lead", "me", 15.0, clock=lambda: clock[0])  # type: ignore[arg-type]
    params = ParamsWriter(
        client,  # type: ignore[arg-type]
        lease,
        Options(),
        discover=lambda _: [Resource("", "configmaps")],
        coverage=Slow(client, FIELD_MANAGER),  # type: ignore[arg-type]
    )
    state = live(*OBJECTS)
    assert params.step(state.snapshot) == 2
    change = ("RoleBinding", None, compiled(bound("bob", "t1")))
    state = state.apply([change])
    params.applied(state, [change], "2")
    assert params.step(state.snapshot) == 1  # while the first check still waits
    assert not checked.is_set()
    gate.set()
    params.settle(10)
    assert checked.is_set()


def test_discovery_is_repeated_beside_the_writes_and_a_new_resource_renders_again() -> None:
    client, clock = Client(), [0.0]
    served = [Resource("", "configmaps")]
    gate, listed = threading.Event(), []

    def discover(_: Any) -> list[Resource]:
        if listed:  # every discovery after the first waits for the gate
            gate.wait(10)
        listed.append(tuple(served))
        return list(served)

    lease = LeaderLease(client, "label-rbac", "lead", "me", 15.0, clock=lambda: clock[0])  # type: ignore[arg-type]
    params = ParamsWriter(
        client,  # type: ignore[arg-type]
        lease,
        Options(),
        discover=discover,
        clock=lambda: clock[0],
    )
    secrets = role("secrets-a", "t1", [rule("*", "secrets")], {"secrets": {"team": ["a"]}})
    state = live(*OBJECTS, secrets, binding("s", "secrets-a", "User:alice", namespace="t1"))
    assert params.step(state.snapshot) == 2
    params.settle(10)
    assert len(listed) == 1
    # A minute later secrets are served, and t1 is touched: t1 is written while discovery waits.
    clock[0] = DISCOVERY_INTERVAL + 1
    served.append(Resource("", "secrets"))
    change = ("RoleBinding", None, compiled(bound("bob", "t1")))
    state = state.apply([change])
    params.applied(state, [change], "2")
    assert params.step(state.snapshot) == 1
    assert len(listed) == 1
    gate.set()
    params.settle(10)
    assert len(listed) == 2
    # The new target renders every namespace again: each now indexes secrets, restricted by a
    # role bound in t1 only (a subject bound to it in t2 a moment from now is "not listed yet").
    client.writes.clear()
    assert params.step(state.snapshot) == 2
    bodies = [b for _, p, b, _ in client.writes if "labelrbacparams" in p]
    assert sorted(b["metadata"]["namespace"] for b in bodies) == ["t1", "t2"]
    assert {tuple(b["spec"]["indexed"]) for b in bodies} == {("configmaps", "secrets")}


@pytest.mark.parametrize(
    ("failures", "ceiling"),
    [
        pytest.param(1, 0.5, id="first retry"),
        pytest.param(3, 2.0, id="doubling"),
        pytest.param(7, BACKOFF_MAX, id="capped"),
        pytest.param(60, BACKOFF_MAX, id="capped far on"),
    ],
)
def test_retries_back_off_exponentially_with_jitter_up_to_a_cap(
    failures: int, ceiling: float
) -> None:
    delays = [backoff(failures) for _ in range(200)]
    assert all(ceiling / 2 <= d <= ceiling for d in delays)
    assert len(set(delays)) > 100  # jittered: replicas and namespaces do not retry in step


def test_a_failed_write_is_retried_after_a_growing_backoff_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With the API server refusing (the webhook down), a namespace is not tried again until
    its backoff is due, the delay grows, the log says it once, and success forgets it."""
    client, clock = Client(), [0.0]
    client.failing["t2"] = ApiError(500, "InternalError", "failed calling webhook")
    params = writer(client, clock, timed=True)
    state = live(*OBJECTS)
    with caplog.at_level(logging.WARNING, "label_rbac.compile"):
        assert params.step(state.snapshot) == 1  # t1; t2 refused
        delays = []
        for _ in range(4):
            failures, due = params._retry["t2"]
            delays.append(due - clock[0])
            tries = client.params_written().count("t2")
            for _ in range(5):  # not due yet: steps (woken by changes, say) leave it alone
                assert params.step(state.snapshot) == 0
            assert client.params_written().count("t2") == tries
            clock[0] = due  # due: tried once more, refused again
            assert params.step(state.snapshot) == 0
            assert client.params_written().count("t2") == tries + 1
            assert params._retry["t2"][0] == failures + 1
    assert sum(delays[2:]) > sum(delays[:2])  # 0.25-0.5, 0.5-1 then 1-2, 2-4 seconds
    lines = [r.getMessage() for r in caplog.records if "could not write" in r.getMessage()]
    assert len(lines) == 1 and "t2" in lines[0] and "failed calling webhook" in lines[0]
    del client.failing["t2"]
    clock[0] = params._retry["t2"][1]
    assert params.step(state.snapshot) == 1
    assert "t2" not in params._retry


def test_rendering_runs_beside_the_lease_and_a_slow_render_holds_up_no_other_namespace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A namespace whose render takes long holds one writer: the step ends within a third of
    the lease (so the lease is renewed), the other namespaces are written meanwhile."""
    client, clock = Client(), [0.0]
    gate, rendering = threading.Event(), threading.Event()
    real = compile_module.render

    def render(snapshot: Snapshot, namespace: str, target: Any) -> Any:
        if namespace == "t1":
            rendering.set()
            gate.wait(10)
        return real(snapshot, namespace, target)

    monkeypatch.setattr(compile_module, "render", render)
    params = writer(client, clock, lease_seconds=0.3)
    state = live(*OBJECTS)
    assert params.step(state.snapshot) == 1  # t2, while t1 renders
    assert rendering.is_set() and client.params_written() == ["t2"]
    renewed = [p for _, p, _, _ in client.writes].count(LEASE)
    clock[0] = 0.2  # the lease wants renewing: it is, with t1 still rendering
    params.step(state.snapshot)
    assert [p for _, p, _, _ in client.writes].count(LEASE) == renewed + 1
    gate.set()
    params.settle(10)
    assert params.step(state.snapshot) == 1
    assert sorted(client.params_written()) == ["t1", "t2"]


def test_a_namespace_over_the_work_budget_says_so_in_its_status_an_event_and_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client, clock = Client(), [0.0]
    params = writer(client, clock, max_work=1000)
    names = " ".join(f"c{i}" for i in range(1000))
    named = role("named", "t1", [rule("update", "configmaps", names=names)], {"configmaps": {}})
    with caplog.at_level(logging.WARNING, "label_rbac.compile"):
        bob = binding("n", "named", "User:bob", namespace="t1")
        params.step(live(*OBJECTS, named, bob).snapshot)
    t1 = next(b for _, p, b, _ in client.writes if p.endswith(f"t1/labelrbacparams/{NAME}"))
    (condition,) = t1["status"]["conditions"]
    assert (condition["status"], condition["reason"]) == ("False", "TooComplex")
    assert "more than 1000 units of work" in condition["message"]
    assert "delegated" in t1["spec"] and "roles" not in t1["spec"]
    (event,) = [b for _, p, b, _ in client.writes if p == "/api/v1/namespaces/t1/events"]
    assert (event["reason"], event["type"]) == ("TooComplex", "Warning")
    assert any("t1 is left to the webhook (TooComplex" in r.getMessage() for r in caplog.records)
    assert story(client, "t2") == ["params", "params", "mark=true"]  # t2 has no role: compiled


def test_parameters_deleted_are_written_again() -> None:
    """The namespace controller deletes them with their namespace: one created again under the
    same name gets them back, although they render as they did."""
    client, clock = Client(), [0.0]
    state = live(*OBJECTS)
    params = writer(client, clock)
    params.step(state.snapshot)
    client.writes.clear()
    assert params.step(state.snapshot) == 0
    params.gone("t1")
    assert params.step(state.snapshot) == 1
    assert client.params_written() == ["t1"]


@pytest.mark.parametrize(
    ("objects", "changed", "unloaded"),
    [
        pytest.param(OBJECTS, True, 0, id="update-of-marked-parameters"),
        pytest.param(OBJECTS, False, 0, id="first-write-proven-on-its-own"),
        pytest.param(OBJECTS, False, 10_000, id="first-write-not-marked-yet"),
        pytest.param(None, False, 0, id="first-write-waiting-for-a-batch-proof"),
    ],
)
def test_parameters_deleted_while_being_written_are_written_again(
    objects: tuple[tuple[str, dict[str, Any]], ...] | None, changed: bool, unloaded: int
) -> None:
    """A write sent before the parameters' deletion and finished after it: what it wrote is
    gone, so it is not remembered as written, and the namespace is written again."""
    client, clock = Client(), [0.0]
    client.unloaded = unloaded
    state = live(*objects) if objects is not None else many_namespaces(40)
    params = writer(client, clock, timed=True)
    if changed:
        params.step(state.snapshot)
        client.writes.clear()
        client.types.clear()
        change = ("RoleBinding", None, compiled(bound("bob", "t1")))
        state = state.apply([change])
        params.applied(state, [change], "2")
    deleted: list[tuple[str, int]] = []

    def delete(namespace: str) -> None:  # once the write is sent, before it returns
        deleted.append((namespace, len(client.writes)))
        params.gone(namespace)

    client.during = delete
    params.step(state.snapshot)
    clock[0] += BACKOFF_MAX  # any retry is due
    params.step(state.snapshot)
    ((namespace, at),) = deleted
    # Applied again after the deletion, apart from what the write in flight then sent.
    stale = client.writes[at - 1][2]
    path = f"/namespaces/{namespace}/labelrbacparams/{NAME}"
    again = [
        body
        for (_, p, body, _), kind in zip(client.writes[at:], client.types[at:], strict=True)
        if p.endswith(path) and kind == APPLY and body is not stale
    ]
    assert again
    assert story(client, namespace)[-1] == ("params" if unloaded else "mark=true")


def test_parameters_deleted_while_written_are_never_a_proofs_sentinel() -> None:
    """Many new namespaces wait for one proof, sent to one of them: never to one whose
    parameters went while they were written (with their namespace), or that proof would fail
    there for ever and no namespace of the batch would be marked."""
    client, clock = Client(), [0.0]
    state = [many_namespaces(40)]
    params = writer(client, clock, snapshots=lambda: state[0].snapshot, timed=True)
    deleted: list[str] = []
    sent = client.send

    def send(method: str, path: str, body: Mapping[str, Any], *args: Any) -> Any:
        # Once the write in flight is sent, its namespace is gone: any later write there fails.
        if deleted and path.endswith(f"/{deleted[0]}/labelrbacparams/{NAME}"):
            raise ApiError(404, "NotFound")
        return sent(method, path, body, *args)

    client.send = send  # type: ignore[method-assign]

    def delete(name: str) -> None:  # the namespace goes, and its parameters with it
        deleted.append(name)
        state[0] = many_namespaces(40, deleted=name)
        params.gone(name)

    client.during = delete
    for _ in range(3):
        params.step(state[0].snapshot)
        clock[0] += BACKOFF_MAX
    (gone,) = deleted
    marked = [n for n in (f"n{i:02d}" for i in range(40)) if story(client, n)[-1:] == ["mark=true"]]
    assert gone not in marked and len(marked) == 39


def test_parameters_deleted_while_a_new_leader_lists_them_are_written_again() -> None:
    """A new leader lists the stored parameters to skip writing those unchanged: those deleted
    while the list was under way are not taken as written."""
    first, clock = Client(), [0.0]
    state = live(*OBJECTS)
    writer(first, clock).step(state.snapshot)
    client = Client()
    client.listed = {
        "/apis/labelrbac.io/v1alpha1/labelrbacparams": [
            b for _, p, b, _ in first.writes if p.endswith(f"/labelrbacparams/{NAME}")
        ],
        "/api/v1/namespaces": [{"metadata": {"name": "t1"}}, {"metadata": {"name": "t2"}}],
    }
    params = writer(client, clock)
    listed = client.list_each

    def list_each(path: str, *args: Any, **kwargs: Any) -> tuple[list[Any], str]:
        found = listed(path, *args, **kwargs)
        if "labelrbacparams" in path:
            params.gone("t1")  # the list read them; the watch tells of their deletion
        return found

    client.list_each = list_each  # type: ignore[method-assign]
    assert params.step(state.snapshot) == 1
    assert client.params_written() == ["t1"] and story(client, "t1")[-1] == "mark=true"
    assert story(client, "t2") == []


def test_a_namespace_created_again_is_written_at_once_whatever_its_backoff() -> None:
    """Writes refused while the namespace was being deleted grew its backoff; deleted and
    created again within one batch, it never leaves the snapshot, yet its new Namespace object
    is written at once, not when the old backoff is due."""
    client, clock = Client(), [0.0]
    client.failing["t2"] = ApiError(403, "Forbidden", "namespace t2 is being terminated")
    params = writer(client, clock, timed=True)
    state = live(*OBJECTS)
    params.step(state.snapshot)
    for _ in range(6):  # refused again each time its backoff is due: the delay grows
        clock[0] = params._retry["t2"][1]
        params.step(state.snapshot)
    failures, due = params._retry["t2"]
    assert failures == 7 and due - clock[0] > 8
    del client.failing["t2"]
    namespace = ("t2", {})
    changes = [("Namespace", namespace, None), ("Namespace", None, namespace)]
    params.applied(state, changes, "")
    clock[0] += 0.1
    assert params.step(state.snapshot) == 1
    assert client.params_written()[-1] == "t2" and "t2" not in params._retry


# -- Discovery --------------------------------------------------------------------------------


class Discovery:
    """Answers discovery GETs from ``documents`` (path → document, or an error to raise)."""

    def __init__(self, documents: dict[str, Any]) -> None:
        self.documents = documents

    def get(self, path: str, *args: Any, **kwargs: Any) -> Any:
        found = self.documents[path]
        if isinstance(found, Exception):
            raise found
        return found


def _group(name: str, *versions: str, preferred: str = "") -> dict[str, Any]:
    listed = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
    chosen = preferred or versions[0]
    return {
        "name": name,
        "versions": listed,
        "preferredVersion": {"groupVersion": f"{name}/{chosen}", "version": chosen},
    }


def _listing(*names: str, namespaced: bool = True, verbs: str = "create list") -> dict[str, Any]:
    return {
        "resources": [{"name": n, "namespaced": namespaced, "verbs": verbs.split()} for n in names]
    }


def _discovery() -> Discovery:
    return Discovery(
        {
            "/api/v1": _listing("configmaps", "configmaps/status"),
            "/apis": {
                "groups": [
                    _group("example.com", "v1", "v1beta1"),
                    _group("metrics.example.io", "v1"),
                ]
            },
            # gadgets are served only at the version that is not preferred.
            "/apis/example.com/v1": _listing("widgets"),
            "/apis/example.com/v1beta1": _listing("widgets", "gadgets"),
            "/apis/metrics.example.io/v1": _listing("samples"),
        }
    )


def test_discovery_lists_every_version_of_every_group() -> None:
    found = ServedResources()(_discovery())  # type: ignore[arg-type]
    assert found == [
        Resource("", "configmaps"),
        Resource("example.com", "widgets"),
        Resource("example.com", "gadgets"),
        Resource("metrics.example.io", "samples"),
    ]


def test_the_command_lines_discovery_finds_a_resource_served_only_at_another_version() -> None:
    found = [(r.group, r.version, r.resource) for r in discover(_discovery())]  # type: ignore[arg-type]
    assert found == [
        ("", "v1", "configmaps"),
        ("example.com", "v1", "widgets"),  # the preferred version first
        ("example.com", "v1beta1", "gadgets"),
        ("metrics.example.io", "v1", "samples"),
    ]


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(ApiError(503, "ServiceUnavailable"), id="503"),
        pytest.param(ApiError(429, "TooManyRequests"), id="429"),
        pytest.param(Unreachable("timed out"), id="timeout"),
    ],
)
def test_a_failed_group_keeps_what_it_listed_before_and_is_unknown_until_it_answers(
    error: Exception,
) -> None:
    client = _discovery()
    discover = ServedResources()
    client.documents["/apis/metrics.example.io/v1"] = error
    # Never listed: not known (neither indexed nor unjudged: the policy refuses it, in a
    # compiled namespace, until the compiler knows it).
    assert Resource("metrics.example.io", "samples") not in discover(client)  # type: ignore[arg-type]
    client.documents["/apis/metrics.example.io/v1"] = _listing("samples")
    assert Resource("metrics.example.io", "samples") in discover(client)  # type: ignore[arg-type]
    # Listed once: one failed request does not drop it.
    client.documents["/apis/metrics.example.io/v1"] = error
    assert Resource("metrics.example.io", "samples") in discover(client)  # type: ignore[arg-type]


# -- What every namespace indexes --------------------------------------------------------------


SERVED = [Resource("", "configmaps"), Resource("", "secrets")]
SECRETS_A = role("secrets-a", "t3", [rule("*", "secrets")], {"secrets": {"team": ["a"]}})
WIDELY_SERVED = [
    *SERVED,
    Resource("", "pods"),  # the webhook's own: the policy never judges it
    Resource("", "configmaps", "status"),  # a subresource: never judged by the policy either
    Resource("example.com", "widgets"),
]


def restricting(name: str, pattern: str) -> tuple[str, dict[str, Any]]:
    return role(name, "t3", [rule("*", "*")], {pattern: {"team": ["a"]}})


def policy_unjudged(client: Client) -> list[str]:
    """What the enforcing policy, as last written, lets pass unjudged (its constant)."""
    for _, path, body, _ in reversed(client.writes):
        if path == f"{POLICIES}/{POLICY}":
            found = unjudged_of(body)
            assert found is not None
            return sorted(found)
    raise AssertionError("the policy was not written")


def lists(client: Client) -> dict[str, tuple[list[str], list[str]]]:
    """Each namespace's last written indexed resources, with the unjudged ones of the policy
    last written (stored once, not in any namespace's parameters)."""
    found = {}
    for _, path, body, _ in client.writes:
        if path.endswith(f"/labelrbacparams/{NAME}"):
            spec = body["spec"]
            assert "unjudged" not in spec
            found[body["metadata"]["namespace"]] = spec["indexed"]
    unjudged = policy_unjudged(client)
    return {namespace: (indexed, unjudged) for namespace, indexed in found.items()}


@pytest.mark.parametrize(
    ("extra", "indexed", "unjudged"),
    [
        pytest.param((), ["configmaps"], ["secrets", "widgets.example.com"], id="one-restriction"),
        pytest.param(
            (SECRETS_A,),
            ["configmaps", "secrets"],
            ["widgets.example.com"],
            id="restricted-in-another-namespace",
        ),
        pytest.param(
            (restricting("widgets", "*.example.com"),),
            ["configmaps", "widgets.example.com"],
            ["secrets"],
            id="a-group-pattern",
        ),
        pytest.param(
            (restricting("all", "*"),),
            ["configmaps", "secrets", "widgets.example.com"],
            [],
            id="everything-restricted",
        ),
        pytest.param(
            (restricting("pods", "pods"),),
            ["configmaps"],
            ["secrets", "widgets.example.com"],
            id="the-webhook-s-own-resource",
        ),
        pytest.param(
            (restricting("gadgets", "gadgets"),),
            ["configmaps"],
            ["secrets", "widgets.example.com"],
            id="not-served",
        ),
    ],
)
def test_every_namespace_indexes_what_annotations_restrict_and_lists_the_rest_unjudged(
    extra: tuple[tuple[str, dict[str, Any]], ...], indexed: list[str], unjudged: list[str]
) -> None:
    """``unjudged``: the served resources the policy judges (no subresource, none of the
    webhook's own) that are not indexed. Bound or not, wherever the restricting role is."""
    client, clock = Client(), [0.0]
    params = writer(client, clock, discover=lambda _: WIDELY_SERVED)
    assert params.step(live(*OBJECTS, *extra).snapshot) == 2
    assert lists(client) == {"t1": (indexed, unjudged), "t2": (indexed, unjudged)}


def test_a_resource_no_longer_restricted_stays_indexed_while_it_lingers() -> None:
    """An annotation entry put on and taken off again does not make every namespace be
    written each time: what was restricted less than ``KEEP_INDEXED`` seconds ago (counted
    from the last time it was) stays indexed, then goes to ``unjudged``."""
    client, clock = Client(), [0.0]
    params = writer(client, clock, discover=lambda _: SERVED, timed=True)
    state = live(*OBJECTS, SECRETS_A)
    (old,) = [r for r in state.snapshot.roles.values() if r.ref.name == "secrets-a"]

    def at(when: float, change: Any = None) -> list[str]:
        """Step at ``when`` (after ``change``): the namespaces written."""
        nonlocal state
        clock[0] = when
        if change is not None:
            state = state.apply([change])
            params.applied(state, [change], str(when))
        client.writes.clear()
        params.step(state.snapshot)
        params.settle(10)
        return sorted(client.params_written())

    assert at(0.0) == ["t1", "t2"]
    assert lists(client)["t1"] == (["configmaps", "secrets"], [])
    # The role goes: nothing restricts secrets, but they stay indexed.
    assert at(1.0, ("Role", old, None)) == []
    # Put back and taken off again within the window: still nothing to write.
    assert at(300.0, ("Role", None, old)) == []
    assert at(301.0, ("Role", old, None)) == []
    # Past the window counted from the first removal, not from the last: still indexed.
    assert at(301.0 + KEEP_INDEXED - 1) == []
    # Past it: every namespace drops secrets, now unjudged.
    assert at(301.0 + KEEP_INDEXED + 1) == ["t1", "t2"]
    assert lists(client) == {
        "t1": (["configmaps"], ["secrets"]),
        "t2": (["configmaps"], ["secrets"]),
    }


SECRETS = [rule("*", "secrets")]
TEAM_A = {"secrets": {"team": ["a"]}}


@pytest.mark.parametrize(
    ("restriction", "settles"),
    [
        pytest.param(role("secrets-a", "t1", SECRETS, TEAM_A), True, id="a-role"),
        pytest.param(role("secrets-v", "t1", SECRETS, "{not json"), True, id="a-void-role"),
        pytest.param(role("secrets-a", "", SECRETS, TEAM_A), False, id="a-clusterrole"),
        pytest.param(role("secrets-v", "", SECRETS, "{not json"), False, id="a-void-clusterrole"),
    ],
)
def test_a_role_s_new_restriction_passes_unjudged_elsewhere_until_every_namespace_indexes_it(
    restriction: tuple[str, dict[str, Any]], settles: bool
) -> None:
    """A tenant's Role restricting a resource nothing restricted before makes every namespace
    index it, a write of each; until each is written the policy keeps letting it pass where the
    parameters do not index it, so no other tenant's writes of it are refused meanwhile (the
    namespace of the Role, touched, is written first). A ClusterRole's restriction, which any
    namespace's bindings may hand out, is judged at once: refused where not indexed yet."""
    client, clock = Client(), [0.0]
    params = writer(client, clock, discover=lambda _: SERVED, timed=True, lease_seconds=1.5)
    state = live(*OBJECTS)
    params.step(state.snapshot)
    params.settle(10)
    assert policy_unjudged(client) == ["secrets"]
    before, written = len(client.writes), len(client.params_written())
    change = (restriction[0], None, compiled(restriction))
    state = state.apply([change])
    params.applied(state, [change], "2")
    client.hold["t2"] = threading.Event()  # t2's write waits, once sent, until let go
    params.step(state.snapshot)
    assert client.params_written()[written:] == ["t1", "t2"]  # t1, touched, first
    assert policy_unjudged(client) == (["secrets"] if settles else [])
    client.hold["t2"].set()
    params.settle(10)
    params.step(state.snapshot)  # the pass ends in this step: nothing else to write
    params.settle(10)
    assert client.params_written()[written:] == ["t1", "t2"]
    both = (["configmaps", "secrets"], [])
    assert lists(client) == {"t1": both, "t2": both}
    writes = client.writes[before:]
    last_params = max(i for i, w in enumerate(writes) if "/labelrbacparams/" in w[1])
    judging = [i for i, w in enumerate(writes) if w[1] == f"{POLICIES}/{POLICY}"]
    assert len(judging) == 1  # one write of the policy either way
    assert (judging[0] > last_params) is settles


def test_a_namespace_deleted_in_the_middle_of_the_pass_holds_nothing_back() -> None:
    """Namespace t2 is deleted, and its parameters with it, while its write of the pass is in
    flight: that write is forgotten, and the policy judges secrets once every namespace left
    indexes them, not never."""
    client, clock = Client(), [0.0]
    params = writer(client, clock, discover=lambda _: SERVED, timed=True, lease_seconds=1.5)
    state = live(*OBJECTS)
    params.step(state.snapshot)
    params.settle(10)
    written = len(client.params_written())
    change = ("Role", None, compiled(role("secrets-a", "t1", SECRETS, TEAM_A)))
    state = state.apply([change])
    params.applied(state, [change], "2")
    client.hold["t2"] = threading.Event()
    params.step(state.snapshot)
    assert client.params_written()[written:] == ["t1", "t2"]
    deleted = ("Namespace", ("t2", {}), None)
    state = state.apply([deleted])
    params.applied(state, [deleted], "3")
    params.gone("t2")
    client.hold["t2"].set()
    params.settle(10)
    assert policy_unjudged(client) == ["secrets"]
    params.step(state.snapshot)
    params.settle(10)
    assert policy_unjudged(client) == []
    assert client.params_written()[written:] == ["t1", "t2"]  # t2 not written again


@pytest.mark.parametrize("refused_once", [False, True], ids=["written", "refused-once"])
def test_other_namespaces_index_it_once_the_policy_holding_its_cluster_part_is_loaded(
    refused_once: bool,
) -> None:
    """When what grew is granted cluster-wide (carol's ClusterRoleBinding reaches secrets), the
    cluster part grows too: a namespace indexing secrets before the API server judges by that
    policy would refuse carol ("do not list this user yet"). So only the namespace the change
    touched is written at once, the others ``POLICY_LOADED`` seconds after the policy (after
    the write that went through, when the first was refused)."""
    client, clock = Client(), [0.0]
    params = writer(client, clock, discover=lambda _: SERVED, timed=True, lease_seconds=1.5)
    everything = role("everything", "", [rule("*", "*")])
    carol = binding("carol", "everything", "User:carol")
    state = live(*OBJECTS, everything, carol)
    params.step(state.snapshot)
    params.settle(10)
    assert policy_unjudged(client) == ["secrets"]
    before, written = len(client.writes), len(client.params_written())
    change = ("Role", None, compiled(role("secrets-a", "t1", SECRETS, TEAM_A)))
    state = state.apply([change])
    params.applied(state, [change], "2")
    if refused_once:
        client.missing.add(f"{POLICIES}/{POLICY}")
        with pytest.raises(ApiError):
            params.step(state.snapshot)
        client.missing.clear()
        before = len(client.writes)
    params.step(state.snapshot)
    params.settle(10)
    assert client.params_written()[written:] == ["t1"]
    (policy,) = [w for w in client.writes[before:] if w[1] == f"{POLICIES}/{POLICY}"]
    assert "carol" in json.dumps(policy[2])  # the cluster part now grants her secrets
    assert policy_unjudged(client) == ["secrets"]  # still let pass in t2
    clock[0] = POLICY_LOADED - 1
    params.step(state.snapshot)
    params.settle(10)
    assert client.params_written()[written:] == ["t1"]
    clock[0] = POLICY_LOADED + 1
    params.step(state.snapshot)
    params.settle(10)
    assert client.params_written()[written:] == ["t1", "t2"]
    assert policy_unjudged(client) == []


def test_a_new_leader_lets_pass_what_its_predecessor_s_policy_let_pass_until_it_caught_up() -> None:
    """A leader that took over in the middle of such a pass keeps the policy it found letting
    the resource pass while it writes every (marked) namespace again."""
    client, clock = Client(), [0.0]
    client.policies[f"{POLICIES}/{POLICY}"] = found_policy(
        [{"name": UNJUDGED, "expression": '{"secrets":true}'}], True
    )
    spec = {"mode": "enforce", "allowUnlabeled": False, "indexed": ["configmaps"]}
    client.listed = {
        "/api/v1/namespaces": [
            {"metadata": {"name": n, "labels": {MARK: "true"}}} for n in ("t1", "t2")
        ],
        "/apis/labelrbac.io/v1alpha1/labelrbacparams": [
            {"metadata": {"name": NAME, "namespace": n}, "spec": spec} for n in ("t1", "t2")
        ],
    }
    params = writer(client, clock, discover=lambda _: SERVED, timed=True, lease_seconds=1.5)
    state = live(*OBJECTS, role("secrets-a", "t1", SECRETS, TEAM_A))
    client.hold["t2"] = threading.Event()
    params.step(state.snapshot)
    assert policy_unjudged(client) == ["secrets"]
    client.hold["t2"].set()
    params.settle(10)
    params.step(state.snapshot)
    params.settle(10)
    assert policy_unjudged(client) == []


@pytest.mark.parametrize(
    "conditions",
    [
        pytest.param(None, id="no-registration"),
        pytest.param([], id="no-condition"),
        pytest.param(
            [
                {
                    "name": "left-by-the-policy",
                    "expression": "!(request.resource.resource in ['secrets'])",
                }
            ],
            id="an-earlier-version-s-condition",
        ),
        pytest.param([{"name": CONDITION, "expression": expression([])}], id="skips-nothing"),
    ],
)
def test_a_new_leader_indexes_what_annotations_restrict_whatever_the_registration_says(
    conditions: list[dict[str, str]] | None,
) -> None:
    client, clock = Client(), [0.0]
    if conditions is not None:
        client.registration = {
            "metadata": {"name": "label-rbac"},
            "webhooks": [{"name": COMPILED_ENTRY, "matchConditions": conditions}],
        }
    coverage = CoverageWriter(client, FIELD_MANAGER)  # type: ignore[arg-type]
    params = writer(client, clock, discover=lambda _: SERVED, coverage=coverage)
    params.step(live(*OBJECTS).snapshot)
    params.settle(10)
    assert lists(client) == {
        "t1": (["configmaps"], ["secrets"]),
        "t2": (["configmaps"], ["secrets"]),
    }


def test_a_crd_changing_starts_discovery_at_the_next_step() -> None:
    client, clock = Client(), [0.0]
    listed: list[int] = []

    def discover(_: Any) -> list[Resource]:
        listed.append(1)
        return SERVED

    params = writer(client, clock, discover=discover, timed=True)
    state = live(*OBJECTS)
    for _ in range(2):
        params.step(state.snapshot)
        params.settle(10)
    assert len(listed) == 1  # the interval has not passed
    params.rediscover_soon()
    params.step(state.snapshot)
    params.settle(10)
    assert len(listed) == 2


def test_a_crd_changing_while_discovery_runs_is_listed_again_at_the_next_step() -> None:
    """A CRD seen established while discovery is listing (it may have listed the group before
    the API server served it) is not lost until the next interval, a minute later."""
    client, clock = Client(), [0.0]
    served: list[list[Resource]] = [SERVED, SERVED, [*SERVED, Resource("example.com", "widgets")]]
    params: ParamsWriter | None = None
    calls: list[int] = []

    def discover(_: Any) -> list[Resource]:
        calls.append(1)
        if len(calls) == 2:
            assert params is not None
            params.rediscover_soon()  # established meanwhile: this listing may miss it
        return served[min(len(calls), len(served)) - 1]

    params = writer(client, clock, discover=discover, timed=True)
    state = live(*OBJECTS)
    params.step(state.snapshot)
    params.settle(10)
    params.rediscover_soon()  # the CRD created
    for _ in range(3):
        params.step(state.snapshot)
        params.settle(10)
    assert len(calls) == 3 and clock[0] < DISCOVERY_INTERVAL
    assert policy_unjudged(client) == ["secrets", "widgets.example.com"]


def policy_writes(client: Client) -> list[dict[str, Any]]:
    return [body for _, path, body, _ in client.writes if path.startswith(POLICIES)]


@pytest.mark.parametrize(
    ("crd", "written", "policies"),
    [
        pytest.param(
            Resource("example.com", "widgets"), [], 1, id="restricted-nowhere: the policy alone"
        ),
        pytest.param(
            Resource("example.com", "gadgets"),
            ["t1", "t2"],
            0,
            id="a-pattern-restricts-it: every namespace indexes it",
        ),
    ],
)
def test_a_resource_served_anew_writes_the_policy_or_what_indexes_it(
    crd: Resource, written: list[str], policies: int
) -> None:
    """A CRD created (discovery lists a new resource) that no annotation restricts is one
    write, of the policy, which from then on lets its writes pass: not a write of every
    namespace. One an annotation's pattern already restricts is indexed by every namespace,
    so each is written, and the policy is not (until then the resource is in neither list and
    its writes are refused in a compiled namespace: "do not know ... yet")."""
    client, clock = Client(), [0.0]
    served = list(SERVED)
    params = writer(client, clock, discover=lambda _: list(served), timed=True)
    state = live(*OBJECTS, restricting("gadgets", "gadgets.example.com"))
    params.step(state.snapshot)
    params.settle(10)
    assert policy_unjudged(client) == ["secrets"]
    served.append(crd)
    client.writes.clear()
    params.rediscover_soon()
    for _ in range(2):  # discovered beside the writes, rendered at the next step
        params.step(state.snapshot)
        params.settle(10)
    assert sorted(client.params_written()) == written
    assert len(policy_writes(client)) == policies
    if policies:
        assert policy_unjudged(client) == ["secrets", "widgets.example.com"]


CLUSTER_ROLE = role("edit-c", "", [rule("*", "configmaps")], {"configmaps": {"team": ["c"]}})


def test_a_cluster_binding_change_writes_the_policy_once_and_no_namespace() -> None:
    client, clock = Client(), [0.0]
    state = live(*OBJECTS, CLUSTER_ROLE)
    params = writer(client, clock)
    assert params.step(state.snapshot) == 2
    (first,) = policy_writes(client)
    assert first["metadata"]["name"] == POLICY
    assert [v["name"] for v in first["spec"]["variables"]][:1] == ["cluster0"]
    assert "clusterrole edit-c" not in first["spec"]["variables"][0]["expression"]
    client.writes.clear()
    change = ("ClusterRoleBinding", None, compiled(binding("c", "edit-c", "User:carol")))
    state = state.apply([change])
    params.applied(state, [change], "2")
    assert params.step(state.snapshot) == 0  # no namespace written
    (second,) = policy_writes(client)
    assert "clusterrole edit-c" in second["spec"]["variables"][0]["expression"]
    assert [p for _, p, _, _ in client.writes if not p.startswith(POLICIES)] == []
    # The same again: nothing to write.
    client.writes.clear()
    params.applied(state, [change], "3")
    assert params.step(state.snapshot) == 0 and client.writes == []


def test_no_namespace_is_marked_until_the_policy_is_written() -> None:
    client, clock = Client(), [0.0]
    client.missing.add(f"{POLICIES}/{POLICY}")  # the API server refuses the policy's write
    state = live(*OBJECTS)
    params = writer(client, clock)
    with pytest.raises(ApiError):
        params.step(state.snapshot)
    assert not any(path.startswith("/api/v1/namespaces/") for _, path, _, _ in client.writes)
    client.missing.clear()
    params.step(state.snapshot)
    assert len(policy_writes(client)) == 2
    assert story(client, "t1")[-1] == "mark=true"


def test_a_policy_changed_by_someone_else_is_written_again() -> None:
    client, clock = Client(), [0.0]
    state = live(*OBJECTS)
    params = writer(client, clock)
    params.step(state.snapshot)
    assert len(policy_writes(client)) == 1 and params.policies.ready
    # Its own write, seen through the watch, changes nothing.
    params.policies.seen(None, (POLICY, ""))
    params.step(state.snapshot)
    assert len(policy_writes(client)) == 1
    # Someone else's change, or a deletion: written again, and no namespace marked meanwhile.
    for changed in ((POLICY, "99"), None):
        params.policies.seen((POLICY, ""), changed)
        assert not params.policies.ready
        params.step(state.snapshot)
        assert params.policies.ready
    assert len(policy_writes(client)) == 3


def test_a_cluster_part_that_turns_softened_renders_every_namespace_again() -> None:
    client, clock = Client(), [0.0]
    state = live(*OBJECTS, CLUSTER_ROLE, binding("c", "edit-c", "User:carol"))
    params = writer(client, clock)
    params.step(state.snapshot)
    client.writes.clear()
    client.types.clear()
    softened = role(
        "edit-c", "", [rule("*", "configmaps")], {"configmaps": {"team": ["c"]}}, mode="warn"
    )
    change = ("ClusterRole", compiled(CLUSTER_ROLE), compiled(softened))
    state = state.apply([change])
    params.applied(state, [change], "2")
    params.step(state.snapshot)
    # Every namespace is now left to the webhook (a denial would be softened).
    assert sorted(client.params_written()) == ["t1", "t2"]
    assert story(client, "t2")[0] == "mark=None"


def softening(mode: str) -> tuple[str, dict[str, Any]]:
    """t1's team-a Role in ``mode``."""
    return role(
        "team-a", "t1", [rule("*", "configmaps")], {"configmaps": {"team": ["a"]}}, mode=mode
    )


@pytest.mark.parametrize(
    ("before", "after", "told"),
    [
        pytest.param("enforce", "warn", ["mark=true+softened", "params"], id="labeled-before"),
        pytest.param("warn", "enforce", ["params", "mark=true"], id="label-off-after"),
        pytest.param("warn", "audit", ["params"], id="still-softened"),
        pytest.param("enforce", "enforce", [], id="never-softened"),
    ],
)
def test_a_compiled_namespace_is_labeled_softened_before_its_parameters_soften_a_denial(
    before: str, after: str, told: list[str]
) -> None:
    """With ``--compile-softened``, a compiled namespace whose parameters soften a denial is
    labeled softened, which the warn and audit policies' bindings select: labeled before the
    parameters say so (the enforcing policy then lets the denial pass, and only those policies
    record it), and the label taken off after they no longer do."""
    client, clock = Client(), [0.0]
    state = live(softening(before), *OBJECTS[1:])
    params = writer(client, clock, compile_softened=True)
    params.step(state.snapshot)
    softened = "+softened" if before != "enforce" else ""
    assert story(client, "t1") == ["params", "params", f"mark=true{softened}"]
    assert story(client, "t2") == ["params", "params", "mark=true"]
    client.writes.clear()
    client.types.clear()
    change = ("Role", compiled(softening(before)), compiled(softening(after)))
    state = state.apply([change])
    params.applied(state, [change], "2")
    params.step(state.snapshot)
    assert story(client, "t1") == told
    assert story(client, "t2") == []


@pytest.mark.parametrize(
    ("labels", "told"),
    [
        pytest.param({SOFTENED_MARK: "true"}, [], id="labeled"),
        pytest.param({}, ["mark=true+softened"], id="not-labeled"),
    ],
)
def test_a_new_leader_labels_softened_a_compiled_namespace_that_lacks_the_label(
    labels: dict[str, str], told: list[str]
) -> None:
    """What a new leader reads of the marks includes the softened label: a namespace compiled
    by a release that did not label it gets the label alone, its parameters unchanged."""
    first, clock = Client(), [0.0]
    state = live(softening("warn"), *OBJECTS[1:])
    writer(first, clock, compile_softened=True).step(state.snapshot)
    stored = [b for _, p, b, _ in first.writes if p.endswith(f"/labelrbacparams/{NAME}")]
    client = Client()
    client.listed = {
        "/apis/labelrbac.io/v1alpha1/labelrbacparams": stored,
        "/api/v1/namespaces": [
            {"metadata": {"name": "t1", "labels": {MARK: "true", **labels}}},
            {"metadata": {"name": "t2", "labels": {MARK: "true"}}},
        ],
    }
    assert writer(client, clock, compile_softened=True).step(state.snapshot) == len(told)
    assert story(client, "t1") == told
    assert client.params_written() == []


def test_no_namespace_is_marked_before_the_api_server_enforces_the_policy() -> None:
    """A policy just created is not in force until the API server has loaded it: no namespace
    is marked before the policy refuses the compiler's probe, one probe at a time; once it has,
    the others are marked without probing (until the policy is created anew)."""
    client, clock = Client(), [0.0]
    client.unloaded = 2  # two probes pass before the policy is loaded
    state = live(*OBJECTS)
    params = writer(client, clock, timed=True)
    params.step(state.snapshot)
    marked = [ns for ns in ("t1", "t2") if story(client, ns)[-1] == "mark=true"]
    assert len(marked) == 1 and len(client.probes) == 3  # the one that probed
    clock[0] += BACKOFF_MAX  # the other's retry is due
    params.step(state.snapshot)
    assert story(client, "t1")[-1] == story(client, "t2")[-1] == "mark=true"
    assert len(client.probes) == 3
    # Never loaded: one probe at a time, backed off; nothing is marked, the parameters are.
    client, clock = Client(), [0.0]
    client.unloaded = 10_000
    params = writer(client, clock, timed=True)
    for _ in range(3):
        params.step(state.snapshot)
    assert not any(p.startswith("/api/v1/namespaces/") for _, p, _, _ in client.writes)
    assert sorted(client.params_written()) == ["t1", "t2"]
    assert len(client.probes) == len(SEEN_RETRIES) + 1


RENAMED = Install("acme", "acme-system")


@pytest.mark.parametrize(
    ("install", "own", "judged"),
    [
        pytest.param(SHIPPED, "kube-system", False, id="shipped-kube-system"),
        pytest.param(SHIPPED, "label-rbac", False, id="shipped-own-namespace"),
        pytest.param(RENAMED, "kube-system", False, id="renamed-kube-system"),
        pytest.param(RENAMED, "acme-system", False, id="renamed-own-namespace"),
        pytest.param(RENAMED, "label-rbac", True, id="renamed-judges-label-rbac"),
    ],
)
def test_a_namespace_the_policies_never_judge_waits_for_a_judged_one_to_probe(
    install: Install, own: str, judged: bool
) -> None:
    """A probe where the install's policies never judge (kube-system, its own namespace) would
    never be refused, and its backoff would hold back every namespace: such a namespace is
    marked once a judged one has proven the policy. A namespace they judge probes itself."""
    client, clock = Client(), [0.0]
    client.policy = install.name
    client.never_judged = set() if judged else {own}
    team = role("team-a", own, [rule("*", "configmaps")], {"configmaps": {"team": ["a"]}})
    state = live(team, namespace(own))
    params = writer(client, clock, timed=True, install=install)
    params.step(state.snapshot)
    if judged:
        assert client.probes == [own] and story(client, own)[-1] == "mark=true"
        return
    # Written, not marked, and no probe sent from it.
    assert client.probes == [] and story(client, own) == ["params", "params"]
    change = ("Namespace", None, ("t1", {}))
    state = state.apply([change])
    params.applied(state, [change], "2")
    params.step(state.snapshot)
    assert client.probes == ["t1"] and story(client, "t1")[-1] == "mark=true"
    clock[0] += BACKOFF_MAX  # its mark's retry is due
    params.step(state.snapshot)
    assert client.probes == ["t1"] and story(client, own)[-1] == "mark=true"


def test_a_policy_created_again_is_proven_again_before_the_next_mark() -> None:
    client, clock = Client(), [0.0]
    state = live(*OBJECTS)
    params = writer(client, clock)
    params.step(state.snapshot)
    probed = len(client.probes)
    params.policies.seen((POLICY, ""), None)  # deleted by someone else
    change = ("Namespace", None, ("t3", {}))
    state = state.apply([change])
    params.applied(state, [change], "2")
    params.step(state.snapshot)
    assert story(client, "t3") == ["params", "params", "mark=true"]
    assert client.probes[probed:] == ["t3"]


def test_a_renamed_install_writes_its_policies_under_its_names() -> None:
    """The chart installed as ``acme-lr`` in ``policy`` (``--policy-name``, the compiler's
    ``--lease-namespace``): the compiler writes and watches the policies its bindings name,
    leaving its own namespace out, and none of the shipped install's."""
    client = Client()
    policies = PolicyWriter(client, ACTIONS, install=Install("acme-lr", "policy"))  # type: ignore[arg-type]
    assert policies.names == ("acme-lr", "acme-lr-warn", "acme-lr-audit")
    chunks = ("{'users': {}, 'groups': {}, 'roles': {}, 'grants': {}}",)
    part = ClusterPart(chunks, 0, False)
    assert policies.keep(part) == 3
    assert [path for _, path, _, _ in client.writes] == [
        f"{POLICIES}/{name}" for name in policies.names
    ]
    renamed = Install("acme-lr", "policy")
    for (_, _, body, _), shipped in zip(client.writes, ACTIONS, strict=True):
        assert body == renamed.document(policy(shipped, part))
        assert body["metadata"]["name"] == shipped.replace(POLICY, "acme-lr", 1)
        (own, *_) = body["spec"]["matchConstraints"]["namespaceSelector"]["matchExpressions"]
        assert own["values"] == ["policy", "kube-system"]
        text = json.dumps(body)
        assert "system:serviceaccount:label-rbac:" not in text
        assert renamed.compiler == "system:serviceaccount:policy:acme-lr-compiler"
        if shipped == POLICY:  # the probe it refuses is the renamed compiler's
            assert renamed.compiler in text


@pytest.mark.parametrize(
    ("sizes", "expected"),
    [
        pytest.param([], 10, id="first-page"),
        pytest.param([1_400_000] * 10, 2, id="at-the-size-guard"),
        pytest.param([88_000] * 10, 45, id="previous-layout"),
        pytest.param([1_700] * 10, 500, id="this-layout"),
    ],
)
def test_a_new_leader_reads_the_stored_parameters_in_pages_of_bounded_bytes(
    sizes: list[int], expected: int
) -> None:
    """Parameters are read whole, a page at a time: a page holds about 4 MB of specs whatever
    their size (one of 50 at the size guard took 439 MB parsed)."""
    pages = compile_module._PageSizer(10, 4_000_000, 500)
    for size in sizes:
        pages.saw(size)
    assert pages.next() == expected
