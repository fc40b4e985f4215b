"""The authorization pipeline: label-scoped reads and identity loans for SubjectAccessReviews.

The webhook sits before RBAC in the API server's chain, so it only narrows: it denies reads that
RBAC would grant but the user's label permissions do not cover, and requests to act as another
subject (impersonation, approving or signing certificates: ``model.IDENTITY_VERBS``) that a
label-restricted role would lend beyond its labels; otherwise it has no opinion (RBAC decides).
Which verbs it judges is ``model.AUTHORIZED_VERBS``, the set the escalation check reads too.
``authorize`` runs ``READ_CHECKS`` in order; the first check with an answer decides. Each check
is ``(Access, Context) -> AccessDecision | None``, so another rule set (a node authorizer) plugs
in in front of the label rule without either knowing the other.

Which roles grant a read, and what their entries permit, comes from ``labels.find_grants``:
the same bindings, rule matching and entry specificity as the admission rule.
"""

from __future__ import annotations

from collections.abc import Callable

from app.engine.context import Context, ObjectRef, ParentUnavailable
from app.engine.labels import Grants, find_grants
from app.engine.model import (
    AUTHORIZED_VERBS,
    COLLECTION_VERBS,
    IDENTITY_VERBS,
    READ_VERBS,
    RESTRICTED_VERBS,
    Access,
    AccessDecision,
    labels_of,
)
from app.engine.selectors import Selector

# The one identity that carries labels: a ServiceAccount is impersonated by its namespace and name.
SERVICE_ACCOUNTS = "serviceaccounts"

ReadCheck = Callable[[Access, Context], "AccessDecision | None"]


def describe(access: Access) -> str:
    """``configmaps "cm-b" in namespace "t1"``, or ``configmaps in all namespaces``."""
    text = str(access.resource)
    if access.name:
        text += f' "{access.name}"'
    if access.namespace:
        text += f' in namespace "{access.namespace}"'
    elif access.verb in COLLECTION_VERBS and not access.name:
        text += " in all namespaces"
    return text


def check_label_read(access: Access, ctx: Context) -> AccessDecision | None:
    """Deny reads and identity loans outside the user's label buckets; no opinion otherwise."""
    if access.verb not in AUTHORIZED_VERBS:
        if access.verb not in RESTRICTED_VERBS:  # bind, escalate, use, a custom verb...
            return AccessDecision.no_opinion(
                "VerbNotRestricted", f"no label permission narrows {access.verb}: RBAC decides"
            )
        return AccessDecision.no_opinion("NotARead", "writes are judged by admission")
    if access.verb in READ_VERBS and ctx.options.reads_unrestricted(access.resource):
        return AccessDecision.no_opinion(
            "ReadsUnrestricted", f"reads of {access.resource} are not label-scoped"
        )
    # A cross-namespace list has no namespace: only ClusterRoleBindings grant it, as in RBAC.
    grants = find_grants(
        ctx.snapshot,
        access.user,
        access.namespace,
        (access.verb,),
        access.resource,
        access.name,
    )
    if not grants.any:
        return AccessDecision.no_opinion(
            "NoGrantingRole", "no role bound to the user grants this; RBAC refuses it"
        )
    if grants.unrestricted is not None:
        return AccessDecision.no_opinion(
            "Unrestricted", f"{grants.unrestricted.ref} grants this without label limits"
        )
    if not grants.restricted:
        return AccessDecision.deny("InvalidAnnotation", f"{_who(access)}: {grants.broken()}")
    if access.verb in IDENTITY_VERBS:
        return _judge_identity(access, ctx, grants)
    allow_unlabeled = ctx.options.allow_unlabeled
    if access.verb in COLLECTION_VERBS:
        within = grants.within(_selector(access), allow_unlabeled)
        if within:
            return AccessDecision.no_opinion(
                "SelectorWithinLabels", f"the label selector stays within {within[0][0].ref}"
            )
        if not access.name:
            return AccessDecision.deny(
                "SelectorNotWithinLabels", _selector_message(access, grants), *_entries(grants)
            )
        # A list by ``metadata.name`` (the API server then sets ``name``) returns at most that
        # object: its labels decide, as for a get.
    return _judge_object(access, ctx, grants)


def _selector(access: Access) -> Selector | None:
    # ``Access.labels`` holds ``Requirement``s (typed loosely in the model to keep it at the
    # bottom); None is "no usable selector" — absent, or a rawSelector the server could not parse.
    return access.labels


