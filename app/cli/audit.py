"""``audit`` and ``who-can`` for people and machines: the commands, the existing objects to
judge (from a manifests directory or a cluster's API) and the output (tables, or
``-o json|yaml``).

The judging is ``app.engine.reverse``; this module reads, gathers and prints.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import yaml

from app.cli.inputs import CliError, known, load_rbac, policy_settings, served
from app.engine.kinds import BINDING_KINDS, ROLE_KINDS
from app.engine.model import Resource, labels_of
from app.engine.rbac import Snapshot
from app.engine.reverse import BoundPod, Existing, Holder, Report, is_restricted, places_pods

if TYPE_CHECKING:  # the official client is imported only to talk to a cluster (it is slow)
    from app.source.api import KubeClient

_RBAC_KINDS = frozenset(spec.kind for spec in (*ROLE_KINDS, *BINDING_KINDS))
_SIBILANT = ("s", "x", "z", "ch", "sh")


def plural(kind: str) -> str:
    """The resource name of a kind by the English rule the API's own kinds follow
    (``ConfigMap`` → configmaps, ``NetworkPolicy`` → networkpolicies, ``Ingress`` → ingresses).
    Irregular names need ``--resource``; against a cluster, discovery says exactly."""
    lower = kind.lower()
    if lower == "endpoints":
        return lower
    if lower.endswith("y") and lower[-2:-1] not in ("a", "e", "i", "o", "u"):
        return lower[:-1] + "ies"
    if lower.endswith(_SIBILANT):
        return lower + "es"
    return lower + "s"


def group_of(obj: Mapping[str, Any]) -> str:
    api_version = obj.get("apiVersion")
    if not isinstance(api_version, str) or "/" not in api_version:
        return ""
    return api_version.split("/", 1)[0]


def manifest_objects(objects: Iterable[tuple[str, Mapping[str, Any]]]) -> list[Existing]:
    """The objects of a manifests directory other than RBAC objects, as the audit sees them."""
    found = []
    for kind, obj in objects:
        if not kind or kind in _RBAC_KINDS:
            continue
        meta = obj.get("metadata") or {}
        found.append(
            Existing(
                Resource(group_of(obj), plural(kind)),
                str(meta.get("namespace") or ""),
                str(meta.get("name") or ""),
                dict(labels_of(obj)),
            )
        )
    return found


def manifest_pods(objects: Iterable[tuple[str, Mapping[str, Any]]]) -> list[BoundPod]:
    """The Pods of a manifests directory bound to a node (``spec.nodeName``)."""
    from app.source.listing import bound_pod

    found = (bound_pod(obj) for kind, obj in objects if kind == "Pod")
    return [pod for pod in found if pod is not None]


def cluster_objects(client: KubeClient, snapshot: Snapshot, namespace: str = "") -> list[Existing]:
    """Every existing object of a resource some role restricts (namespaced ones only in
    ``namespace`` when given), read as metadata only."""
    from app.source.listing import discover, list_labels

    found: list[Existing] = []
    for api_resource in discover(client):
        if is_restricted(snapshot, api_resource.as_resource):
            found.extend(list_labels(client, api_resource, namespace))
    return found


def dump(data: object, output: str) -> str:
    if output == "yaml":
        return str(yaml.safe_dump(data, sort_keys=False))
    return json.dumps(data, indent=2) + "\n"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns as kubectl prints them: upper-case headers, padded, three spaces apart."""
    widths = [max(len(str(row[i])) for row in (headers, *rows)) for i in range(len(headers))]
    lines = [
        "   ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in (headers, *rows)
    ]
    return "\n".join(lines) + "\n"


