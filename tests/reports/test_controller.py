"""The reporter's passes: the first judges every namespace, later ones only the namespaces a
change touched, keeping the others' reports as rendered (no API server: the caches are stubs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from app.engine.model import Resource
from app.engine.reverse import BoundPod
from app.reports.controller import (
    SYSTEM_NAMESPACES,
    BoundPods,
    Labeled,
    Options,
    Reporter,
    Stored,
)
from app.settings import Settings
from app.source.api import KubeClient
from app.source.informer import Tuning
from tests.support import binding, role, rule, snapshot

CONFIGMAPS = Resource("", "configmaps")
SNAPSHOT = snapshot(
    *(item for ns in ("t1", "t2") for item in (
        role("team-a", ns, [rule("update", "configmaps")], {"configmaps": {"team": ["a"]}}),
        binding("alice", "team-a", "User:alice", namespace=ns),
    )),
)  # fmt: skip


class StubInformer:
    """A synced cache of configmaps, recording which namespaces each pass asked for."""

    synced, last_error = True, ""

    def __init__(self) -> None:
        self.items = {"t1/ok": Labeled("t1", {"team": "a"}), "t2/stray": Labeled("t2", {})}
        self.asked: list[frozenset[str] | None] = []

    def objects(self, namespaces: frozenset[str] | None = None) -> list[tuple[str, Labeled]]:
        self.asked.append(namespaces)
        return [(key.partition("/")[2], kept) for key, kept in self.items.items()
                if namespaces is None or kept.namespace in namespaces]  # fmt: skip


@pytest.fixture
def reporter(tmp_path: Path) -> tuple[Reporter, StubInformer]:
    client = KubeClient.__new__(KubeClient)  # never asked: nothing is started
    found = Reporter(client, Settings(), lease=None, options=Options())  # type: ignore[arg-type]
    found.source.snapshot = lambda: SNAPSHOT  # type: ignore[method-assign]
    informer = StubInformer()
    found._informers = {CONFIGMAPS: informer}  # type: ignore[dict-item]
    return found, informer


def failing(due: dict[Any, Any], namespace: str) -> list[str]:
    (body, _), *_ = [v for k, v in due.items() if k[1] == namespace and "policyreports" in k[0]]
    return [r["resources"][0]["name"] for r in body["results"] if r["result"] == "fail"]


def test_a_change_rejudges_only_its_namespace(reporter: tuple[Reporter, StubInformer]) -> None:
    found, informer = reporter
    first = found.render()
    assert first is not None and informer.asked == [None]  # every namespace, once
    assert failing(first, "t2") == ["stray"] and failing(first, "t1") == []
    informer.items["t1/bad"] = Labeled("t1", {"team": "b"})
    found._object_changed(None, informer.items["t1/bad"])
    second = found.render()
    assert second is not None and informer.asked[-1] == frozenset({"t1"})
    assert failing(second, "t1") == ["bad"]
    t2 = [k for k in first if k[1] == "t2"]
    assert all(second[k] is first[k] for k in t2)  # t2's reports are kept, not rendered again
    third = found.render()  # nothing changed: nothing judged but the cluster scope's errors
    assert third is not None and informer.asked[-1] == frozenset()
    assert {k: v[1] for k, v in third.items()} == {k: v[1] for k, v in second.items()}


def test_an_rbac_change_rejudges_the_namespaces_it_reaches(
    reporter: tuple[Reporter, StubInformer],
) -> None:
    found, informer = reporter
    assert found.render() is not None
    old = next(r for r in SNAPSHOT.roles.values() if r.ref.namespace == "t2")
    found._applied(SNAPSHOT_LIVE, [("Role", old, old)])
    assert found.render() is not None
    assert informer.asked[-1] == frozenset({"t2"})


class _Live:
    """What ``params.touched`` reads of the state after a change."""

    snapshot = SNAPSHOT


SNAPSHOT_LIVE: Any = _Live()


def test_system_namespaces_are_left_out(reporter: tuple[Reporter, StubInformer]) -> None:
    """Not judged, not reported: no report in kube-system for its unlabeled objects."""
    found, informer = reporter
    informer.items["kube-system/coredns"] = Labeled("kube-system", {})
    informer.items["label-rbac/own"] = Labeled("label-rbac", {})
    for excluded, reported in [
        (SYSTEM_NAMESPACES | {"label-rbac"}, {"t1", "t2"}),  # the command's default
        (frozenset(), {"t1", "t2", "kube-system", "label-rbac"}),  # --include-system-namespaces
    ]:
        options = Options(excluded=frozenset(excluded))
        judged = Reporter(found._client, Settings(), None, options)  # type: ignore[arg-type]
        judged.source.snapshot = lambda: SNAPSHOT  # type: ignore[method-assign]
        judged._informers = found._informers
        due = judged.render()
        assert due is not None and {k[1] for k in due} == reported


class RecordingClient:
    """The API client's writes and lists as the reporter makes them: PATCH answered by
    ``patch`` (an exception is raised), every request recorded."""

    def __init__(self, patch: Exception | None = None, stored: list[Any] | None = None) -> None:
        self.patch, self.stored = patch, stored or []
        self.sent: list[tuple[str, str]] = []

    def send(self, method: str, path: str, body: Any, *_: Any) -> dict[str, Any]:
        self.sent.append((method, path))
        if method == "PATCH" and self.patch is not None:
            raise self.patch
        return {"metadata": {"resourceVersion": str(len(self.sent))}}

    def list_each(self, path: str, page: int, timeout: Any, each: Any, **_: Any) -> Any:
        return [each(item) for item in self.stored if path.endswith("/policyreports")], "1"


class Synced:
    """The watch of stored reports, as listed."""

    synced = True

    def __init__(self, stored: list[Stored]) -> None:
        self.stored = stored

    def values(self) -> list[Stored]:
        return self.stored

    def version(self, namespace: str, name: str) -> str | None:
        found = [s.version for s in self.stored if s.key[1:] == (namespace, name)]
        return found[0] if found else None


class Lease:
    def current(self) -> bool:
        return True


def writer(client: RecordingClient, stored: list[Stored]) -> Reporter:
    found = Reporter(client, Settings(), Lease(), Options(writes_per_second=1e6))  # type: ignore[arg-type]
    found._stored = {("wgpolicyk8s.io/v1alpha2", "policyreports"): Synced(stored)}  # type: ignore[dict-item]
    return found


T1 = ("wgpolicyk8s.io/v1alpha2/policyreports", "t1", "label-rbac")
PATH = "/apis/wgpolicyk8s.io/v1alpha2/namespaces/t1/policyreports"


@pytest.mark.parametrize(("status", "deleted"), [
    pytest.param(413, True, id="too-large"),
    pytest.param(422, True, id="invalid"),
    pytest.param(409, False, id="conflict-tried-again"),
    pytest.param(500, False, id="server-error-tried-again"),
])  # fmt: skip
def test_a_report_refused_for_good_is_deleted_not_left_stale(status: int, deleted: bool) -> None:
    from app.source.api import ApiError

    client = RecordingClient(patch=ApiError(status, "Refused"))
    found = writer(client, [Stored(T1, "7")])  # a stored one, maybe forged
    found._write({T1: ({"metadata": {}}, b"digest")})
    assert (("DELETE", f"{PATH}/label-rbac") in client.sent) is deleted
    assert T1 not in found._written and found._dirty.is_set()  # tried again next pass


def test_strays_carrying_the_label_are_deleted() -> None:
    client = RecordingClient()
    stray = (T1[0], "t1", "label-rbac-7")
    found = writer(client, [Stored(T1, "7"), Stored(stray, "8")])
    found._write({T1: ({"metadata": {}}, b"digest")})
    assert client.sent == [("PATCH", f"{PATH}/label-rbac"), ("DELETE", f"{PATH}/label-rbac-7")]
    assert found._versions[T1] == "1"  # what our write returned: the watch's echo is ours


def test_first_sightings_are_read_from_the_stored_reports_never_later_than_now() -> None:
    import time

    ref = {"kind": "ConfigMap", "namespace": "t1", "name": "x", "uid": "u"}
    stored = [{"results": [
        {"result": "fail", "rule": "labels-in-a-bucket", "resources": [ref],
         "timestamp": {"seconds": 1700000000}},
        {"result": "pass", "rule": "labels-in-a-bucket", "resources": [ref],
         "timestamp": {"seconds": 4000000000}},  # forged: in the future
        {"result": "fail", "rule": "x", "resources": "not a list", "timestamp": 5},
        {"result": "fail", "rule": "x", "resources": {"0": ref}, "timestamp": {"seconds": 1}},
        "not a result",
    ]}, {"results": 7}]  # fmt: skip
    found = writer(RecordingClient(stored=stored), [])
    found._reports_served = {("wgpolicyk8s.io/v1alpha2", "policyreports")}
    carried = found._first_sightings()
    assert carried["fail/labels-in-a-bucket/ConfigMap/t1/x/u"] == 1700000000
    assert carried["pass/labels-in-a-bucket/ConfigMap/t1/x/u"] <= time.time()
    assert len(carried) == 2


def stamps(due: dict[Any, Any], namespace: str) -> dict[tuple[str, str], int]:
    (body, _), *_ = [v for k, v in due.items() if k[1] == namespace and "policyreports" in k[0]]
    return {(r["resources"][0]["name"], r["result"]): r["timestamp"]["seconds"]
            for r in body["results"]}  # fmt: skip


def test_a_result_keeps_its_first_sighting_from_pass_to_pass(
    reporter: tuple[Reporter, StubInformer], monkeypatch: pytest.MonkeyPatch
) -> None:
    found, informer = reporter
    clock = [1000.0]
    monkeypatch.setattr("app.reports.controller.time.time", lambda: clock[0])
    first = found.render()
    assert first is not None and stamps(first, "t1") == {("ok", "pass"): 1000,
                                                         ("team-a", "pass"): 1000}  # fmt: skip
    clock[0] = 2000.0
    informer.items["t1/bad"] = Labeled("t1", {"team": "b"}, uid="u-bad")
    found._object_changed(None, informer.items["t1/bad"])
    second = found.render()
    assert second is not None and stamps(second, "t1") == {
        ("ok", "pass"): 1000, ("team-a", "pass"): 1000, ("bad", "fail"): 2000}  # fmt: skip
    clock[0] = 3000.0  # the same name, another object: a new sighting
    informer.items["t1/bad"] = Labeled("t1", {"team": "b"}, uid="u-bad-2")
    found._object_changed(None, informer.items["t1/bad"])
    third = found.render()
    assert third is not None and stamps(third, "t1")[("bad", "fail")] == 3000
    found._carried = {"fail/labels-in-a-bucket/ConfigMap/t2/stray/": 5}  # as a new leader reads
    found._mark({"*"})
    fourth = found.render()
    assert fourth is not None and stamps(fourth, "t2")[("stray", "fail")] == 1000  # as rendered
    found._rendered, found._carried = {}, {"fail/labels-in-a-bucket/ConfigMap/t2/stray/": 5}
    found._mark({"*"})
    fifth = found.render()
    assert fifth is not None and stamps(fifth, "t2")[("stray", "fail")] == 5  # as stored
    assert found._carried == {}  # served its turn


@pytest.mark.parametrize(("stored", "written"), [
    pytest.param([Stored(T1, "10")], False, id="as-our-last-write-left-it"),
    pytest.param([Stored(T1, "11")], True, id="written-by-someone-else"),
    pytest.param([], True, id="deleted-or-unlabeled"),
])  # fmt: skip
def test_a_report_is_compared_with_what_is_stored(stored: list[Stored], written: bool) -> None:
    """Only the version our own write returned is ours: any other, or none, is written again."""
    client = RecordingClient()
    found = writer(client, stored)
    found._written[T1], found._versions[T1] = b"digest", "10"
    found._write({T1: ({"metadata": {}}, b"digest")})
    assert (("PATCH", f"{PATH}/label-rbac") in client.sent) is written


def test_a_change_of_a_stored_report_not_ours_starts_a_pass() -> None:
    found = writer(RecordingClient(), [])
    found._versions[T1] = "10"
    found._dirty.clear()
    found._stored_changed(None, Stored(T1, "10"))  # our own write, seen by the watch
    assert not found._dirty.is_set()
    for old, new in [(Stored(T1, "10"), Stored(T1, "11")), (Stored(T1, "10"), None)]:
        found._dirty.clear()
        found._stored_changed(old, new)  # someone else's write; a deletion or an unlabeling
        assert found._dirty.is_set()


def test_a_pass_cut_short_by_the_lease_is_taken_up_again() -> None:
    """A pass that outlasts the lease stops writing, and the next one (after the renewal)
    writes what it left: never forgotten until another change."""

    class Lapsed(Lease):
        def current(self) -> bool:
            return False

    client = RecordingClient()
    found = writer(client, [])
    found._lease = Lapsed()  # type: ignore[assignment]
    found._dirty.clear()
    found._write({T1: ({"metadata": {}}, b"digest")})
    assert client.sent == [] and found._dirty.is_set()


# -- Where pods run: the bound pods' watch, and the Nodes' labels ---------------------------------

POOL = "node-restriction.kubernetes.io/pool"


def placed_snapshot(b1_pool: str = "b", placement: bool = True) -> Any:
    """Nodes a1 (pool a) and b1; in t1 and t2, team=a pods placed on pool a."""
    nodes = [("Node", {"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": name, "uid": f"uid-{name}", "labels": {POOL: pool}}})
        for name, pool in (("a1", "a"), ("b1", b1_pool))]  # fmt: skip
    where = {"nodeLabels": {POOL: ["a"]}} if placement else None
    return snapshot(*nodes, *(item for ns in ("t1", "t2") for item in (
        role("team-a", ns, [rule("*", "pods")], {"pods": {"team": ["a"]}}, placement=where),
        binding("alice", "team-a", "User:alice", namespace=ns),
    )))  # fmt: skip


def pod_event(kind: str, namespace: str, name: str, node: str, version: str = "1") -> Any:
    """A watch event of a pod bound to ``node``, as the API server sends it (whole)."""
    return {"type": kind, "object": {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}",
                     "resourceVersion": version, "labels": {"team": "a"}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "nginx"}]},
        "status": {"phase": "Running", "podIP": f"10.0.0.{version}"}}}  # fmt: skip


def placement(due: dict[Any, Any], namespace: str) -> dict[str, str]:
    """Pod name → its placement result, in ``namespace``'s report."""
    found = [v for k, v in due.items() if k[1] == namespace and "policyreports" in k[0]]
    return {r["resources"][0]["name"]: r["result"] for body, _ in found
            for r in body["results"] if r["rule"] == "placement"}  # fmt: skip


