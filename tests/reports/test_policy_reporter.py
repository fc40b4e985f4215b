"""The reports as Policy Reporter reads them, from its public data model (kyverno/policy-reporter):

- a result's id is FNV-1a (64 bit) over the first resource's name and uid, then the result's
  policy, rule, result, category and message (``GetID`` of its v1alpha2 result, the default id
  generator), unless ``properties.resultID`` is set; results with one id are one result;
- a report's ``source`` is its first result's (``GetSource``): an empty report has none;
- its counts, namespace and resource views are built from the results (by source, policy, rule,
  result), not from ``summary``.

The id is computed here from the fields it hashes, pinned to the upstream test's own vector.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import pytest

from app.engine.model import Resource
from app.engine.reverse import Existing, audit
from app.reports.render import Scope, count_passes, findings, reports
from tests.support import binding, role, rule, snapshot

_OFFSET, _PRIME = 14695981039346656037, 1099511628211


def fnv1a(*parts: str) -> int:
    """FNV-1a over the parts' bytes, one after the other (fasthash's ``AddString64``)."""
    value = _OFFSET
    for byte in "".join(parts).encode():
        value = ((value ^ byte) * _PRIME) % 2**64
    return value


def result_id(result: Mapping[str, Any]) -> str:
    """Policy Reporter's id of a result (its default generator)."""
    properties = result.get("properties") or {}
    if "resultID" in properties:
        return str(properties["resultID"])
    parts: list[str] = []
    if result.get("resources"):
        ref = result["resources"][0]
        parts += [ref.get("name", ""), ref.get("uid", "")]
    parts += [str(result.get(k, "")) for k in ("policy", "rule", "result", "category", "message")]
    return str(fnv1a(*parts))


def source(report: Mapping[str, Any]) -> str:
    results = report.get("results") or []
    return str(results[0].get("source", "")) if results else ""


def counted(found: Iterable[Mapping[str, Any]]) -> Counter[tuple[str, str]]:
    """(source, result) → results, each id once, as Policy Reporter counts."""
    seen: dict[str, tuple[str, str]] = {}
    for report in found:
        for result in report.get("results") or []:
            seen[result_id(result)] = (str(result["source"]), str(result["result"]))
    return Counter(seen.values())


CONFIGMAPS = Resource("", "configmaps")
NAMESPACES = Resource("", "namespaces")
SNAPSHOT = snapshot(
    role("team-a", "t1", [rule("update", "configmaps")], {"configmaps": {"team": ["a"]}}),
    binding("alice", "team-a", "User:alice", namespace="t1"),
    role("platform", "", [rule("update", "*")], {"*": {"tier": ["platform"]}}),
    binding("ops", "platform", "Group:platform"),
)


def scopes(objects: list[Existing], when: int = 1700000000) -> dict[str, Scope]:
    report = audit(SNAPSHOT, objects)
    found = findings(SNAPSHOT, report, lambda key: when, role_uid=lambda ref: f"uid-{ref.name}")
    count_passes(objects, report, found, lambda key: when)
    return found


def test_the_id_is_the_one_policy_reporter_computes() -> None:
    """The upstream test's vector: a Pod ``test`` and nothing else."""
    assert result_id({"resources": [{"name": "test", "kind": "Pod"}]}) == "18007334074686647077"


def test_an_object_created_again_is_a_new_result() -> None:
    first = Existing(CONFIGMAPS, "t1", "cm", {"team": "z"}, uid="uid-1")
    again = Existing(CONFIGMAPS, "t1", "cm", {"team": "z"}, uid="uid-2")
    (before,) = reports("t1", scopes([first])["t1"])
    (later,) = reports("t1", scopes([first], when=1800000000)["t1"])
    (after,) = reports("t1", scopes([again])["t1"])

    def cm(report: Mapping[str, Any]) -> str:
        (found,) = [r for r in report["results"] if r["resources"][0]["name"] == "cm"]
        return result_id(found)

    assert cm(before) == cm(later)  # the same object: the same result, whenever rendered
    assert cm(before) != cm(after)  # created again: another result, not merged with the old


def test_passes_are_counted_from_results_and_every_report_names_its_source() -> None:
    objects = [Existing(CONFIGMAPS, "t1", f"ok{i}", {"team": "a"}, uid=f"u{i}") for i in range(5)]
    objects.append(Existing(CONFIGMAPS, "t1", "stray", {"team": "z"}, uid="u-stray"))
    found = [r for ns, scope in scopes(objects).items() for r in reports(ns, scope)]
    counts = counted(found)
    # 5 compliant configmaps and team-a's valid annotation in t1, platform's in the cluster.
    assert counts[("label-rbac", "pass")] == 7
    assert counts[("label-rbac", "fail")] == 1
    assert sum(r["summary"]["pass"] for r in found) == 7  # the summary agrees
    assert {source(r) for r in found} == {"label-rbac"}
    ids = [result_id(r) for report in found for r in report["results"]]
    assert len(ids) == len(set(ids))  # no two results merge


@pytest.mark.parametrize(("objects", "passes", "fails"), [
    pytest.param([], 1, 0, id="a-valid-clusterrole"),
    pytest.param([Existing(NAMESPACES, "", "ops", {"tier": "platform"}, uid="u-ns")], 2, 0,
                 id="a-compliant-namespace"),
    pytest.param([Existing(NAMESPACES, "", "bare", {}, uid="u-bare")], 1, 1,
                 id="an-unlabeled-namespace"),
])  # fmt: skip
def test_the_cluster_report_counts_cluster_scoped_passes(
    objects: list[Existing], passes: int, fails: int
) -> None:
    (cluster,) = reports("", scopes(objects)[""])
    assert cluster["kind"] == "ClusterPolicyReport"
    assert counted([cluster]) == Counter({("label-rbac", "pass"): passes,
                                          ("label-rbac", "fail"): fails}) - Counter()  # fmt: skip
    assert cluster["summary"]["pass"] == passes
    (platform,) = [r for r in cluster["results"] if r["resources"][0]["kind"] == "ClusterRole"]
    assert platform["result"] == "pass" and platform["rule"] == "valid-annotation"
    assert platform["resources"][0] == {"apiVersion": "rbac.authorization.k8s.io/v1",
                                        "kind": "ClusterRole", "name": "platform",
                                        "uid": "uid-platform"}  # fmt: skip