def _labels(labels: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or "<none>"


def holders_table(holders: Sequence[Holder]) -> str:
    rows = []
    placed = any(h.placements for h in holders)  # the column only where a role places pods
    for h in holders:
        answer = "yes" if h.allowed else ("no" if h.mode == "enforce" else f"no ({h.mode} mode)")
        through = ", ".join(h.bindings) or ", ".join(map(str, h.roles))
        row = [str(h.subject), answer, through, h.limits or "(unrestricted)"]
        rows.append([*row, "; ".join(h.placements) or "(anywhere)"] if placed else row)
    headers = ["SUBJECT", "ALLOWED", "THROUGH", "ROLE PERMITS"]
    return table([*headers, "PLACEMENT"] if placed else headers, rows)


def report_text(report: Report) -> str:
    parts = [f"{report.objects} objects audited\n"]
    if report.orphans:
        parts.append("\nOrphans: only holders of unrestricted roles may still write these\n")
        parts.append(
            table(
                ["RESOURCE", "NAMESPACE", "NAME", "LABELS", "WHY"],
                [
                    [str(o.resource), o.namespace or "-", o.name, _labels(o.labels), orphan.why]
                    for orphan in report.orphans
                    for o in (orphan.obj,)
                ],
            )
        )
    if report.unbucketed:
        parts.append("\nLabels in no bucket: no role's permission annotation permits these\n")
        parts.append(
            table(
                ["RESOURCE", "NAMESPACE", "NAME", "LABELS"],
                [
                    [str(o.resource), o.namespace or "-", o.name, _labels(o.labels)]
                    for o in report.unbucketed
                ],
            )
        )
    if not report.orphans and not report.unbucketed:
        parts.append("no orphans, every object's labels are in a bucket\n")
    if report.misplaced:
        parts.append(
            "\nPods outside their pool: bound to a node their bucket's roles do not place them on\n"
        )
        parts.append(
            table(
                ["NAMESPACE", "POD", "LABELS", "NODE", "WHY"],
                [
                    [m.pod.namespace, m.pod.name, _labels(m.pod.labels), m.pod.node, m.why]
                    for m in report.misplaced
                ],
            )
        )
    rows = [
        [namespace or "(cluster)", str(b.role), b.pattern, b.limits, b.mode, ", ".join(b.holders)]
        for namespace, buckets in report.buckets.items()
        for b in buckets
    ]
    parts.append("\nBuckets and who holds them\n")
    parts.append(table(["NAMESPACE", "ROLE", "RESOURCE", "LABELS", "MODE", "HOLDERS"], rows))
    return "".join(parts)


def cmd_who_can(args: argparse.Namespace) -> int:
    from app.engine.reverse import who_can

    settings = policy_settings(args)
    loaded = load_rbac(args, settings)
    known(served(loaded), args.resource, "RESOURCE")
    labels = dict(args.label)
    holders = who_can(
        loaded.snapshot, args.verb, args.resource, args.namespace, labels, args.name,
        settings.allow_unlabeled,
    )  # fmt: skip
    if args.output == "table":
        print(holders_table(holders), end="")
        return 0
    data = {
        "verb": args.verb,
        "resource": str(args.resource),
        "namespace": args.namespace,
        "labels": labels,
        "subjects": [h.as_dict() for h in holders],
    }
    print(dump(data, args.output), end="")
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    from app.engine.reverse import audit
    from app.source.api import KubeError

    settings = policy_settings(args)
    loaded = load_rbac(args, settings)
    if loaded.client is not None:
        from app.source.listing import bound_pods

        try:
            objects = cluster_objects(loaded.client, loaded.snapshot, args.namespace)
            placed = places_pods(loaded.snapshot)
            pods = bound_pods(loaded.client, args.namespace) if placed else []
        except KubeError as exc:
            raise CliError(f"cannot list objects at {loaded.where}: {exc}") from None
    else:
        objects, pods = manifest_objects(loaded.objects), manifest_pods(loaded.objects)
    if args.namespace:
        objects = [o for o in objects if o.namespace == args.namespace]
        pods = [p for p in pods if p.namespace == args.namespace]
    report = audit(loaded.snapshot, objects, settings.allow_unlabeled, pods=pods)
    if args.namespace:
        report.buckets = {
            ns: found for ns, found in report.buckets.items() if ns in ("", args.namespace)
        }
    if args.output == "table":
        print(report_text(report), end="")
    else:
        print(dump(report.as_dict(), args.output), end="")
    return 1 if report.orphans or report.unbucketed or report.misplaced else 0
