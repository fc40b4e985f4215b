"""The background audit's findings as policy reports: one ``PolicyReport`` per namespace and one
``ClusterPolicyReport`` (``wgpolicyk8s.io/v1alpha2``), or the ``openreports.io/v1alpha1``
``Report``/``ClusterReport``, in the shape Policy Reporter and Kyverno's own reports use.

A result per finding ``audit`` makes (``app.engine.reverse``): an object only admins may still
write (rule ``writable-by-holders``), an object whose labels are in no bucket
(``labels-in-a-bucket``), and a role whose permission annotation is invalid
(``valid-annotation``). Objects and roles without a finding are counted as ``pass`` in the
summary only, so a report's size follows its findings, not the namespace's size. A scope with
more results than ``max_results`` is split into several reports (``label-rbac``,
``label-rbac-2``...), as Kyverno splits its own.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from app.engine.catalog import BUILTIN, Catalog
from app.engine.model import Resource
from app.engine.rbac import RBAC_GROUP, Snapshot
from app.engine.reverse import Existing, Report

SOURCE = "label-rbac"
POLICY = "label-rbac"
NAME = "label-rbac"
# Results per report: at the longest names and labels a result is under 1.6 KB, so a report
# stays under 1 MB, below etcd's 1.5 MiB object limit.
MAX_RESULTS = 600
_CATALOG = Catalog(BUILTIN)


@dataclass(frozen=True)
class ReportKind:
    """One report API: its version and the kinds and resources of both scopes."""

    api_version: str
    kind: str
    cluster_kind: str
    resource: str
    cluster_resource: str

    @property
    def group_version(self) -> str:
        return self.api_version


WGPOLICY = ReportKind(
    "wgpolicyk8s.io/v1alpha2",
    "PolicyReport",
    "ClusterPolicyReport",
    "policyreports",
    "clusterpolicyreports",
)
OPENREPORTS = ReportKind(
    "openreports.io/v1alpha1", "Report", "ClusterReport", "reports", "clusterreports"
)


@dataclass
class Scope:
    """The results of one namespace ("" for the cluster) and how many checks passed."""

    results: list[dict[str, Any]] = field(default_factory=list)
    passed: int = 0


def _reference(obj: Existing) -> dict[str, str]:
    found = _CATALOG.find(obj.resource)
    ref = {"name": obj.name}
    if found is not None and found.kind:
        ref["kind"] = found.kind
        ref["apiVersion"] = f"{obj.resource.group}/v1" if obj.resource.group else "v1"
    if obj.namespace:
        ref["namespace"] = obj.namespace
    return ref


def _result(
    rule: str,
    message: str,
    resource: Mapping[str, str],
    severity: str,
    first_seen: Callable[[str], int],
    properties: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    key = f"{rule}/{resource.get('kind', '')}/{resource.get('namespace', '')}/{resource['name']}"
    result: dict[str, Any] = {
        "source": SOURCE,
        "policy": POLICY,
        "rule": rule,
        "result": "fail",
        "scored": True,
        "severity": severity,
        "category": "Label-based access",
        "message": message,
        "resources": [dict(resource)],
        "timestamp": {"seconds": first_seen(key), "nanos": 0},
    }
    if properties:
        result["properties"] = dict(properties)
    return result


def findings(
    snapshot: Snapshot, report: Report, first_seen: Callable[[str], int]
) -> dict[str, Scope]:
    """Namespace ("" for cluster-scoped) → its results and passes."""
    scopes: dict[str, Scope] = defaultdict(Scope)
    flagged: set[tuple[str, str, str]] = set()
    for obj in report.unbucketed:
        flagged.add((str(obj.resource), obj.namespace, obj.name))
        scopes[obj.namespace].results.append(
            _result(
                "labels-in-a-bucket",
                f"{obj}: no role's permission annotation permits its labels "
                f"({_labels(obj.labels)}); only admins may write it",
                _reference(obj),
                "high",
                first_seen,
                {"resource": str(obj.resource), "labels": _labels(obj.labels)},
            )
        )
    for orphan in report.orphans:
        obj = orphan.obj
        if (str(obj.resource), obj.namespace, obj.name) in flagged:
            continue  # in no bucket: that finding says more
        flagged.add((str(obj.resource), obj.namespace, obj.name))
        permitted = "; ".join(
            " and ".join(entry.describe() for entry in entries) for entries in orphan.permitted
        )
        scopes[obj.namespace].results.append(
            _result(
                "writable-by-holders",
                f"{obj}: only holders of unrestricted roles may still write it ({orphan.why})",
                _reference(obj),
                "medium",
                first_seen,
                {
                    "resource": str(obj.resource),
                    "labels": _labels(obj.labels),
                    "permitted": permitted or "no bound role holds its bucket",
                },
            )
        )
    for role in snapshot.roles.values():
        scope = scopes[role.ref.namespace]
        if role.error is None:
            scope.passed += role.permissions is not None
            continue
        ref = {"apiVersion": f"{RBAC_GROUP}/v1", "kind": role.ref.kind, "name": role.ref.name}
        if role.ref.namespace:
            ref["namespace"] = role.ref.namespace
        scope.results.append(
            _result(
                "valid-annotation",
                f"{role.ref} grants nothing through its label permissions: {role.error}",
                ref,
                "high",
                first_seen,
            )
        )
    return dict(scopes)


def unaudited(resource: Resource, why: str, first_seen: Callable[[str], int]) -> dict[str, Any]:
    """An ``error`` result: the objects of ``resource`` cannot be listed, so are not audited."""
    result = _result(
        "audited",
        f"the objects of {resource} are not audited: they cannot be listed ({why}); grant the "
        "reporter list and watch on them",
        {"name": str(resource)},
        "medium",
        first_seen,
        {"resource": str(resource)},
    )
    result["result"] = "error"
    return result


def count_passes(objects: Iterable[Existing], report: Report, scopes: dict[str, Scope]) -> None:
    """Add a pass for every audited object without a finding, to its namespace."""
    flagged = {(o.obj.resource, o.obj.namespace, o.obj.name) for o in report.orphans}
    flagged |= {(o.resource, o.namespace, o.name) for o in report.unbucketed}
    for obj in objects:
        if (obj.resource, obj.namespace, obj.name) not in flagged:
            scopes.setdefault(obj.namespace, Scope()).passed += 1


# Labels as a result shows them, cut at this many characters: an object may carry up to 256 KiB
# of labels, and a report of ``max_results`` results must stay far below etcd's 1.5 MiB.
MAX_LABELS_TEXT = 256


def _labels(labels: Mapping[str, str]) -> str:
    text = ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or "<none>"
    return text if len(text) <= MAX_LABELS_TEXT else text[: MAX_LABELS_TEXT - 3] + "..."


def _summary(results: Iterable[Mapping[str, Any]], passed: int) -> dict[str, int]:
    counts = {"pass": passed, "fail": 0, "warn": 0, "error": 0, "skip": 0}
    for result in results:
        counts[result["result"]] += 1
    return counts


def reports(
    namespace: str, scope: Scope, kind: ReportKind = WGPOLICY, max_results: int = MAX_RESULTS
) -> list[dict[str, Any]]:
    """The reports of one scope: split past ``max_results``; the passes go in the first."""
    results = sorted(scope.results, key=lambda r: (r["rule"], str(r["resources"])))
    chunks = [results[i : i + max_results] for i in range(0, len(results), max_results)] or [[]]
    found = []
    for index, chunk in enumerate(chunks):
        name = NAME if index == 0 else f"{NAME}-{index + 1}"
        metadata: dict[str, Any] = {
            "name": name,
            "labels": {"app.kubernetes.io/managed-by": SOURCE},
        }
        if namespace:
            metadata["namespace"] = namespace
        report: dict[str, Any] = {
            "apiVersion": kind.api_version,
            "kind": kind.kind if namespace else kind.cluster_kind,
            "metadata": metadata,
            "summary": _summary(chunk, scope.passed if index == 0 else 0),
            "results": chunk,
        }
        if kind is OPENREPORTS:
            report["source"] = SOURCE
        found.append(report)
    return found