@pytest.fixture
def placing(reporter: tuple[Reporter, StubInformer]) -> tuple[Reporter, StubInformer, BoundPods]:
    """The reporter with a listed watch of bound pods (fed its events by hand)."""
    found, informer = reporter
    current = placed_snapshot()
    found.source.snapshot = lambda: current  # type: ignore[method-assign]
    pods = BoundPods(found._client, Tuning(), found._pod_changed)
    pods.synced = True
    found._pods = pods
    return found, informer, pods


def test_a_binding_and_a_node_relabel_rejudge_only_the_namespaces_they_touch(
    placing: tuple[Reporter, StubInformer, BoundPods],
) -> None:
    found, informer, pods = placing
    pods._handle(pod_event("ADDED", "t2", "home", "a1"))
    first = found.render()
    assert first is not None and placement(first, "t2") == {"home": "pass"}
    pods._handle(pod_event("ADDED", "t1", "stray", "b1"))  # bound to the other pool's node
    second = found.render()
    assert second is not None and informer.asked[-1] == frozenset({"t1"})
    assert placement(second, "t1") == {"stray": "fail"}
    (body, _), *_ = [v for k, v in second.items() if k[1] == "t1" and "policyreports" in k[0]]
    (result,) = [r for r in body["results"] if r["rule"] == "placement"]
    assert result["resources"][0] == {"apiVersion": "v1", "kind": "Pod", "name": "stray",
                                      "namespace": "t1", "uid": "uid-stray"}  # fmt: skip
    # b1 relabelled into pool a: the namespaces of its pods only (t1), with the new labels.
    before, after = placed_snapshot(), placed_snapshot(b1_pool="a")
    node = ("Node", ("b1", before.nodes["b1"]), ("b1", after.nodes["b1"]))
    found._applied(type("Live", (), {"snapshot": after})(), [node])  # type: ignore[arg-type]
    third = found.render()
    assert third is not None and informer.asked[-1] == frozenset({"t1"})
    assert placement(third, "t1") == {"stray": "pass"}
    pods._handle(pod_event("DELETED", "t1", "stray", "b1", "2"))
    fourth = found.render()
    assert fourth is not None and placement(fourth, "t1") == {}


