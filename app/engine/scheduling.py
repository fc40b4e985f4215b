"""The placement rule: a bucket's pods run only on the node pool its roles place it on.

A write is placement-restricted when every role granting it (RBAC resolution, as for the label
rule) carries a placement annotation (``app.engine.placement``). Then some granting role must
permit both the object's labels (its permission entries, if any) and where its pods run: one
role, one bucket, one pool. A granting role without a placement leaves placement unrestricted,
as a role without an entry leaves labels to RBAC; a role with an invalid annotation grants
nothing here.

Which writes:

- a pod's CREATE, and its UPDATE where what decides its node changes (``nodeName``,
  ``nodeSelector``, required affinity, tolerations: an update may add tolerations, and gated pods
  may change their selector and affinity);
- every pod template the template rule judges (``workloads.WORKLOADS``), on CREATE and on an
  UPDATE changing the template's labels or scheduling, by the user's grant on ``create pods``
  or, without one, by the workload's own grants (as ``workloads`` does for labels);
- ``pods/binding`` and the legacy ``bindings``: the target Node's labels must fit.

Pods that controllers create are judged at the workload. Nodes are read from the snapshot
(``Snapshot.nodes``, fed by the Node watch or the manifests): a Node it does not know is refused.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.engine.context import Context, ObjectRef, ParentUnavailable
from app.engine.labels import label_states, who
from app.engine.model import Decision, Request, Resource, labels_of, strictest
from app.engine.placement import Placement, PodPlacement
from app.engine.policy import Entry
from app.engine.rbac import CompiledRole, authorizing_roles
from app.engine.workloads import POD_BINDING, PODS, WORKLOADS, _dig, _text

PLACEMENT_DENIED = "PlacementNotPermitted"
UNAVAILABLE = "ParentUnavailable"
BINDINGS = Resource("", "bindings")

# Every resource whose writes the rule judges, as (group, resource): what an RBAC grant must
# span to hand out placement (the escalation check reads this too).
PLACED: frozenset[tuple[str, str]] = frozenset({("", "pods"), ("", "bindings"), *WORKLOADS})

Candidate = tuple[CompiledRole, tuple[Entry, ...], Placement]


def placed_roles(granting: Sequence[CompiledRole], resource: Resource) -> list[Candidate] | None:
    """The granting roles with their entries for ``resource`` and their placements, when every
    valid one carries a placement; None when placement is unrestricted (no valid granting role,
    or one without a placement). Void roles grant nothing here, so they do not count."""
    found: list[Candidate] = []
    for role in granting:
        if role.error is not None:
            continue
        if role.placement is None:
            return None
        entries = role.permissions.entries_for(resource) if role.permissions else ()
        found.append((role, entries, role.placement))
    return found or None


@dataclass(frozen=True, slots=True)
class Pod:
    """What is judged of one pod or pod template."""

    subject: str  # "" (the pod itself), "its pod template (spec.template)"
    labels: Mapping[str, str]
    placement: PodPlacement
    tolerations: bool = True  # whether its tolerations are judged (not on a binding)


def check_placement(request: Request, ctx: Context) -> Decision | None:
    """Refuse a write that would run a bucket's pods outside the pool its role places it on."""
    res = request.resource
    key = (res.group, res.resource)
    if key not in PLACED or request.operation not in ("CREATE", "UPDATE"):
        return None
    # Only a bound role with an annotation can carry a placement: the rest skip at a few lookups.
    if not ctx.snapshot.limited(request.user, request.namespace):
        return None
    if key == ("", "pods"):
        if res.subresource == "binding":
            return _check_binding(request, ctx, POD_BINDING)
        return None if res.subresource else _check_pod(request, ctx)
    if key == ("", "bindings"):
        return None if res.subresource else _check_binding(request, ctx, POD_BINDING)
    return None if res.subresource else _check_template(request, ctx)


def _own_candidates(request: Request, ctx: Context, resource: Resource) -> list[list[Candidate]]:
    """For each authorization the request passed, its placed granting roles (unrestricted ones
    left out)."""
    bound = ctx.snapshot.bound_roles(request.user, request.namespace)
    found = []
    for alternatives in request.authorizations:
        placed = placed_roles(
            authorizing_roles(bound, request.authorized_resource, alternatives), resource
        )
        if placed is not None:
            found.append(placed)
    return found


