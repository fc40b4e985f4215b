"""The background audit's findings as report objects: a result per finding and per passed
check (bounded, the summary exact), one report per namespace, split past a count and a size;
read as Policy Reporter reads them (its result ids, its counts, its source)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.engine.model import Resource
from app.engine.rbac import Snapshot
from app.engine.reverse import BoundPod, Existing, audit
from app.reports.render import (
    MAX_BYTES,
    MAX_MESSAGE,
    MAX_RESULTS,
    OPENREPORTS,
    WGPOLICY,
    Scope,
    count_passes,
    findings,
    reports,
)
from tests.support import binding, role, rule, snapshot

CONFIGMAPS = Resource("", "configmaps")
SNAPSHOT = snapshot(
    role("team-a", "t1", [rule("create update delete", "configmaps")],
         {"configmaps": {"team": ["a"]}}),
    role("broken", "t1", [], "{not json"),
    binding("alice", "team-a", "User:alice", namespace="t1"),
)  # fmt: skip
OBJECTS = [
    Existing(CONFIGMAPS, "t1", "ok", {"team": "a"}, uid="uid-ok"),
    Existing(CONFIGMAPS, "t1", "stray", {"team": "z"}, uid="uid-stray"),
]


def size(obj: Any) -> int:
    """Bytes as the API server stores JSON (compact)."""
    return len(json.dumps(obj, separators=(",", ":")))


def scopes(objects: list[Existing] = OBJECTS, max_passes: int = 1000) -> dict[str, Scope]:
    report = audit(SNAPSHOT, objects)
    found = findings(SNAPSHOT, report, lambda key: 1700000000, max_passes)
    count_passes(objects, report, found, lambda key: 1700000000, max_passes)
    return found


def test_a_result_per_finding_and_per_passed_check() -> None:
    (t1,) = reports("t1", scopes()["t1"])
    assert (t1["apiVersion"], t1["kind"], t1["metadata"]["name"]) == (
        "wgpolicyk8s.io/v1alpha2", "PolicyReport", "label-rbac")  # fmt: skip
    by_name = {r["resources"][0]["name"]: r for r in t1["results"]}
    assert {n: (r["rule"], r["result"]) for n, r in by_name.items()} == {
        "stray": ("labels-in-a-bucket", "fail"),
        "broken": ("valid-annotation", "fail"),
        "ok": ("labels-in-a-bucket", "pass"),
        "team-a": ("valid-annotation", "pass"),
    }
    assert by_name["broken"]["resources"][0]["kind"] == "Role"
    assert "not valid JSON" in by_name["broken"]["message"]
    assert by_name["stray"]["timestamp"] == {"seconds": 1700000000, "nanos": 0}
    assert by_name["stray"]["resources"][0]["uid"] == "uid-stray"
    assert by_name["ok"]["resources"][0]["uid"] == "uid-ok"
    # ok (an object) and team-a (a valid annotation) pass; stray and broken fail.
    assert t1["summary"] == {"pass": 2, "fail": 2, "warn": 0, "error": 0, "skip": 0}
    assert [r["result"] for r in t1["results"]] == ["fail", "fail", "pass", "pass"]


def test_an_orphan_says_what_the_bound_roles_permit() -> None:
    objects = [Existing(CONFIGMAPS, "t1", "theirs", {"team": "b"})]
    snap = snapshot(
        role("team-a", "t1", [rule("update", "configmaps")], {"configmaps": {"team": ["a"]}}),
        role("team-b", "t1", [rule("update", "configmaps")], {"configmaps": {"team": ["b"]}}),
        binding("alice", "team-a", "User:alice", namespace="t1"),
    )
    found = findings(snap, audit(snap, objects), lambda key: 0)
    (result,) = found["t1"].results
    assert result["rule"] == "writable-by-holders"
    assert result["properties"]["permitted"] == "team in [a]"


@pytest.mark.parametrize(("results", "limit", "sizes"), [
    pytest.param(1, 2, [1], id="one"),
    pytest.param(2, 2, [2], id="at-the-limit"),
    pytest.param(5, 2, [2, 2, 1], id="split"),
])  # fmt: skip
def test_a_scope_past_the_limit_is_split(results: int, limit: int, sizes: list[int]) -> None:
    template = scopes()["t1"].results[0]
    scope = Scope([{**template, "resources": [{"name": f"o{i}"}]} for i in range(results)], 7)
    found = reports("t1", scope, WGPOLICY, limit)
    assert [len(r["results"]) for r in found] == sizes
    assert [r["metadata"]["name"] for r in found] == ["label-rbac", "label-rbac-2",
                                                     "label-rbac-3"][: len(sizes)]  # fmt: skip
    assert [r["summary"]["pass"] for r in found] == [7] + [0] * (len(sizes) - 1)
    assert sum(r["summary"]["fail"] for r in found) == results


@pytest.mark.parametrize(("count", "fit", "sizes"), [
    pytest.param(10, 20.0, [10], id="under-the-budget"),
    pytest.param(10, 3.5, [3, 3, 3, 1], id="split-by-bytes"),
    pytest.param(3, 0.5, [1, 1, 1], id="one-result-past-the-budget-alone"),
])  # fmt: skip
def test_a_scope_past_the_byte_budget_is_split(count: int, fit: float, sizes: list[int]) -> None:
    """``fit``: how many results the byte budget holds."""
    template = scopes()["t1"].results[0]
    scope = Scope([{**template, "resources": [{"name": f"o{i:03d}"}]} for i in range(count)])
    one = len(json.dumps(scope.results[0], separators=(",", ":"))) + 1
    budget = int(one * fit)
    found = reports("t1", scope, WGPOLICY, 600, budget)
    assert [len(r["results"]) for r in found] == sizes
    for report in found:
        if len(report["results"]) > 1:
            assert len(json.dumps(report["results"], separators=(",", ":"))) <= budget


def test_an_empty_scope_has_no_report() -> None:
    """Policy Reporter reads a report's source from its first result: no report is empty."""
    assert reports("t1", Scope()) == []
    assert reports("", Scope(), OPENREPORTS) == []