def test_a_pods_status_update_marks_nothing(
    placing: tuple[Reporter, StubInformer, BoundPods],
) -> None:
    """Pods churn: only a change of what is kept (labels, node) makes a namespace judged."""
    found, _, pods = placing
    pods._handle(pod_event("ADDED", "t1", "home", "a1"))
    assert found.render() is not None and found._pending == set()
    pods._handle(pod_event("MODIFIED", "t1", "home", "a1", version="2"))
    assert found._pending == set()
    kept = pods.pods()
    assert kept == [BoundPod("t1", "home", {"team": "a"}, "a1", "uid-home")]


def test_pods_are_watched_only_while_a_role_places_them(
    reporter: tuple[Reporter, StubInformer], monkeypatch: pytest.MonkeyPatch
) -> None:
    found, _ = reporter
    started: list[BoundPods] = []
    monkeypatch.setattr(BoundPods, "start", lambda self: started.append(self))
    current = [placed_snapshot(placement=False)]
    found.source.snapshot = lambda: current[0]  # type: ignore[method-assign]
    found._watch_pods()
    assert found._pods is None and started == []
    current[0] = placed_snapshot()
    found._pending.clear()
    found._watch_pods()
    assert found._pods is not None and started == [found._pods]
    assert found._pending == {"*"}  # every scope judged once the pods are listed
    assert found._pods._selector == (("fieldSelector", "spec.nodeName!="),)
    current[0] = placed_snapshot(placement=False)
    found._pending.clear()
    found._watch_pods()
    assert found._pods is None and found._pending == {"*"}  # their results leave every scope


def test_a_pass_waits_for_the_pods_list_and_says_when_it_fails(
    placing: tuple[Reporter, StubInformer, BoundPods],
) -> None:
    found, _, pods = placing
    pods.synced = False
    assert found.render() is None  # listing: judged once listed, never half
    pods.last_error = "403 Forbidden"
    due = found.render()
    assert due is not None
    (body, _), *_ = [v for k, v in due.items() if k[1] == "" and "clusterpolicy" in k[0]]
    (error,) = [r for r in body["results"] if r["result"] == "error"]
    assert error["rule"] == "audited" and error["resources"] == [{"name": "pods"}]
    assert "403 Forbidden" in error["message"]