def _check_pod(request: Request, ctx: Context) -> Decision | None:
    all_candidates = _own_candidates(request, ctx, request.authorized_resource)
    if not all_candidates:
        return None
    spec = _spec(request.object)
    if request.operation == "UPDATE":
        old = PodPlacement.of(_dig(request.old_object, ("spec",)))
        if old.scheduling() == PodPlacement.of(spec).scheduling():
            return None
    labels, allow_unlabeled = _labels(request.object), ctx.options.allow_unlabeled
    for candidates in all_candidates:
        if _fits(candidates, labels, spec, allow_unlabeled):
            continue
        denial = _judge(request, ctx, candidates, Pod("", labels, PodPlacement.of(spec)))
        if denial is not None:
            return denial
    return None


def _check_template(request: Request, ctx: Context) -> Decision | None:
    workload = WORKLOADS[(request.resource.group, request.resource.resource)]
    # The user's grant on creating pods decides, as the template rule's; the workload's own
    # grants only when they hold none.
    granting = ctx.snapshot.granting_roles(request.user, request.namespace, ("create",), PODS, "")
    if granting:
        placed = placed_roles(granting, PODS)
        all_candidates = [] if placed is None else [placed]
    else:
        all_candidates = _own_candidates(request, ctx, request.authorized_resource)
    if not all_candidates:
        return None
    template = _dig(request.object, workload.template)
    spec, labels = _spec(template), _labels(template)
    if request.operation == "UPDATE":
        stored = _dig(request.old_object, workload.template)
        old = PodPlacement.of(_spec(stored))
        if old.scheduling() == PodPlacement.of(spec).scheduling() and labels_of(stored) == labels:
            return None
    subject = f"its pod template ({'.'.join(workload.template)})"
    allow_unlabeled = ctx.options.allow_unlabeled
    for candidates in all_candidates:
        if _fits(candidates, labels, spec, allow_unlabeled):
            continue
        denial = _judge(request, ctx, candidates, Pod(subject, labels, PodPlacement.of(spec)))
        if denial is not None:
            return denial
    return None


def _check_binding(request: Request, ctx: Context, judged: Resource) -> Decision | None:
    """``pods/binding`` and ``bindings``: the pod goes to the target Node, which must fit."""
    legacy = not request.resource.subresource
    if legacy:
        name = request.name or _text(_dig(request.object, ("metadata", "name")))
        granting = ctx.snapshot.granting_roles(
            request.user, request.namespace, ("create",), request.authorized_resource, name
        )
        placed = placed_roles(granting, judged)
        all_candidates = [] if placed is None else [placed]
    else:
        name = request.name
        all_candidates = _own_candidates(request, ctx, judged)
    if not all_candidates:
        return None
    target = _dig(request.object, ("target",))
    node = _text(target.get("name")) if isinstance(target, Mapping) else ""
    mode = strictest(role.mode for c in all_candidates for role, _, _ in c)
    try:
        if legacy:
            ref = ObjectRef("", "v1", "pods", request.namespace, name)
            labels = labels_of(ctx.metadata(ref))
        else:
            labels = label_states(request, ctx.lookup)[0][1]
    except ParentUnavailable as exc:
        return Decision.deny(
            UNAVAILABLE,
            f"{who(request)}: the pod it binds cannot be checked for its placement: {exc}",
            mode=mode,
        )
    pod = Pod(
        f'it binds pod "{name}"', labels, PodPlacement.of({"nodeName": node}), tolerations=False
    )
    for candidates in all_candidates:
        denial = _judge(request, ctx, candidates, pod, binding=True)
        if denial is not None:
            return denial
    return None


def _problem(
    ctx: Context, candidate: Candidate, pod: Pod, allow_unlabeled: bool, binding: bool
) -> str | None:
    """Why one role does not place the pod (None: it does)."""
    role, entries, placement = candidate
    for entry in entries:
        violation = entry.violation(pod.labels, allow_unlabeled)
        if violation is not None:
            return f"{violation.describe()} for {role.ref}"
    spec = pod.placement
    if binding or spec.node_name:
        problem = _node_problem(ctx, placement, spec.node_name, binding)
        if problem is not None:
            return problem
    elif placement.admits(spec.spec):
        return None  # pinned, every toleration permitted: the common case, in one pass
    else:
        req = placement.unpinned(spec)
        if req is not None:
            return (
                f"its nodeSelector or required node affinity does not pin node label {req.key} "
                f"to [{', '.join(g.text for g in req.values)}] (every nodeSelectorTerm must hold "
                f"an In of such values); add nodeSelector {req.key}: {_example(req.values)}"
            )
    if pod.tolerations:
        toleration = placement.untolerated(spec)
        if toleration is not None:
            if not toleration.key:
                return (
                    f"it tolerates {toleration.describe()}, which no placement permits; remove it"
                )
            return f"its toleration of {toleration.describe()} is not permitted; remove it"
    return None