def _judge_identity(access: Access, ctx: Context, grants: Grants) -> AccessDecision:
    """Impersonating (or certifying) a subject lends its grants on every resource.

    ``grants`` carry each role's identity loan limits (``Permissions.loan_entries``): a
    label-restricted role lends only ServiceAccounts whose stored labels meet all of its buckets
    (its own ``serviceaccounts`` entry, when it has one). Users, groups, UIDs, extras, nodes and
    signers carry no labels, so only a role without a permission annotation lends them.
    """
    res = access.resource
    if res.resource == SERVICE_ACCOUNTS and not res.subresource:
        if not access.name:
            return AccessDecision.deny(
                "NoObjectName",
                f"{_who(access)}: it names no ServiceAccount whose labels could be checked; "
                f"it may {access.verb} only {grants.loan_limits()}",
                *_entries(grants),
            )
        account = ObjectRef("", "v1", SERVICE_ACCOUNTS, access.namespace, access.name)
        return _judge_object(access, ctx, grants, account)
    return AccessDecision.deny(
        "IdentityNotLabeled",
        f"{_who(access)}: {res.resource} carry no labels, so only a role without a permission "
        f"annotation lends them; a label-restricted role lends only {grants.loan_limits()}",
        *_entries(grants),
    )


def _judge_object(
    access: Access, ctx: Context, grants: Grants, ref: ObjectRef | None = None
) -> AccessDecision:
    """A named object (or a subresource of it): its stored labels must be permitted."""
    try:
        labels = labels_of(ctx.metadata(ref or object_ref(access)))
    except ParentUnavailable as exc:
        return AccessDecision.deny(
            "LabelsUnavailable",
            f"{_who(access)}: its labels cannot be checked ({exc}); {_only(grants)}",
            *_entries(grants),
        )
    allow_unlabeled = ctx.options.allow_unlabeled
    passing = grants.passing(labels, allow_unlabeled)
    if passing:
        return AccessDecision.no_opinion(
            "LabelsPermitted", f"the object's labels are permitted by {passing[0][0].ref}"
        )
    _, entries = grants.restricted[0]
    violation = next(v for e in entries if (v := e.violation(labels, allow_unlabeled)) is not None)
    if ref is None:
        limits = f" ({grants.allowances()})"
    else:
        limits = f"; it may {access.verb} only {grants.loan_limits()}"
    return AccessDecision.deny(
        "LabelNotPermitted",
        f"{_who(access)}: {violation.describe(existing=True)}{limits}",
        *_entries(grants),
    )


def object_ref(access: Access) -> ObjectRef:
    """The object whose labels decide: the named object itself, never its subresource."""
    res = access.resource
    return ObjectRef(res.group, access.version, res.resource, access.namespace, access.name)


def _who(access: Access) -> str:
    return f'user "{access.user.username}" may not {access.verb} {describe(access)}'


def _only(grants: Grants) -> str:
    return f"only objects labeled {_alternatives(grants)} are permitted"


def _alternatives(grants: Grants) -> str:
    """``team in [a]``; with several restricted roles, each alternative names its role."""
    if len(grants.restricted) == 1:
        _, entries = grants.restricted[0]
        return " and ".join(e.describe() for e in entries)
    return " or ".join(
        f"{' and '.join(e.describe() for e in entries)} ({role.ref})"
        for role, entries in grants.restricted
    )


def _entries(grants: Grants) -> tuple[str, ...]:
    return tuple(
        f"{role.ref}: {' and '.join(e.describe() for e in entries)}"
        for role, entries in grants.restricted
    )


def _selector_message(access: Access, grants: Grants) -> str:
    """``user "alice" may list configmaps in namespace "t1" only with a label selector within
    team in [a] (add -l team=a)``."""
    where = describe(access)
    return (
        f'user "{access.user.username}" may {access.verb} {where} only with a label selector '
        f"within {_alternatives(grants)} (add -l {suggest_selector(grants)})"
    )


def suggest_selector(grants: Grants) -> str:
    """A selector that the first restricted role permits, as ``kubectl -l`` takes it."""
    _, entries = grants.restricted[0]
    terms: dict[str, str] = {}
    for entry in entries:
        for req in entry.requirements:
            if req.key in terms:
                continue
            literals = [g.text for g in req.values if g.is_literal]
            if len(literals) == 1:
                terms[req.key] = f"{req.key}={literals[0]}"
            elif literals:
                terms[req.key] = f"{req.key} in ({','.join(literals)})"
            else:
                globs = ", ".join(g.text for g in req.values)
                terms[req.key] = f"{req.key}=<a value matching {globs}>"
    text = ",".join(terms.values())
    return f"'{text}'" if any(ch in text for ch in " <>()") else text


# Checks in order; the first answer wins. A node authorizer's read check goes first.
READ_CHECKS: tuple[ReadCheck, ...] = (check_label_read,)


def authorize(
    access: Access, ctx: Context, checks: tuple[ReadCheck, ...] = READ_CHECKS
) -> AccessDecision:
    """Decide one resource request: the first check with an answer wins; else no opinion."""
    for check in checks:
        decision = check(access, ctx)
        if decision is not None:
            return decision
    return AccessDecision.no_opinion("NoRule", "no rule applies")
