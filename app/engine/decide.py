"""The admission pipeline: every rule set in order, then the label rule.

``evaluate`` runs the checks in ``PRE_CHECKS``; the first denial wins, then ``check_labels``
decides. Each check is a plain function ``(Request, Context) -> Decision | None`` (None: no
objection), so rule sets stay independent of each other and of this module.
"""

from __future__ import annotations

from app.engine.context import Check, Context
from app.engine.escalation import check_escalation
from app.engine.kinds import RBAC_RESOURCES, ROLE_KINDS
from app.engine.labels import check_labels
from app.engine.model import OPERATIONS, Decision, Request
from app.engine.node import check_node
from app.engine.rbac import RBAC_GROUP

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
)


def evaluate(
    request: Request, ctx: Context, pre_checks: tuple[Check, ...] = PRE_CHECKS
) -> Decision:
    """Decide one request: the first objecting check wins, then the label rule decides."""
    for check in pre_checks:
        decision = check(request, ctx)
        if decision is not None and not decision.allowed:
            return decision
    return check_labels(request, ctx)
