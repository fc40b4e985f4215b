"""The escalation check: a role or binding may not hand out more label access than its author has.

RBAC refuses a Role granting what its author does not hold, and a binding to such a role, unless
the author holds the ``escalate`` (roles) or ``bind`` (bindings) verb. RBAC knows nothing of label
permissions, though: without this check a namespace admin limited to ``team=a`` could write a
Role granting configmaps without an annotation (or with ``team=b``) and bind herself to it, or
bind herself to an existing unrestricted Role. This check applies RBAC's rule to labels:

* the new object's grants are broken down, as RBAC does, into single grants: one verb on one
  ``group``/``resource[/sub]`` spelling (``*`` kept as written), with the rule's
  ``resourceNames`` kept as a set: the author's roles granting it are looked up once, and a name
  is judged on its own only when the author's rules name it (every other name is held through
  the same roles, so the first stands for all), which keeps the work linear in the names; a
  rule multiplies its apiGroups by its resources, so rules coming to more than ``MAX_GRANTS``
  single grants are refused rather than judged;
  every verb the label rule restricts is judged (``model.RESTRICTED_VERBS``:
  admission's verbs, the reads and identity loans ``/authorize`` judges, and ``*``), except
  reads that ``--unrestricted-reads`` leaves unscoped for everyone;
* for each grant the author holds in RBAC, at least one of the author's roles granting it must be
  unrestricted for it, or restrict every label key that role restricts, to value globs its own
  globs cover (``Glob.covers``);
* a grant the author does not hold at all is left to RBAC, whose escalation check refuses it;
* only an unrestricted grant of the bypass verb (``escalate``, ``bind``) bypasses the check: the
  labels of a Role bound who may write it, never what it hands out.

Wildcard grants (``*`` groups or resources) span resources no single annotation entry decides
for, so they are compared through over-approximations of both sides: when coverage cannot be
proven the grant is refused.

Placement: a role of the author's that covers a grant of pod or workload writes (``places``) in
labels must also cover it in placement (one role, one bucket, one pool): where it carries a
placement, the handed-out role must carry one within it (``Placement.excess``; none is the
broadest), in a mode no softer than its own.

Enforcement modes: the author's own roles count with their label limits whatever their mode (a
role in ``warn`` or ``audit`` mode is still a restriction), while a role handed out in a softer
mode than the author's role hands out limits that are not enforced, so it is compared as if it
had none.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from app.engine.context import Context, Options
from app.engine.glob import Glob
from app.engine.kinds import RBAC_RESOURCES, ROLE_KINDS
from app.engine.model import (
    LOAN_TARGETS,
    MODES,
    READ_VERBS,
    RESTRICTED_VERBS,
    VERBS_FOR_OPERATION,
    Decision,
    Request,
    Resource,
    lends_identity,
)
from app.engine.placement import Placement
from app.engine.policy import Entry, Permissions, Requirement
from app.engine.rbac import RBAC_GROUP, CompiledRole, Compiler, RoleRef, Rule
from app.engine.scheduling import PLACED

# The most single grants (a verb, an apiGroup, a resource spelling: RBAC's own breakdown) the
# rules of one Role or bound role may come to. Each is judged, and a rule multiplies its
# apiGroups by its resources, so without a bound a Role written for it would cost time quadratic
# in its size (100 groups x 100 resources x 3 verbs took 0.9 s). Kubernetes' own roles come to a
# few hundred; the aggregated admin role with a few dozen CRDs, a few thousand.
MAX_GRANTS = 10_000

# Reads that delete nothing: with a get of a subresource excepted (it may be a CONNECT, which
# admission judges), the only handed-out grants ``--unrestricted-reads`` can leave unjudged.
_PURE_READS = READ_VERBS - frozenset(VERBS_FOR_OPERATION["DELETE"])


@dataclass(frozen=True, slots=True)
class Grant:
    """One broken-down permission: a verb on one group/resource spelling, maybe for one name.

    ``group`` and ``resource`` keep RBAC's ``*``; a bare ``*`` resource also spans every
    subresource, ``*/status`` the ``status`` subresource of every resource.
    """

    verb: str
    group: str
    resource: str
    subresource: str = ""
    name: str = ""

    @classmethod
    def of(cls, verb: str, group: str, spelling: str, name: str = "") -> Grant:
        resource, _, subresource = spelling.partition("/")
        return cls(verb, group, resource, subresource, name)

    @property
    def target(self) -> Resource:
        """The grant as a Resource, ``*`` kept literal: RBAC matching then demands a ``*`` rule."""
        return Resource(self.group, self.resource, self.subresource)

    @property
    def concrete(self) -> bool:
        """True when the grant names exactly one resource, so annotations decide it exactly."""
        return self.group != "*" and self.resource != "*"

    @property
    def any_subresource(self) -> bool:
        return self.resource == "*" and not self.subresource

    def unscoped_read(self, options: Options) -> bool:
        """A read that ``--unrestricted-reads`` leaves unscoped for everyone, author included, so
        handing it out hands out nothing the label rule would have limited."""
        return (
            self.verb in _PURE_READS
            and not (self.subresource or self.any_subresource)
            and options.reads_unrestricted(self.target)
        )

    def __str__(self) -> str:
        text = str(self.target)
        return f'{text} "{self.name}"' if self.name else text


# A rule's resourceNames: as a set (membership) and sorted (messages name the first in order).
Names = tuple[frozenset[str], tuple[str, ...]]


def grants_of(rules: Sequence[Rule]) -> Iterator[tuple[Grant, Names]]:
    """The distinct label-relevant grants of ``rules``, one per verb, group and resource spelling
    of a rule, in a stable order (messages are tested), each with the rule's names (empty: any).

    Names stay a set, never multiplied out: the work is linear in the names' count, and only the
    names the author's own rules mention are judged one by one (``_names_to_judge``).
    """
    seen: set[tuple[Grant, frozenset[str]]] = set()
    for rule in rules:
        names = (rule.names, tuple(sorted(rule.names)))
        # Only verbs the label rule could ever restrict: admission's verbs, the reads and identity
        # loans ``/authorize`` judges, and ``*``.
        verbs = sorted(verb for verb in rule.verbs if verb in RESTRICTED_VERBS)
        for verb in verbs:
            for group in sorted(rule.groups):
                for spelling in sorted(rule.resources):
                    grant = Grant.of(verb, group, spelling)
                    if (grant, rule.names) not in seen:
                        seen.add((grant, rule.names))
                        yield grant, names


def _breadth(rules: Sequence[Rule]) -> int:
    """How many grants ``grants_of`` would judge at most (before removing duplicates)."""
    return sum(
        len(RESTRICTED_VERBS.intersection(rule.verbs)) * len(rule.groups) * len(rule.resources)
        for rule in rules
    )


# One of the author's roles granting a verb on a resource, with the names it is limited to there
# (None: any name).
Holder = tuple[CompiledRole, frozenset[str] | None]


def _holders(request: Request, ctx: Context, scope: str, grant: Grant) -> list[Holder]:
    """The author's distinct roles granting ``grant``'s verb and resource in RBAC, in binding
    order, whatever the names: one lookup per grant, shared by all of its names."""
    found: dict[RoleRef, Holder] = {}
    for _, role in ctx.snapshot.roles_for(request.user, scope):
        if role.ref in found:
            continue
        covering = [
            rule
            for rule in role.rules
            if rule.allows_verb(grant.verb) and rule.covers_resource(grant.target)
        ]
        if covering:
            named = all(rule.names for rule in covering)
            found[role.ref] = (
                role,
                frozenset().union(*(r.names for r in covering)) if named else None,
            )
    return list(found.values())


def _names_to_judge(names: Names, holders: Sequence[Holder]) -> list[str]:
    """The names of a grant whose judgement can differ, in order ("" for a grant without names).

    A name the author's rules never mention is held only through their rules without names, so
    all such names are judged alike: the first of them stands for the rest. The cost is bounded
    by the author's names, not by the grant's.
    """
    given, ordered = names
    if not given:
        return [""]
    mentioned = set().union(*(held for _, held in holders if held is not None))
    judged = {name for name in mentioned if name in given}
    unmentioned = next((name for name in ordered if name not in mentioned), None)
    if unmentioned is not None:
        judged.add(unmentioned)
    return sorted(judged)


# -- Comparing annotation entries over the resources a wildcard grant spans -----------------------
# Over-approximating where an author's entry applies makes their limit stricter, and
# over-approximating where a new entry applies makes more of it subject to comparison: both
# only ever refuse more. Under-approximations are used where "applies everywhere" is claimed.


def _may_apply(entry: Entry, grant: Grant) -> bool:
    """Whether ``entry`` may decide for some resource the grant spans."""
    if entry.group is not None and grant.group != "*" and not entry.group.matches(grant.group):
        return False
    if grant.resource != "*" and not entry.resource.matches(grant.resource):
        return False
    if grant.any_subresource:
        return True
    if grant.subresource:
        return entry.subresource is None or entry.subresource.matches(grant.subresource)
    return entry.subresource is None


def _always_applies(entry: Entry, grant: Grant) -> bool:
    """Whether ``entry`` applies to every resource the grant spans (none is left unrestricted)."""
    group_ok = (
        entry.group is None
        or entry.group.is_universal
        or (grant.group != "*" and entry.group.matches(grant.group))
    )
    resource_ok = entry.resource.is_universal or (
        grant.resource != "*" and entry.resource.matches(grant.resource)
    )
    subresource_ok = entry.subresource is None or (
        bool(grant.subresource) and entry.subresource.matches(grant.subresource)
    )
    return group_ok and resource_ok and subresource_ok


def _glob_covers(wide: Glob | None, narrow: Glob | None) -> bool:
    """``None`` is an absent pattern part, matching anything (group) or with-or-without (sub)."""
    if wide is None:
        return True
    return narrow is not None and wide.covers(narrow)


def _pattern_covers(wide: Entry, narrow: Entry) -> bool:
    """Whether every resource ``narrow`` applies to is one ``wide`` applies to as well."""
    return (
        wide.resource.covers(narrow.resource)
        and _glob_covers(wide.group, narrow.group)
        and _glob_covers(wide.subresource, narrow.subresource)
    )


def _globs_may_meet(a: Glob | None, b: Glob | None) -> bool:
    if a is None or b is None:
        return True
    if a.is_literal:
        return b.matches(a.text)
    if b.is_literal:
        return a.matches(b.text)
    return True  # two wildcard globs: their intersection is not computed, assume it is not empty


def _may_overlap(a: Entry, b: Entry) -> bool:
    """Whether some resource may be one both entries apply to."""
    return (
        _globs_may_meet(a.resource, b.resource)
        and _globs_may_meet(a.group, b.group)
        and _globs_may_meet(a.subresource, b.subresource)
    )


def _excess(new: Sequence[Entry], limit: Sequence[Requirement]) -> str | None:
    """How the new entries (ANDed) exceed ``limit`` (ANDed), or None when they stay within it.

    Within means: every key the limit restricts is restricted by some new requirement whose
    value globs are each covered by one of the limit's globs for that key.
    """
    if not limit:
        return None
    if not new:
        return "without a label restriction"
    for required in limit:
        candidates = [r for entry in new for r in entry.requirements if r.key == required.key]
        if not candidates:
            return f"without a restriction on label {required.key}"
        uncovered = [
            [glob for glob in candidate.values if not any(h.covers(glob) for h in required.values)]
            for candidate in candidates
        ]
        if all(uncovered):
            return f'with {required.key}="{uncovered[0][0].text}"'
    return None


def _describe(entries: Sequence[Entry]) -> str:
    return " and ".join(dict.fromkeys(r.describe() for e in entries for r in e.requirements))


@dataclass(frozen=True, slots=True)
class Shortfall:
    """Why one of the author's roles does not cover a grant."""

    role: CompiledRole
    excess: str  # how the new grant goes beyond it, e.g. 'with team="b"'
    limit: str  # what the author's role allows, e.g. 'team in [a]'