@pytest.mark.parametrize(("objects", "most", "listed"), [
    pytest.param(3, 10, 4, id="all-listed"),
    pytest.param(30, 10, 10, id="bounded"),
    pytest.param(30, 1, 1, id="one"),
])  # fmt: skip
def test_passes_past_the_bound_are_counted_in_the_summary(
    objects: int, most: int, listed: int
) -> None:
    compliant = [Existing(CONFIGMAPS, "t1", f"ok{i}", {"team": "a"}) for i in range(objects)]
    scope = scopes(compliant, most)["t1"]
    found = reports("t1", scope)
    passes = [r for report in found for r in report["results"] if r["result"] == "pass"]
    assert len(passes) == listed  # the team-a role's pass included
    # The summaries are exact: every object and the valid role passed, listed or not.
    assert sum(r["summary"]["pass"] for r in found) == objects + 1


def test_the_cluster_scope_and_openreports_kinds() -> None:
    (cluster,) = reports("", Scope(passed=1, passes=[scopes()["t1"].passes[0]]), OPENREPORTS)
    assert (cluster["apiVersion"], cluster["kind"], cluster["source"]) == (
        "openreports.io/v1alpha1", "ClusterReport", "label-rbac")  # fmt: skip
    assert "namespace" not in cluster["metadata"]


def test_a_full_report_stays_below_the_object_size_limit() -> None:
    """The longest names Kubernetes allows and 256 KiB of labels: still a small result."""
    labels = {f"k{i}": "v" * 60 for i in range(4000)}
    name, namespace = "n" * 253, "s" * 63
    snap = snapshot(
        role("team-a", namespace, [rule("update", "configmaps")], {"configmaps": {"team": ["a"]}}),
        binding("alice", "team-a", "User:alice", namespace=namespace),
    )  # an orphan: its result carries what the bound roles permit too
    uid = "0" * 36
    objects = [Existing(CONFIGMAPS, namespace, name, labels | {"team": "b"}, uid=uid)]
    found = findings(snap, audit(snap, objects), lambda key: 0)
    (result,) = found[namespace].results
    assert result["properties"]["labels"].endswith("...")
    assert len(json.dumps(result)) < 2_500
    full = reports(namespace, Scope([result] * MAX_RESULTS, 10**9))
    # Each report (split by count or bytes, whichever comes first) under etcd's 1.5 MiB.
    assert all(size(r) < MAX_BYTES + 2_000 for r in full)
    assert sum(r["summary"]["fail"] for r in full) == MAX_RESULTS