def _node_problem(ctx: Context, placement: Placement, node: str, binding: bool) -> str | None:
    """Why the Node a pod names (or a binding targets) is not one ``placement`` permits."""
    known = ctx.snapshot.nodes.get(node) if node else None
    if known is None:
        return (
            f'{"its target is" if binding else "it names"} node "{node}", which is not known to '
            "label-rbac (no such Node, or not seen yet), so its labels cannot be checked; "
            f"{_fix_node(placement, binding)}"
        )
    misfit = placement.node_misfit(known.labels)
    if misfit is None:
        return None
    value = known.labels.get(misfit.key)
    has = f"has no label {misfit.key}" if value is None else f'has label {misfit.key}="{value}"'
    return (
        f'it runs on node "{node}", which {has}, not in '
        f"[{', '.join(g.text for g in misfit.values)}]; {_fix_node(placement, binding)}"
    )


def _example(values: Sequence[Any]) -> str:
    literal = next((g.text for g in values if g.is_literal), None)
    return literal if literal is not None else f"a value matching {values[0].text}"


def _fix_node(placement: Placement, binding: bool) -> str:
    keys = ", ".join(
        f"{r.key} in [{', '.join(g.text for g in r.values)}]" for r in placement.node_labels
    )
    if binding:
        return f"bind it to a node labeled {keys}"
    return f"name a node labeled {keys}, or leave spec.nodeName to the scheduler"


def _fits(
    candidates: Sequence[Candidate],
    labels: Mapping[str, str],
    spec: Mapping[str, Any],
    allow_unlabeled: bool,
) -> bool:
    """Whether some candidate permits the labels of a pod that names no node and its
    placement: ``_judge``'s answer for the common case, without building an explanation."""
    if spec.get("nodeName"):
        return False  # judged against the Node by ``_judge``
    for _, entries, placement in candidates:
        # ``Entry.violation`` is None for every entry, spelled out: this runs on every placed
        # pod's admission, and ``_judge`` explains a refusal with the entries' own words.
        permitted = True
        for entry in entries:
            for req in entry.requirements:
                value = labels.get(req.key)
                if value is None:
                    permitted = allow_unlabeled
                else:
                    for glob in req.values:
                        if glob.matches(value):
                            break
                    else:
                        permitted = False
                if not permitted:
                    break
            if not permitted:
                break
        if permitted and placement.admits(spec):
            return True
    return False


def _judge(
    request: Request, ctx: Context, candidates: Sequence[Candidate], pod: Pod, binding: bool = False
) -> Decision | None:
    """Some candidate role must permit the pod's labels and its placement."""
    allow_unlabeled = ctx.options.allow_unlabeled
    if not binding and _fits(candidates, pod.labels, pod.placement.spec, allow_unlabeled):
        return None
    problems: list[tuple[Candidate, str]] = []
    for candidate in candidates:
        problem = _problem(ctx, candidate, pod, allow_unlabeled, binding)
        if problem is None:
            return None
        problems.append((candidate, problem))
    # Explain by a role whose labels fit (the pod's bucket), else by the first.
    problem = next(
        (
            p
            for (_, entries, _), p in problems
            if all(e.violation(pod.labels, allow_unlabeled) is None for e in entries)
        ),
        problems[0][1],
    )
    places = "; ".join(f"{r.ref} places its pods on {p.describe()}" for r, _, p in candidates)
    return Decision.deny(
        PLACEMENT_DENIED,
        f"{who(request)}: {pod.subject + ': ' if pod.subject else ''}{problem} ({places})",
        *(f"{r.ref}: {p.describe()}" for r, _, p in candidates),
        mode=strictest(r.mode for r, _, _ in candidates),
    )


def _labels(obj: Any) -> Mapping[str, str]:
    """``labels_of``, for the objects of a review (dicts, read without abstract-class checks)."""
    meta = obj.get("metadata") if type(obj) is dict else None
    labels = meta.get("labels") if type(meta) is dict else None
    return labels if type(labels) is dict else labels_of(obj)


def _spec(obj: Any) -> Mapping[str, Any]:
    """``spec`` of a pod or pod template, {} when absent or malformed."""
    spec = obj.get("spec") if type(obj) is dict or isinstance(obj, Mapping) else None
    return spec if type(spec) is dict or isinstance(spec, Mapping) else {}