def _spans(grant: Grant, res: Resource) -> bool:
    """Whether the grant's group/resource spelling covers ``res``, as an RBAC rule would."""
    return (
        grant.group in ("*", res.group)
        and grant.resource in ("*", res.resource)
        and (grant.any_subresource or grant.subresource == res.subresource)
    )


def _loans(grant: Grant) -> tuple[Resource, ...]:
    """The identities the grant lets its holder act as (``model.lends_identity``)."""
    if grant.concrete and lends_identity(grant.verb, grant.target):
        return (grant.target,)
    return tuple(r for r in LOAN_TARGETS if _spans(grant, r) and lends_identity(grant.verb, r))


def compare(grant: Grant, new: Permissions | None, own: CompiledRole) -> Shortfall | None:
    """None when the author's role ``own`` (which grants ``grant`` in RBAC) covers it in labels.

    An identity loan the grant includes is covered only by the author's own loan limits
    (``Permissions.loan_entries``), whichever resources their annotation names.
    """
    if own.permissions is None:
        return None
    loans: list[Region] = [
        (new.loan_entries(res) if new else (), own.permissions.loan_entries(res))
        for res in _loans(grant)
    ]
    return _shortfall(own, _regions(grant, new, own.permissions) + loans)


Region = tuple[Sequence[Entry], Sequence[Entry]]


