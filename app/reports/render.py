"""The background audit's findings as policy reports: one ``PolicyReport`` per namespace and one
``ClusterPolicyReport`` (``wgpolicyk8s.io/v1alpha2``), or the ``openreports.io/v1alpha1``
``Report``/``ClusterReport``, in the shape Policy Reporter and Kyverno's own reports use.

A result per finding ``audit`` makes (``app.engine.reverse``): an object only admins may still
write (rule ``writable-by-holders``), an object whose labels are in no bucket
(``labels-in-a-bucket``), a role whose permission annotation is invalid
(``valid-annotation``), and a running pod bound to a node outside the pool its bucket is placed
on (``placement``). Objects, roles and placed pods without a finding get a ``pass`` result
each, up to ``max_passes`` a scope (Policy Reporter counts results, not the summary); past it
they are counted in the summary only, which is exact. Every text a result carries that a tenant
shapes (labels, what the bound roles permit, a role's annotation error, why a pod is outside
its pool) is cut, so a result has a bounded size. A scope whose results exceed ``max_results``
or ``max_bytes`` is split into several reports (``label-rbac``, ``label-rbac-2``...), as
Kyverno splits its own.

Each result names its object with its ``uid``: Policy Reporter hashes name and uid into a
result's id, so an object deleted and created again is a new result, not the old one's.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from app.engine.catalog import BUILTIN, Catalog
from app.engine.model import Resource
from app.engine.rbac import RBAC_GROUP, RoleRef, Snapshot
from app.engine.reverse import PODS, BoundPod, Existing, Report

SOURCE = "label-rbac"
POLICY = "label-rbac"
NAME = "label-rbac"
CATEGORY = "Label-based access"
MANAGED_BY = "app.kubernetes.io/managed-by"
# A text a tenant shapes (labels, what bound roles permit, an annotation's error) is cut at
# MAX_TEXT characters in a result, and a whole message at MAX_MESSAGE: with names at most 253
# characters, a result is a few KB at most, however long the annotations and labels it speaks of.
MAX_TEXT = 256
MAX_MESSAGE = 1024
# Results per report, and bytes of results per report (JSON): a report stays under 1 MB, below
# etcd's 1.5 MiB request limit, whatever its results hold (every result is bounded: MAX_TEXT).
MAX_RESULTS = 600
MAX_BYTES = 1_000_000
# Pass results a scope lists at most; the passes past it are counted in the summary only.
MAX_PASSES = 1000
_CATALOG = Catalog(BUILTIN)


@dataclass(frozen=True)
class ReportKind:
    """One report API: its version and the kinds and resources of both scopes."""

    api_version: str
    kind: str
    cluster_kind: str
    resource: str
    cluster_resource: str
    crds: str  # where its CRDs come from: said when they are not installed

    @property
    def group_version(self) -> str:
        return self.api_version


WGPOLICY = ReportKind(
    "wgpolicyk8s.io/v1alpha2",
    "PolicyReport",
    "ClusterPolicyReport",
    "policyreports",
    "clusterpolicyreports",
    "Kyverno ships it; upstream: kyverno/kyverno config/crds/policyreport/",
)
OPENREPORTS = ReportKind(
    "openreports.io/v1alpha1",
    "Report",
    "ClusterReport",
    "reports",
    "clusterreports",
    "Kyverno 1.15+ ships it; upstream: openreports/reports-api config/crd/",
)


@dataclass
class Scope:
    """The results of one namespace ("" for the cluster): its findings, the pass results it
    lists (at most ``max_passes``) and how many checks passed in all."""

    results: list[dict[str, Any]] = field(default_factory=list)
    passed: int = 0
    passes: list[dict[str, Any]] = field(default_factory=list)
    max_passes: int = MAX_PASSES

    def add_pass(self, make: Callable[[], dict[str, Any]]) -> None:
        """Count a pass; list its result while under ``max_passes`` (made only then), one at
        least: a report with passes has a result, so it names its source."""
        self.passed += 1
        if len(self.passes) < max(1, self.max_passes):
            self.passes.append(make())


def _reference(obj: Existing) -> dict[str, str]:
    found = _CATALOG.find(obj.resource)
    ref = {"name": obj.name}
    if obj.uid:
        ref["uid"] = obj.uid
    if found is not None and found.kind:
        ref["kind"] = found.kind
        ref["apiVersion"] = f"{obj.resource.group}/v1" if obj.resource.group else "v1"
    if obj.namespace:
        ref["namespace"] = obj.namespace
    return ref


def _pod_reference(pod: BoundPod) -> dict[str, str]:
    return _reference(Existing(PODS, pod.namespace, pod.name, pod.labels, pod.uid))


def _result(
    rule: str,
    message: str,
    resource: Mapping[str, str],
    severity: str,
    first_seen: Callable[[str], int],
    properties: Mapping[str, str] | None = None,
    outcome: str = "fail",
) -> dict[str, Any]:
    result: dict[str, Any] = {
        "source": SOURCE,
        "policy": POLICY,
        "rule": rule,
        "result": outcome,
        "scored": True,
        "severity": severity,
        "category": CATEGORY,
        "message": cut(message, MAX_MESSAGE),
        "resources": [dict(resource)],
        "timestamp": {"seconds": first_seen(seen_key(outcome, rule, resource)), "nanos": 0},
    }
    if properties:
        result["properties"] = {k: cut(v, MAX_TEXT) for k, v in properties.items()}
    return result


def seen_key(outcome: str, rule: str, resource: Mapping[str, Any]) -> str:
    """What a result's first sighting is remembered by: its outcome, rule and object (the uid
    too: an object created again is a new sighting)."""
    return "/".join(
        [outcome, rule, *(str(resource.get(k, "")) for k in ("kind", "namespace", "name", "uid"))]
    )


def findings(
    snapshot: Snapshot,
    report: Report,
    first_seen: Callable[[str], int],
    max_passes: int = MAX_PASSES,
    role_uid: Callable[[RoleRef], str] = lambda _ref: "",
) -> dict[str, Scope]:
    """Namespace ("" for cluster-scoped) → its results and passes (a role's ``uid`` from
    ``role_uid``, "" when unknown)."""
    scopes: dict[str, Scope] = defaultdict(lambda: Scope(max_passes=max_passes))
    flagged: set[tuple[str, str, str]] = set()
    for obj in report.unbucketed:
        flagged.add((str(obj.resource), obj.namespace, obj.name))
        labels = cut(_labels(obj.labels), MAX_TEXT)
        scopes[obj.namespace].results.append(
            _result(
                "labels-in-a-bucket",
                f"{obj}: no role's permission annotation permits its labels "
                f"({labels}); only admins may write it",
                _reference(obj),
                "high",
                first_seen,
                {"resource": str(obj.resource), "labels": labels},
            )
        )
    for orphan in report.orphans:
        obj = orphan.obj
        if (str(obj.resource), obj.namespace, obj.name) in flagged:
            continue  # in no bucket: that finding says more
        flagged.add((str(obj.resource), obj.namespace, obj.name))
        permitted = "; ".join(dict.fromkeys(
            " and ".join(entry.describe() for entry in entries) for entries in orphan.permitted
        ))  # fmt: skip
        scopes[obj.namespace].results.append(
            _result(
                "writable-by-holders",
                f"{obj}: only holders of unrestricted roles may still write it "
                f"({cut(orphan.why, MAX_TEXT)})",
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
    for found in report.misplaced:
        pod = found.pod
        scopes[pod.namespace].results.append(
            _result(
                "placement",
                f"pod {pod.namespace}/{pod.name}: {cut(found.why, MAX_TEXT)}; delete it to "
                "have it scheduled again within its pool (its controller creates it anew), or "
                "ask an admin to label the node into the pool",
                _pod_reference(pod),
                "high",
                first_seen,
                {"node": pod.node, "labels": _labels(pod.labels)},
            )
        )
    for role in snapshot.roles.values():
        scope = scopes[role.ref.namespace]
        ref = {"apiVersion": f"{RBAC_GROUP}/v1", "kind": role.ref.kind, "name": role.ref.name}
        if role.ref.namespace:
            ref["namespace"] = role.ref.namespace
        if uid := role_uid(role.ref):
            ref["uid"] = uid
        if role.error is None:
            if role.permissions is not None:
                scope.add_pass(lambda ref=ref, role=role: _result(  # type: ignore[misc]
                    "valid-annotation", f"{role.ref}: its permission annotation is valid",
                    ref, "high", first_seen, outcome="pass"))  # fmt: skip
            continue
        scope.results.append(
            _result(
                "valid-annotation",
                f"{role.ref} grants nothing through its label permissions: "
                f"{cut(role.error, MAX_TEXT)}",
                ref,
                "high",
                first_seen,
            )
        )
    return dict(scopes)


def unaudited(resource: Resource, why: str, first_seen: Callable[[str], int]) -> dict[str, Any]:
    """An ``error`` result: the objects of ``resource`` cannot be listed, so are not audited."""
    return _result(
        "audited",
        f"the objects of {resource} are not audited: they cannot be listed "
        f"({cut(why, MAX_TEXT)}); grant the reporter list and watch on them",
        {"name": str(resource)},
        "medium",
        first_seen,
        {"resource": str(resource)},
        outcome="error",
    )


def count_passes(
    objects: Iterable[Existing],
    report: Report,
    scopes: dict[str, Scope],
    first_seen: Callable[[str], int],
    max_passes: int = MAX_PASSES,
) -> None:
    """A pass for every audited object without a finding, and for every pod judged by where it
    runs that runs within its pool, in its namespace's scope."""
    flagged = {(o.obj.resource, o.obj.namespace, o.obj.name) for o in report.orphans}
    flagged |= {(o.resource, o.namespace, o.name) for o in report.unbucketed}
    for obj in objects:
        if (obj.resource, obj.namespace, obj.name) in flagged:
            continue
        scope = scopes.setdefault(obj.namespace, Scope(max_passes=max_passes))
        scope.add_pass(lambda obj=obj: _result(  # type: ignore[misc]
            "labels-in-a-bucket",
            f"{obj}: a bound role may write it within its label limits, or no role restricts "
            "it", _reference(obj), "high", first_seen, outcome="pass"))  # fmt: skip
    for pod in report.placed:
        scope = scopes.setdefault(pod.namespace, Scope(max_passes=max_passes))
        scope.add_pass(lambda pod=pod: _result(  # type: ignore[misc]
            "placement", f'pod {pod.namespace}/{pod.name} runs on node "{pod.node}", within its '
            "pool", _pod_reference(pod), "high", first_seen, outcome="pass"))  # fmt: skip


