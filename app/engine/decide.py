"""The decision: which roles grant a request, and whether the labels in scope satisfy them.

``evaluate`` runs every check in order; the first denial wins. Each check is a plain function
``(Request, Context) -> Decision | None`` (None: no objection), so rule sets stay independent.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from app.engine.escalation import check_escalation
from app.engine.model import OPERATIONS, Decision, Request, labels_of
from app.engine.node import check_node
from app.engine.policy import DEFAULT_ANNOTATION_KEY, Entry
from app.engine.rbac import RBAC_GROUP, CompiledRole, Compiler, Snapshot


class ParentUnavailable(Exception):
    """The parent object of a request could not be read; the message says what and why."""


ParentLookup = Callable[[Request], Mapping[str, Any]]


def no_parent_lookup(request: Request) -> Mapping[str, Any]:
    raise ParentUnavailable(
        f'{request.resource.resource} "{request.name}" is not in this request and this webhook '
        "runs without cluster access (static --rbac-dir), so it cannot read it"
    )


@dataclass(frozen=True)
class Options:
    """Engine settings (a subset of the server settings)."""

    compiler: Compiler = field(default_factory=lambda: Compiler((DEFAULT_ANNOTATION_KEY,)))
    allow_unlabeled: bool = False


@dataclass(frozen=True)
class Context:
    """What a check may read besides the request."""

    snapshot: Snapshot
    options: Options = field(default_factory=Options)
    lookup: ParentLookup = no_parent_lookup


Check = Callable[[Request, Context], "Decision | None"]


def _plurals(kind: str) -> tuple[str, ...]:
    """Plural spellings a resource of this kind may have (``Policy`` → policies, policys...)."""
    lower = kind.lower()
    return (lower, lower + "s", lower + "es", lower[:-1] + "ies")


def object_is_parent(request: Request) -> bool:
    """Whether the request's object is the resource itself (so its labels are the ones to judge).

    Subresources such as ``status`` carry the parent; ``exec``, ``eviction`` or ``scale`` carry an
    options/Eviction/Scale object whose labels say nothing about the parent. When in doubt the
    answer is False, which costs a lookup rather than judging the wrong labels.
    """
    if request.operation == "CONNECT":
        return False
    if not request.resource.subresource:
        return True
    return bool(request.kind) and request.resource.resource in _plurals(request.kind)


def label_states(request: Request, lookup: ParentLookup) -> list[tuple[bool, Mapping[str, str]]]:
    """The label sets that must be permitted, each flagged ``existing`` (stored) or new.

    Raises ``ParentUnavailable`` when the labels have to be looked up and cannot be.
    """
    if not object_is_parent(request):
        return [(True, labels_of(lookup(request)))]
    if request.operation == "CREATE":
        return [(False, labels_of(request.object))]
    if request.operation == "UPDATE":
        if request.old_object is None:
            raise ParentUnavailable("the request carries no oldObject to compare with")
        return [(True, labels_of(request.old_object)), (False, labels_of(request.object))]
    # DELETE: the API server sends the stored object as oldObject (object is null).
    stored = request.old_object if request.old_object is not None else lookup(request)
    return [(True, labels_of(stored))]


def _who(request: Request) -> str:
    verb = request.verbs[0] if request.verbs else request.operation.lower()
    return f'user "{request.user.username}" may not {verb} {request.describe()}'


def _allowances(restricted: list[tuple[CompiledRole, tuple[Entry, ...]]]) -> str:
    return "; ".join(
        f"{role.ref} allows {' and '.join(e.describe() for e in entries)}"
        for role, entries in restricted
    )


def _broken(invalid: list[CompiledRole]) -> str:
    return "; ".join(f"{role.ref} grants nothing here: {role.error}" for role in invalid)


def check_labels(request: Request, ctx: Context) -> Decision:
    """The label rule: allow iff some granting role is unrestricted or its entry is satisfied."""
    granting = ctx.snapshot.granting_roles(
        request.user, request.namespace, request.verbs, request.resource, request.name
    )
    if not granting:
        return Decision.allow("NoGrantingRole", "no role bound to the user grants this request")

    restricted: list[tuple[CompiledRole, tuple[Entry, ...]]] = []
    invalid: list[CompiledRole] = []
    for role in granting:
        if role.error is not None:
            invalid.append(role)
            continue
        entries = role.permissions.entries_for(request.resource) if role.permissions else ()
        if not entries:
            return Decision.allow("Unrestricted", f"{role.ref} grants this without label limits")
        restricted.append((role, entries))

    if not restricted:
        return Decision.deny("InvalidAnnotation", f"{_who(request)}: {_broken(invalid)}")

    try:
        states = label_states(request, ctx.lookup)
    except ParentUnavailable as exc:
        return Decision.deny(
            "ParentUnavailable",
            f"{_who(request)}: its label permissions cannot be checked: {exc}",
        )

    allow_unlabeled = ctx.options.allow_unlabeled
    explanation: list[str] = []
    warnings: list[str] = []
    for existing, labels in states:
        passing = [
            (role, entries)
            for role, entries in restricted
            if all(e.violation(labels, allow_unlabeled) is None for e in entries)
        ]
        if not passing:
            role, entries = restricted[0]
            violation = next(
                v for e in entries if (v := e.violation(labels, allow_unlabeled)) is not None
            )
            detail = _allowances(restricted) + (f"; {_broken(invalid)}" if invalid else "")
            return Decision.deny(
                "LabelNotPermitted",
                f"{_who(request)}: {violation.describe(existing)} ({detail})",
                *(f"{r.ref}: {' and '.join(e.describe() for e in es)}" for r, es in restricted),
            )
        # Prefer a role the labels satisfy outright: only when every passing role relied on a
        # tolerated missing label was the object "allowed only because" of --allow-unlabeled.
        strict = next(
            (p for p in passing if all(e.violation(labels, False) is None for e in p[1])), None
        )
        role, entries = strict or passing[0]
        explanation.append(f"{'existing' if existing else 'new'} labels permitted by {role.ref}")
        if strict is None:
            missing = sorted({r.key for e in entries for r in e.requirements} - set(labels))
            if missing:
                warnings.append(
                    f"object has no label {', '.join(missing)}; allowed only because "
                    "unlabeled objects are permitted (--allow-unlabeled)"
                )
    return Decision.allow("LabelsPermitted", *explanation, warnings=tuple(dict.fromkeys(warnings)))


def check_role_annotation(request: Request, ctx: Context) -> Decision | None:
    """A Role/ClusterRole may only be written with a valid permission annotation (and rules)."""
    res = request.resource
    if (
        res.group != RBAC_GROUP
        or res.resource not in ("roles", "clusterroles")
        or res.subresource
        or request.operation not in ("CREATE", "UPDATE")
        or request.object is None
    ):
        return None
    kind = "Role" if res.resource == "roles" else "ClusterRole"
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
