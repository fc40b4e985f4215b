"""The background audit's findings as report objects: a result per finding, passes in the
summary, one report per namespace, split past the size limit."""

from __future__ import annotations

import json

import pytest

from app.engine.model import Resource
from app.engine.reverse import Existing, audit
from app.reports.render import (
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
    Existing(CONFIGMAPS, "t1", "ok", {"team": "a"}),
    Existing(CONFIGMAPS, "t1", "stray", {"team": "z"}),
]


def scopes() -> dict[str, Scope]:
    report = audit(SNAPSHOT, OBJECTS)
    found = findings(SNAPSHOT, report, lambda key: 1700000000)
    count_passes(OBJECTS, report, found)
    return found


def test_a_result_per_finding_and_passes_in_the_summary() -> None:
    (t1,) = reports("t1", scopes()["t1"])
    assert (t1["apiVersion"], t1["kind"], t1["metadata"]["name"]) == (
        "wgpolicyk8s.io/v1alpha2", "PolicyReport", "label-rbac")  # fmt: skip
    by_name = {r["resources"][0]["name"]: r for r in t1["results"]}
    assert {n: r["rule"] for n, r in by_name.items()} == {
        "stray": "labels-in-a-bucket",
        "broken": "valid-annotation",
    }
    assert by_name["broken"]["resources"][0]["kind"] == "Role"
    assert "not valid JSON" in by_name["broken"]["message"]
    assert by_name["stray"]["timestamp"] == {"seconds": 1700000000, "nanos": 0}
    # ok (an object) and team-a (a valid annotation) pass; stray and broken fail.
    assert t1["summary"] == {"pass": 2, "fail": 2, "warn": 0, "error": 0, "skip": 0}


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
    pytest.param(0, 2, [0], id="empty"),
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


def test_the_cluster_scope_and_openreports_kinds() -> None:
    (cluster,) = reports("", Scope(), OPENREPORTS)
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
    objects = [Existing(CONFIGMAPS, namespace, name, labels | {"team": "b"})]
    found = findings(snap, audit(snap, objects), lambda key: 0)
    (result,) = found[namespace].results
    assert result["properties"]["labels"].endswith("...")
    full = reports(namespace, Scope([result] * MAX_RESULTS, 10**9))
    assert len(full) == 1 and len(json.dumps(full[0])) < 1_000_000


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