def cut(text: str, limit: int) -> str:
    """``text``, cut to ``limit`` characters (the last three "...") when longer."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _labels(labels: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or "<none>"


def _summary(results: Iterable[Mapping[str, Any]], unlisted: int) -> dict[str, int]:
    counts = {"pass": unlisted, "fail": 0, "warn": 0, "error": 0, "skip": 0}
    for result in results:
        counts[result["result"]] += 1
    return counts


def _size(result: Mapping[str, Any]) -> int:
    """A result's bytes as JSON, ASCII-escaped: never fewer than the API server stores."""
    return len(json.dumps(result, separators=(",", ":"))) + 1


def chunks(
    results: list[dict[str, Any]], max_results: int, max_bytes: int
) -> list[list[dict[str, Any]]]:
    """``results`` in order, cut into runs of at most ``max_results`` and ``max_bytes``."""
    found: list[list[dict[str, Any]]] = [[]]
    size = 0
    for result in results:
        length = _size(result)
        if found[-1] and (len(found[-1]) >= max_results or size + length > max_bytes):
            found.append([])
            size = 0
        found[-1].append(result)
        size += length
    return found


def reports(
    namespace: str,
    scope: Scope,
    kind: ReportKind = WGPOLICY,
    max_results: int = MAX_RESULTS,
    max_bytes: int = MAX_BYTES,
) -> list[dict[str, Any]]:
    """The reports of one scope: findings first, then the passes it lists; split past
    ``max_results`` results or ``max_bytes`` bytes of results. Each report's summary counts its
    own results; the first one's also counts the passes no result lists, so the summaries add
    up to every check made. None for a scope with nothing to say (no report is ever empty, so
    every one names its ``source`` in its results, where Policy Reporter reads it)."""
    findings = sorted(scope.results, key=lambda r: (r["rule"], str(r["resources"])))
    passes = sorted(scope.passes, key=lambda r: (r["rule"], str(r["resources"])))
    listed = findings + passes
    if not listed:  # nothing found, nothing passed (a scope with passes lists one at least)
        return []
    found = []
    for index, chunk in enumerate(chunks(listed, max_results, max_bytes)):
        name = NAME if index == 0 else f"{NAME}-{index + 1}"
        metadata: dict[str, Any] = {"name": name, "labels": {MANAGED_BY: SOURCE}}
        if namespace:
            metadata["namespace"] = namespace
        report: dict[str, Any] = {
            "apiVersion": kind.api_version,
            "kind": kind.kind if namespace else kind.cluster_kind,
            "metadata": metadata,
            "summary": _summary(chunk, scope.passed - len(passes) if index == 0 else 0),
            "results": chunk,
        }
        if kind is OPENREPORTS:
            report["source"] = SOURCE
        found.append(report)
    return found
