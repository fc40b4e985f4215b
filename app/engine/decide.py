"""The admission pipeline: every rule set in order, the label rule, then what the write causes.

``evaluate`` runs the checks in ``PRE_CHECKS``; the first enforced denial wins, then
``check_labels`` decides, and what it lets through must still pass ``POST_CHECKS`` (the workload
rules: what the write makes controllers do). Each check is a plain function
``(Request, Context) -> Decision | None`` (None: no objection), so rule sets stay independent of
each other and of this module.

Enforcement modes are applied here, once, for every rule set: a denial is enforced in the softer
of the global mode (``Options.mode``) and the mode the denying rule reports (``Decision.mode``,
which the label and workload rules set, from the roles that caused the denial). A softened denial
lets the request through with a warning (``warn``) or only an audit record (``audit``), and the
remaining checks still run, so an enforced denial further down is never hidden by it.
"""

from __future__ import annotations

import dataclasses

from app.engine.context import Check, Context
from app.engine.coverage import check_coverage
from app.engine.escalation import check_escalation
from app.engine.kinds import RBAC_RESOURCES, ROLE_KINDS
from app.engine.labels import check_labels, check_relabel
from app.engine.model import ENFORCE, OPERATIONS, WARN, Decision, Request, softest, strictest
from app.engine.node import check_node
from app.engine.owners import check_owners
from app.engine.rbac import RBAC_GROUP
from app.engine.scheduling import check_placement
from app.engine.workloads import check_workloads

_ROLE_RESOURCES = frozenset(spec.resource for spec in ROLE_KINDS)


def check_role_annotation(request: Request, ctx: Context) -> Decision | None:
    """A Role/ClusterRole may only be written with a valid permission annotation (and rules)."""
    res = request.resource
    if (
        res.group != RBAC_GROUP
        or res.resource not in _ROLE_RESOURCES
        or res.subresource
        or request.operation not in ("CREATE", "UPDATE")
        or request.object is None
    ):
        return None
    kind = RBAC_RESOURCES[res.resource].kind
    error = ctx.options.compiler.role(request.object, kind).error
    if error is not None:
        return Decision.deny(
            "InvalidAnnotation", f'{kind} "{request.name}" is invalid: {error}', code=422
        )
    return None


def check_operation(request: Request, ctx: Context) -> Decision | None:
    if request.operation not in OPERATIONS:
        return Decision.deny(
            "UnknownOperation", f"unknown admission operation {request.operation!r}", code=400
        )
    return None


# Checks run in this order before the label rule; each may only deny.
PRE_CHECKS: tuple[Check, ...] = (
    check_operation,  # anything unknown is refused before any rule reads the request
    check_node,
    check_role_annotation,  # an invalid annotation is refused before it is compared
    check_escalation,
    check_coverage,  # a widening write waits until the registration covers what it restricts
)

# Checks run after the label rule let the write itself through: what a change of labels decides
# beyond the object's own entry, what the write makes controllers do, where its pods run, and the
# delete a change of owner references or finalizers makes the garbage collector do. The object's
# own labels are judged (and explained) first.
POST_CHECKS: tuple[Check, ...] = (check_relabel, check_workloads, check_placement, check_owners)


# Policy denials, which a mode may soften. Malformed requests (400), internal errors (500) and an
# unsynced or stale cache (503) say the webhook cannot judge at all: always enforced.
SOFTENED_CODES = frozenset({403, 422})


def apply_mode(decision: Decision, global_mode: str) -> Decision:
    """A denial as enforced under ``global_mode``: unchanged, or allowed with its record kept."""
    if decision.allowed:
        return decision
    mode = softest(decision.mode, global_mode)
    if mode == ENFORCE or decision.code not in SOFTENED_CODES:
        return dataclasses.replace(decision, mode=ENFORCE)
    warnings = decision.warnings
    if mode == WARN:
        warnings += (f"{decision.message} (not enforced: {mode} mode)",)
    return Decision(
        True,
        200,
        decision.reason,
        decision.message,
        warnings,
        (*decision.explanation, f"{mode} mode: would have been denied ({decision.reason})"),
        mode,
    )


def _merge(softened: list[Decision], final: Decision) -> Decision:
    """The allowed outcome, carrying every softened denial (the strictest mode among them)."""
    if not softened:
        return final
    decisions = (*softened, final)
    soft = [d for d in decisions if d.softened]
    return Decision(
        True,
        200,
        soft[0].reason,
        "; ".join(dict.fromkeys(d.message for d in soft)),
        tuple(dict.fromkeys(w for d in decisions for w in d.warnings)),
        tuple(line for d in decisions for line in d.explanation),
        strictest(d.mode for d in soft),
    )


def evaluate(
    request: Request,
    ctx: Context,
    pre_checks: tuple[Check, ...] = PRE_CHECKS,
    post_checks: tuple[Check, ...] = POST_CHECKS,
) -> Decision:
    """Decide one request: the first enforced denial wins, then the label rule decides, then
    the post-checks may still object to what it let through."""
    softened: list[Decision] = []
    for check in pre_checks:
        decision = check(request, ctx)
        if decision is not None and not decision.allowed:
            decision = apply_mode(decision, ctx.options.mode)
            if not decision.allowed:
                return decision
            softened.append(decision)
    final = apply_mode(check_labels(request, ctx), ctx.options.mode)
    if not final.allowed:
        return final
    for check in post_checks:
        objection = check(request, ctx)
        if objection is not None and not objection.allowed:
            objection = apply_mode(objection, ctx.options.mode)
            if not objection.allowed:
                return objection
            softened.append(objection)
    return _merge(softened, final)