def _regions(grant: Grant, new: Permissions | None, own: Permissions) -> list[Region]:
    """Pairs of (new entries, the author's entries) to compare for the resources of ``grant``."""
    regions: list[Region]
    if grant.concrete:
        target = grant.target
        theirs = own.entries_for(target)
        if not theirs:
            return []
        regions = [(new.entries_for(target) if new else (), theirs)]
    else:
        # Split the spanned resources by which new entry may decide for them (plus those no new
        # entry decides for) and compare each against every entry of the author's that may
        # apply there: a per-region upper bound of the new access against a lower bound of theirs.
        theirs = tuple(e for e in own.entries if _may_apply(e, grant))
        if not theirs:
            return []
        mine = [e for e in new.entries if _may_apply(e, grant)] if new else []
        regions = [((e,), tuple(t for t in theirs if _may_overlap(e, t))) for e in mine]
        if not any(_always_applies(e, grant) for e in mine):
            uncovered = tuple(t for t in theirs if not any(_pattern_covers(e, t) for e in mine))
            regions.append(((), uncovered))
    return regions


def _shortfall(own: CompiledRole, regions: Sequence[Region]) -> Shortfall | None:
    for new_entries, limit_entries in regions:
        limit = [r for e in limit_entries for r in e.requirements]
        excess = _excess(new_entries, limit)
        if excess is not None:
            return Shortfall(own, excess, _describe(limit_entries))
    return None