# A role at the annotation limits: 4 label keys of 64 values each (256 a role), every key and
# value as long as Kubernetes allows a label's.
KEYS = [f"example.com/{n}" + "k" * 62 for n in range(4)]


def long_values(role: int, key: int) -> list[str]:
    return [f"{role}{key}{i:02d}" + "v" * 59 for i in range(64)]


def narrow_roles(namespace: str, roles: int) -> list[tuple[str, dict[str, Any]]]:
    """A tenant admin's narrower roles, each with long literal values, bound to her, and a
    bucket no bound role holds (an unbound role's): her objects there are orphans."""
    items = [
        role(
            f"narrow-{n}",
            namespace,
            [rule("update", "configmaps")],
            {"configmaps": {k: long_values(n, i) for i, k in enumerate(KEYS)}},
        )
        for n in range(roles)
    ]
    items += [
        binding(f"narrow-{n}", f"narrow-{n}", "User:alice", namespace=namespace)
        for n in range(roles)
    ]
    items.append(
        role(
            "elsewhere", namespace, [rule("update", "configmaps")], {"configmaps": {"team": ["b"]}}
        )
    )
    return items  # fmt: skip


@pytest.mark.parametrize("roles", [pytest.param(1, id="one-role"), pytest.param(6, id="six")])
def test_orphans_of_many_long_roles_stay_bounded(roles: int) -> None:
    """Each orphan's result once spelled out every bound role's entries twice, uncut: six
    roles made a result of MBs and a report the API server refused. Every text is cut now, and
    the reports split by bytes stay under the budget."""
    snap = snapshot(*narrow_roles("t9", roles))
    assert not [r.error for r in snap.roles.values() if r.error]  # within every limit
    objects = [Existing(CONFIGMAPS, "t9", f"cm-{i:03d}", {"team": "b"}) for i in range(700)]
    scope = findings(snap, audit(snap, objects), lambda key: 0)["t9"]
    orphans = [r for r in scope.results if r["rule"] == "writable-by-holders"]
    assert len(orphans) == 700
    assert max(len(json.dumps(r)) for r in orphans) < 2_000
    assert all(r["properties"]["permitted"].endswith("...") for r in orphans)
    found = reports("t9", scope)
    assert all(size(r) < MAX_BYTES + 2_000 for r in found)
    assert sum(r["summary"]["fail"] for r in found) == 700


def test_a_role_error_is_cut() -> None:
    """An invalid annotation's error may quote the annotation: cut like every tenant text."""
    snap = snapshot(role("broken", "t1", [], '{"configmaps": {"team": ["' + "x" * 300_000))
    (result,) = findings(snap, audit(snap, []), lambda key: 0)["t1"].results
    assert result["rule"] == "valid-annotation" and len(result["message"]) <= 1024


def test_an_audit_cache_serves_one_snapshot_only(monkeypatch: pytest.MonkeyPatch) -> None:
    from app.engine import reverse

    cache = reverse.AuditCache()
    first = audit(SNAPSHOT, OBJECTS, cache=cache)
    writers = cache.writers
    again = audit(SNAPSHOT, OBJECTS, cache=cache)
    assert cache.writers is writers  # the same snapshot: its answers are kept
    assert [o.obj for o in again.orphans] == [o.obj for o in first.orphans]
    other = snapshot(role("team-a", "t1", [rule("update", "configmaps")], None))
    assert audit(other, OBJECTS, cache=cache).orphans == []  # unrestricted now: nothing found
    assert cache.writers is not writers and cache.snapshot is other
    monkeypatch.setattr(reverse, "MAX_CACHED", 0)
    audit(other, OBJECTS, cache=cache)
    assert cache.bucketed and cache.writers is not None
    kept = cache.writers
    audit(other, OBJECTS, cache=cache)
    assert cache.writers is not kept  # past the bound: dropped and computed again


# -- Pods running outside the pool their bucket is placed on (rule ``placement``) ----------------

POOL = "node-restriction.kubernetes.io/pool"


