"""The label rule: which of the user's roles grant a request, and which labels they permit.

``find_grants`` is the one place that answers "which roles granted this, and with what label
limits"; the admission rule (``check_labels``) and any other front door build on it, so they
agree on bindings, rule matching, annotation entries and their specificity.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from app.engine.context import Context, ParentLookup, ParentUnavailable
from app.engine.model import (
    ENFORCE,
    MODES,
    Decision,
    Request,
    Resource,
    UserInfo,
    labels_of,
    lends_identity,
    strictest,
)
from app.engine.policy import Entry, Requirement
from app.engine.rbac import CompiledRole, Snapshot, authorizing_roles
from app.engine.selectors import Selector, confinement

Restriction = tuple[CompiledRole, tuple[Entry, ...]]


@dataclass(frozen=True, slots=True)
class Grants:
    """The granting roles of one request, sorted by what they mean for labels.

    ``unrestricted`` is a role granting the request without label limits (then labels do not
    matter); ``restricted`` pairs each limiting role with the entries that decide for the
    resource (all must pass: they AND); ``invalid`` roles grant nothing through this webhook.
    """

    any: bool
    unrestricted: CompiledRole | None
    restricted: tuple[Restriction, ...]
    invalid: tuple[CompiledRole, ...]
    verb: str | None = None  # the verb denial messages name; None: the request's

    def passing(self, labels: Mapping[str, str], allow_unlabeled: bool) -> list[Restriction]:
        """The restricted roles whose entries all permit ``labels``."""
        return [
            (role, entries)
            for role, entries in self.restricted
            if all(e.violation(labels, allow_unlabeled) is None for e in entries)
        ]

    def within(self, selector: Selector | None, allow_unlabeled: bool) -> list[Restriction]:
        """The restricted roles that permit every object ``selector`` can match.

        Each key a role's deciding entries restrict must be confined by the selector to values
        the entry permits ("absent" only with ``allow_unlabeled``).
        """
        return [
            (role, entries)
            for role, entries in self.restricted
            if all(
                _confined(selector, req, allow_unlabeled) for e in entries for req in e.requirements
            )
        ]

    def allowances(self) -> str:
        """``role t1/team-a allows team in [a]; ...`` — what the restricted roles permit."""
        return "; ".join(
            f"{role.ref} allows {' and '.join(e.describe() for e in entries)}"
            for role, entries in self.restricted
        )

    def mode(self) -> str:
        """The mode of a denial these grants cause: every restricted role failed, so the
        strictest of theirs; a void (invalid) role never softens one."""
        if self.invalid:
            return ENFORCE
        return strictest(role.mode for role, _ in self.restricted)

    def broken(self) -> str:
        return "; ".join(f"{role.ref} grants nothing here: {role.error}" for role in self.invalid)

    def loan_limits(self) -> str:
        """``ServiceAccounts labeled team in [a] (role t1/team-a)``: whom the roles lend, when
        they were classified by their identity loan limits (``loan``)."""
        limits = " or ".join(
            f"{' and '.join(e.describe() for e in entries)} ({role.ref})"
            for role, entries in self.restricted
        )
        return f"ServiceAccounts labeled {limits}"


def _confined(selector: Selector | None, req: Requirement, allow_unlabeled: bool) -> bool:
    values = confinement(selector, req.key)
    if values is None:
        return False
    return all(req.allows(v) if v is not None else allow_unlabeled for v in values)


def find_grants(
    snapshot: Snapshot,
    user: UserInfo,
    namespace: str,
    verbs: Sequence[str],
    resource: Resource,
    name: str,
    loan: bool = False,
) -> Grants:
    """Classify the roles that authorize ``verbs`` on ``resource`` for ``user`` in RBAC.

    ``loan``: the access lets the user act as the object (a ServiceAccount), so the roles' identity
    loan limits decide (``Permissions.loan_entries``); it is implied by an identity verb.
    """
    loan = loan or any(lends_identity(verb, resource) for verb in verbs)
    granting = snapshot.granting_roles(user, namespace, verbs, resource, name)
    return classify(granting, resource, loan=loan)


def request_grants(
    request: Request, snapshot: Snapshot, lends: Resource | None = None, relabel: bool = False
) -> list[Grants]:
    """The granting roles of each authorization the request passed (see ``authorizations``),
    matched on the resource RBAC authorized.

    ``lends``: classify those same roles by the identity loan limits they set on ``lends``
    instead: a pod runs as its ServiceAccount with the grants of the roles that let it be written.
    ``relabel``: by what a change of the object's labels must meet (``relabel_entries``).
    """
    resource = request.authorized_resource
    bound = snapshot.bound_roles(request.user, request.namespace)
    return [
        classify(
            authorizing_roles(bound, resource, alternatives),
            lends or resource,
            alternatives[0].verb,
            loan=lends is not None or any(lends_identity(a.verb, resource) for a in alternatives),
            relabel=relabel,
        )
        for alternatives in request.authorizations
    ]


def classify(
    granting: Sequence[CompiledRole],
    resource: Resource,
    verb: str | None = None,
    *,
    loan: bool = False,
    relabel: bool = False,
) -> Grants:
    """Sort granting roles into unrestricted, restricted (with their entries) and invalid.

    For an identity loan (``loan``), a role's entries are those its loans must meet: an annotated
    role is then never unrestricted, whichever resources its annotation names.
    """
    restricted: list[Restriction] = []
    invalid: list[CompiledRole] = []
    for role in granting:
        if role.error is not None:
            invalid.append(role)
            continue
        if role.permissions is None:
            entries: tuple[Entry, ...] = ()
        elif loan:
            entries = role.permissions.loan_entries(resource)
        elif relabel:
            entries = role.permissions.relabel_entries(resource)
        else:
            entries = role.permissions.entries_for(resource)
        if not entries:
            return Grants(True, role, (), (), verb)
        restricted.append((role, entries))
    return Grants(bool(granting), None, tuple(restricted), tuple(invalid), verb)


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


def who(request: Request, verb: str | None = None) -> str:
    verb = request.verb if verb is None else verb
    return f'user "{request.user.username}" may not {verb or "connect to"} {request.describe()}'


def judge_labels(
    request: Request,
    grants: Grants,
    states: Sequence[tuple[bool, Mapping[str, str]]],
    allow_unlabeled: bool,
) -> Decision:
    """Every label set in ``states`` must be permitted by some restricted granting role."""
    explanation: list[str] = []
    warnings: list[str] = []
    for existing, labels in states:
        passing = grants.passing(labels, allow_unlabeled)
        if not passing:
            role, entries = grants.restricted[0]
            violation = next(
                v for e in entries if (v := e.violation(labels, allow_unlabeled)) is not None
            )
            detail = grants.allowances() + (f"; {grants.broken()}" if grants.invalid else "")
            return Decision.deny(
                "LabelNotPermitted",
                f"{who(request, grants.verb)}: {violation.describe(existing)} ({detail})",
                *(
                    f"{r.ref}: {' and '.join(e.describe() for e in es)}"
                    for r, es in grants.restricted
                ),
                mode=grants.mode(),
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


def grant_decision(request: Request, grants: Grants) -> Decision | None:
    """The decision when labels do not matter (no grant, unrestricted, only invalid roles)."""
    if not grants.any:
        return Decision.allow("NoGrantingRole", "no role bound to the user grants this request")
    if grants.unrestricted is not None:
        return Decision.allow(
            "Unrestricted", f"{grants.unrestricted.ref} grants this without label limits"
        )
    if not grants.restricted:
        return Decision.deny("InvalidAnnotation", f"{who(request, grants.verb)}: {grants.broken()}")
    return None


def check_labels(request: Request, ctx: Context) -> Decision:
    """The admission label rule: for every authorization the request passed, some role granting
    it must be unrestricted or permit the labels."""
    decisions: list[Decision] = []
    denials: list[Decision] = []
    states: list[tuple[bool, Mapping[str, str]]] | None = None
    for grants in request_grants(request, ctx.snapshot):
        decided = grant_decision(request, grants)
        if decided is None:
            try:
                if states is None:
                    states = label_states(request, ctx.lookup)
                decided = judge_labels(request, grants, states, ctx.options.allow_unlabeled)
            except ParentUnavailable as exc:
                decided = Decision.deny(
                    "ParentUnavailable",
                    f"{who(request, grants.verb)}: its label permissions cannot be checked: {exc}",
                    mode=grants.mode(),
                )
        if not decided.allowed:
            if decided.mode == ENFORCE:
                return decided
            denials.append(decided)  # not enforced, unless another authorization's denial is
            continue
        decisions.append(decided)
    if denials:
        return min(denials, key=lambda d: MODES.index(d.mode))
    return _combine(decisions)


def _combine(decisions: Sequence[Decision]) -> Decision:
    """One allowing decision for several authorizations: the first that judged something."""
    if not decisions:
        return Decision.allow("NoGrantingRole", "no role bound to the user grants this request")
    if len(decisions) == 1:
        return decisions[0]
    judged = [d for d in decisions if d.reason != "NoGrantingRole"] or decisions[:1]
    return Decision.allow(
        judged[0].reason,
        *dict.fromkeys(line for d in judged for line in d.explanation),
        warnings=tuple(dict.fromkeys(w for d in judged for w in d.warnings)),
    )


RELABEL_DENIED = "RelabelNotPermitted"


def check_relabel(request: Request, ctx: Context) -> Decision | None:
    """A change of an object's labels, judged by everything those labels decide.

    The labels of an object decide its subresources too (``pods/exec`` is judged by the pod's).
    A role whose entry for a subresource is narrower than its entry for the object, or whose
    object writes have no entry at all, would otherwise let its holder relabel an object into
    that entry's bucket and then use the subresource. So a change of labels that brings the
    object within the entries naming its subresources (``Permissions.relabel_entries``) of a
    role granting the write must find it there already. Roles without such entries are judged
    by the label rule alone, which has passed.
    """
    old, new = request.old_object, request.object
    if (
        request.operation != "UPDATE"
        or request.resource.subresource
        or old is None
        or new is None
        or labels_of(old) == labels_of(new)
        or not ctx.snapshot.limited(request.user, request.namespace)
    ):
        return None
    allow_unlabeled = ctx.options.allow_unlabeled
    stored, written = labels_of(old), labels_of(new)
    plain = request_grants(request, ctx.snapshot)
    relabel = request_grants(request, ctx.snapshot, relabel=True)
    for own, grants in zip(plain, relabel, strict=True):
        if grant_decision(request, grants) is not None:
            continue  # unrestricted, or only void roles: the label rule has decided
        if grant_decision(request, own) is None and not own.passing(stored, allow_unlabeled):
            continue  # the label rule refuses the stored object itself (or a mode softened it)
        if not grants.passing(written, allow_unlabeled) or grants.passing(stored, allow_unlabeled):
            continue  # the change brings the object into no bucket it was not in
        _, entries = grants.restricted[0]
        violation = next(
            v for e in entries if (v := e.violation(stored, allow_unlabeled)) is not None
        )
        limits = "; ".join(
            f"{role.ref} allows {' and '.join(f'{e.pattern}: {e.describe()}' for e in es)}"
            for role, es in grants.restricted
        )
        return Decision.deny(
            RELABEL_DENIED,
            f"{who(request, grants.verb)}: {violation.describe(existing=True)} where its "
            f"subresources are concerned, and relabelling would bring it within them ({limits})",
            mode=grants.mode(),
        )
    return None