# The writes a placement restricts (``app.engine.scheduling``), by the verbs that grant them.
_PLACED_VERBS = frozenset({"create", "update", "patch", "*"})
_PLACED_RESOURCES = tuple(
    Resource(group, resource, sub)
    for group, resource in sorted(PLACED)
    for sub in (("", "binding") if (group, resource) == ("", "pods") else ("",))
)


def places(grant: Grant) -> bool:
    """Whether the grant hands out a write whose pods a placement restricts."""
    return grant.verb in _PLACED_VERBS and any(_spans(grant, r) for r in _PLACED_RESOURCES)


def compare_placement(
    grant: Grant, new: Placement | None, mode: str, own: CompiledRole
) -> Shortfall | None:
    """None when the author's role ``own`` places the grant's pods no narrower than ``new``
    does: a placement-restricted author may hand out only a placement within their own (no
    placement is the broadest), in a mode no softer than their own role's."""
    mine = own.placement
    if mine is None or not places(grant):
        return None
    excess = mine.excess(new)
    if excess is None and MODES.index(mode) > MODES.index(own.mode):
        excess = f"in {mode} mode (its placement is not enforced)"
    return None if excess is None else Shortfall(own, excess, f"placement {mine.describe()}")


def _compare_modes(grant: Grant, target: Target, own: CompiledRole) -> Shortfall | None:
    """``compare``, where limits enforced in a softer mode than the author's count as none;
    then the placement (one role covers both: one bucket, one pool)."""
    shortfall = compare(grant, target.permissions, own) or compare_placement(
        grant, target.placement, target.mode, own
    )
    if shortfall is not None or MODES.index(target.mode) <= MODES.index(own.mode):
        return shortfall
    unenforced = compare(grant, None, own)
    if unenforced is None:
        return None
    excess = f"in {target.mode} mode (its label limits are not enforced)"
    return Shortfall(own, excess, unenforced.limit)