def pool_node(name: str, pool: str) -> tuple[str, dict[str, Any]]:
    meta = {"name": name, "uid": f"uid-{name}", "labels": {POOL: pool}}
    return ("Node", {"apiVersion": "v1", "kind": "Node", "metadata": meta})


def placed(placement: dict[str, Any] | None = None) -> Snapshot:
    """Nodes a1 (pool a) and b1 (pool b); t1's team=a pods placed on pool a."""
    return snapshot(
        pool_node("a1", "a"),
        pool_node("b1", "b"),
        role("team-a", "t1", [rule("*", "pods")], {"pods": {"team": ["a"]}},
             placement=placement or {"nodeLabels": {POOL: ["a"]}}),
        binding("alice", "team-a", "User:alice", namespace="t1"),
    )  # fmt: skip


def pod_on(name: str, node: str, team: str = "a", **labels: str) -> BoundPod:
    return BoundPod("t1", name, {"team": team, **labels}, node, uid=f"uid-{name}")


def placement_results(snap: Snapshot, pods: list[BoundPod], most: int = 1000) -> list[Any]:
    report = audit(snap, [], pods=pods)
    found = findings(snap, report, lambda key: 0, most)
    count_passes([], report, found, lambda key: 0, most)
    scope = found.get("t1", Scope())
    return [r for r in scope.results + scope.passes if r["rule"] == "placement"]


@pytest.mark.parametrize(("pod", "outcome", "says"), [
    pytest.param(pod_on("stray", "b1"), "fail", 'node "b1" is outside its pool', id="other-pool"),
    pytest.param(pod_on("lost", "gone"), "fail", 'node "gone" is not known', id="unknown-node"),
    pytest.param(pod_on("home", "a1"), "pass", 'runs on node "a1", within its pool', id="placed"),
    pytest.param(pod_on("loose", "b1", "z"), None, "", id="no-bucket-holds-it"),
])  # fmt: skip
def test_a_pod_is_judged_by_where_it_runs(pod: BoundPod, outcome: str | None, says: str) -> None:
    results = placement_results(placed(), [pod])
    if outcome is None:
        assert results == []
        return
    (result,) = results
    assert result["result"] == outcome and result["severity"] == "high"
    assert result["resources"] == [{"apiVersion": "v1", "kind": "Pod", "name": pod.name,
                                    "namespace": "t1", "uid": pod.uid}]  # fmt: skip
    assert says in result["message"]
    if outcome == "fail":  # what the tenant can do about it
        assert result["message"].startswith(f"pod t1/{pod.name}: {says}")
        assert "delete it to have it scheduled again within its pool" in result["message"]
        assert result["properties"] == {"node": pod.node, "labels": "team=a"}


def test_a_misplaced_pods_texts_are_cut() -> None:
    """What a tenant shapes (a pod's labels) and an admin's long placement: a bounded result."""
    many = {f"k{i}": "v" * 60 for i in range(2000)}
    long_pool = {"nodeLabels": {POOL: [f"{i:03d}" + "p" * 59 for i in range(64)]}}
    (result,) = placement_results(placed(long_pool), [pod_on("stray", "b1", **many)])
    assert result["result"] == "fail" and len(result["message"]) <= MAX_MESSAGE
    assert "..." in result["message"] and result["properties"]["labels"].endswith("...")
    assert len(json.dumps(result)) < 2_500


@pytest.mark.parametrize(("pods", "most", "listed"), [
    pytest.param(3, 10, 3, id="all-listed"),
    pytest.param(30, 10, 9, id="bounded"),  # the team-a role's pass is listed first
])  # fmt: skip
def test_placed_pods_pass_within_the_pass_bound(pods: int, most: int, listed: int) -> None:
    snap = placed()
    report = audit(snap, [], pods=[pod_on(f"p{i:02d}", "a1") for i in range(pods)])
    found = findings(snap, report, lambda key: 0, most)
    count_passes([], report, found, lambda key: 0, most)
    reported = reports("t1", found["t1"])
    passes = [r for r in reported for r in r["results"] if r["rule"] == "placement"]
    assert len(passes) == listed and {r["result"] for r in passes} == {"pass"}
    assert sum(r["summary"]["pass"] for r in reported) == pods + 1  # exact: every pod, the role