# -- The check ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Target:
    """What a role or binding write hands out, where the author's own access is read, the bypass."""

    rules: tuple[Rule, ...]
    permissions: Permissions | None
    scope: str  # namespace of the author's own access; "" is cluster scope
    bypass_verb: str
    bypass_resource: str
    bypass_name: str
    via: str = ""  # for bindings, the role that grants
    mode: str = "enforce"  # the handed-out role's enforcement mode
    placement: Placement | None = None  # the handed-out role's placement

    def hint(self) -> str:
        name = f' "{self.bypass_name}"' if self.via else ""
        return (
            f'escalation check; holding the "{self.bypass_verb}" verb on '
            f"{self.bypass_resource}{name} bypasses it"
        )


def _role_target(request: Request, obj: Mapping[str, Any], compiler: Compiler) -> Target | None:
    kind = RBAC_RESOURCES[request.resource.resource].kind
    new = compiler.role(obj, kind)
    if new.error is not None:
        return None  # refused by check_role_annotation; an invalid annotation grants nothing
    if request.operation == "UPDATE" and request.old_object is not None:
        old = compiler.role(request.old_object, kind)
        # Unchanged grants hand out nothing new. RBAC exempts updates touching only the
        # garbage-collection fields (finalizers, ownerReferences); label edits grant nothing
        # either, so any update leaving rules and annotation as they were is exempt here.
        if (
            old.error is None
            and old.permissions == new.permissions
            and old.rules == new.rules
            and old.mode == new.mode
            and old.placement == new.placement
        ):
            return None
    return Target(
        rules=new.rules,
        permissions=new.permissions,
        scope=request.namespace if kind == "Role" else "",
        bypass_verb="escalate",
        bypass_resource=request.resource.resource,
        bypass_name=request.name,
        mode=new.mode,
        placement=new.placement,
    )


def _binding_target(request: Request, obj: Mapping[str, Any], ctx: Context) -> Target | None:
    kind = RBAC_RESOURCES[request.resource.resource].kind
    compiler = ctx.options.compiler
    binding = compiler.binding(obj, kind)
    if binding is None:
        return None  # a roleRef of unknown kind binds nothing
    role = ctx.snapshot.roles.get(binding.role)
    if role is None or role.error is not None:
        # It grants nothing now. Whoever later writes (or repairs) the role is checked then.
        return None
    replaced = request.old_object if request.operation == "UPDATE" else None
    old = compiler.binding(replaced, kind) if replaced is not None else None
    if not binding.hands_out_more_than(old):
        return None
    return Target(
        rules=role.rules,
        permissions=role.permissions,
        scope=request.namespace if kind == "RoleBinding" else "",
        bypass_verb="bind",
        # RBAC checks "bind" on the referenced role, in the binding's namespace.
        bypass_resource="roles" if binding.role.namespace else "clusterroles",
        bypass_name=binding.role.name,
        via=f" through {binding.role}",
        mode=role.mode,
        placement=role.placement,
    )


def _deny(
    request: Request,
    target: Target,
    grant: Grant,
    shortfalls: list[Shortfall],
    invalid: list[CompiledRole],
) -> Decision:
    who = f'user "{request.user.username}" may not grant {grant}'
    if shortfalls:
        limits = " or ".join(dict.fromkeys(s.limit for s in shortfalls))
        message = (
            f"{who} {shortfalls[0].excess}{target.via}: their own access is limited to {limits}"
        )
    else:
        refs = ", ".join(str(role.ref) for role in invalid)
        message = (
            f"{who}{target.via}: their own access through {refs} is void: "
            "its permission annotation is invalid"
        )
    explanation = [
        f"{grant.verb} on {grant}{target.via} would exceed the author's access",
        *(f"{s.role.ref} limits it to {s.limit}" for s in shortfalls),
        *(f"{role.ref} grants nothing: {role.error}" for role in invalid),
    ]
    return Decision.deny("Escalation", f"{message} ({target.hint()})", *explanation)


def _bypasses(request: Request, ctx: Context, target: Target) -> bool:
    """Whether the author holds the bypass verb (``escalate``/``bind``) without label limits.

    A label-restricted grant of it bypasses nothing: the labels of a Role or binding bound who
    may write that object, never what it hands out, so the author's label limits still apply.
    """
    bypass = Resource(RBAC_GROUP, target.bypass_resource)
    return any(
        role.error is None and not (role.permissions and role.permissions.entries_for(bypass))
        for role in ctx.snapshot.granting_roles(
            request.user, target.scope, (target.bypass_verb,), bypass, target.bypass_name
        )
    )


def check_escalation(request: Request, ctx: Context) -> Decision | None:
    """Refuse a Role/ClusterRole or binding that grants more label access than its author has."""
    res = request.resource
    obj = request.object
    if (
        res.group != RBAC_GROUP
        or res.subresource
        or request.operation not in ("CREATE", "UPDATE")
        or obj is None
    ):
        return None
    spec = RBAC_RESOURCES.get(res.resource)
    if spec is None:
        return None
    if spec in ROLE_KINDS:
        target = _role_target(request, obj, ctx.options.compiler)
    else:
        target = _binding_target(request, obj, ctx)
    if target is None:
        return None
    if _bypasses(request, ctx, target):
        return None
    breadth = _breadth(target.rules)
    if breadth > MAX_GRANTS:
        return Decision.deny(
            "TooBroad",
            f'user "{request.user.username}" may not grant these rules{target.via}: they break '
            f"down to {breadth} single grants (verbs x apiGroups x resources), more than the "
            f"{MAX_GRANTS} the escalation check judges; split them into narrower rules or "
            f'roles, or use "*" ({target.hint()})',
        )

    for grant, names in grants_of(target.rules):
        if grant.unscoped_read(ctx.options):
            continue
        holders = _holders(request, ctx, target.scope, grant)
        for name in _names_to_judge(names, holders):
            denial = _judge(request, ctx, target, replace(grant, name=name), holders)
            if denial is not None:
                return denial
    return None


def _judge(
    request: Request, ctx: Context, target: Target, grant: Grant, holders: Sequence[Holder]
) -> Decision | None:
    """Some role of the author's that grants ``grant`` (a name, if any) must cover its labels."""
    own = [role for role, held in holders if held is None or (grant.name and grant.name in held)]
    if not own:
        # The author does not hold this grant at all: RBAC's own escalation check refuses
        # the write, and the bypass verbs that would let it through were ruled out above.
        return None
    shortfalls: list[Shortfall] = []
    for role in own:
        if role.error is not None:
            continue  # grants nothing through this webhook, so it covers nothing either
        shortfall = _compare_modes(grant, target, role)
        if shortfall is None:
            return None
        shortfalls.append(shortfall)
    invalid = [role for role in own if role.error is not None]
    return _deny(request, target, grant, shortfalls, invalid)
