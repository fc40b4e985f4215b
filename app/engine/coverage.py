"""Which resources the label rule can never judge other than "allow", and the fence for the rest.

The ``labels.labelrbac.io`` webhook entry matches every namespaced resource and fails closed, so
an outage of the webhook stops every write in every tenant namespace. Most resources, though,
carry no label restriction at all: no permission annotation names them, and for them the label
rule always answers "allow". ``unjudged`` computes that set from the RBAC snapshot and the
resources the API server serves, so the registration can leave them out
(``app.compiled.registration`` keeps the registration in step). A served namespaced resource is
unjudged when

* no resource pattern of any Role/ClusterRole's annotation matches it, bound or not (a pattern
  names the resource and maybe a group: ``pods/exec`` restricts ``pods``, a pattern without a
  group matches every group, ``*`` every resource);
* no role whose annotation is broken grants it (such a role grants nothing for what its rules
  grant: the label rule denies); a rule spelled ``*`` reaches every resource;
* the webhook does not judge it whatever the annotations (``ALWAYS_JUDGED``).

A resource not served (a CRD not yet discovered) is never unjudged, so it stays sent to the
webhook until discovery lists it: fail closed. The work is linear in distinct patterns (and
distinct rules of broken roles) times served resources: the roles repeat a few annotations.

Between a role gaining a restriction and the registration covering that resource, the API server
does not send writes of it to the webhook. ``check_coverage`` closes that gap for the writes
that would widen access: a binding handing out such a role, and a bound role starting to grant
a resource it restricts, are refused until the registration covers the resource.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from app.engine.context import UNKNOWN, Context, is_key
from app.engine.kinds import BINDING_KINDS, RBAC_RESOURCES, ROLE_KINDS
from app.engine.model import ADMISSION_VERBS, ENFORCE, TOKEN_REQUEST, Decision, Request, Resource
from app.engine.policy import Entry, Permissions
from app.engine.rbac import RBAC_GROUP, CompiledRole, Pattern, Restrictions, Rule
from app.engine.workloads import RULES as WORKLOAD_RULES

# Namespaced resources (group, resource) whose writes the admission webhook judges whatever the
# permission annotations say: RBAC objects (escalation check, annotation validation), the
# workload rules' resources (templates, selectors, scale targets, pod references, the legacy
# ``bindings``), pods (references, their ServiceAccount, node rules' mirror pods) and
# ServiceAccounts (a token request is an identity loan, judged by every annotated role's
# buckets). Built from the tables that define them (``kinds``, ``workloads.RULES``), here rather
# than in ``kinds``: a rule set's table sits above the table of kinds.
ALWAYS_JUDGED: frozenset[tuple[str, str]] = frozenset(
    {
        *((RBAC_GROUP, resource) for resource in RBAC_RESOURCES),
        *WORKLOAD_RULES,
        ("", "pods"),
        (TOKEN_REQUEST.group, TOKEN_REQUEST.resource),
    }
)

# Verbs that may have authorized an admission request (CONNECT included: ``get`` on
# ``pods/exec``, ``services/proxy``), and ``*``; and those writing an object itself.
_ADMISSION_VERBS = ADMISSION_VERBS | {"*"}
_WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection", "*"})
_ROLES = frozenset(spec.resource for spec in ROLE_KINDS)
_BINDINGS = frozenset(spec.resource for spec in BINDING_KINDS)

REASON = "RegistrationPending"


def key(res: Resource) -> str:
    """The key of a resource, as the registration's condition builds it from a request."""
    return str(Resource(res.group, res.resource))


def names(entry: Entry | Pattern, res: Resource) -> bool:
    """Whether an annotation entry's resource pattern names ``res`` (or one of its
    subresources): the label rule may then restrict writes of it."""
    return entry.resource.matches(res.resource) and (
        entry.group is None or entry.group.matches(res.group)
    )


@dataclass(frozen=True, slots=True)
class _Reach:
    """What one rule spells, sorted for lookups: each resource then costs a few set reads,
    whatever the number of resources the rule lists."""

    rule: Rule
    star: bool  # ``*``: every resource and subresource
    star_sub: bool  # ``*/sub``: a subresource of every resource
    itself: frozenset[str]  # resources named plainly
    bases: frozenset[str]  # resources named with a subresource (``res/sub``)
    writes: bool  # a verb writing an object itself
    admits: bool  # a verb admission sees (CONNECT included)

    @classmethod
    def of(cls, rule: Rule) -> _Reach:
        spelled = rule.resources
        return cls(
            rule,
            "*" in spelled,
            any(s.startswith("*/") for s in spelled),
            frozenset(s for s in spelled if "/" not in s),
            frozenset(s.partition("/")[0] for s in spelled if "/" in s),
            any(rule.allows_verb(verb) for verb in _WRITE_VERBS),
            any(rule.allows_verb(verb) for verb in _ADMISSION_VERBS),
        )

    def spells(self, res: Resource) -> tuple[bool, bool]:
        """Whether the rule names ``res`` itself, and whether some subresource of it."""
        if not self.rule.allows_group(res.group):
            return False, False
        itself = self.star or res.resource in self.itself
        return itself, self.star or self.star_sub or res.resource in self.bases

    def reaches(self, res: Resource) -> bool:
        """Something on ``res`` or one of its subresources, whatever the verb and name."""
        return any(self.spells(res))

    def grants_writes(self, res: Resource) -> bool:
        """A write of ``res``, or any verb admission sees on one of its subresources."""
        itself, sub = self.spells(res)
        return (itself and self.writes) or (sub and self.admits)

    @property
    def scans(self) -> bool:
        """Whether the rule may reach resources it does not name (``*``, ``*/sub``)."""
        return self.star or self.star_sub


def named(restrictions: Restrictions, resources: Iterable[Resource]) -> frozenset[Resource]:
    """The ``resources`` (group and resource, no subresource) the label rule may restrict: those
    a resource pattern of some annotation names, or a rule of a role with a broken annotation
    reaches, bound or not.

    Linear in the distinct resource patterns and broken roles' rules (``Snapshot.restrictions``),
    not in the roles: tenants' roles restrict the same few resources."""
    candidates = {Resource(res.group, res.resource) for res in resources}
    found: set[Resource] = set()
    # A literal resource name is looked up; only wildcard patterns are compared with every
    # candidate left.
    by_name: dict[str, set[Resource]] = {}
    for res in candidates:
        by_name.setdefault(res.resource, set()).add(res)
    for pattern in restrictions.patterns:
        if pattern.resource.is_literal:
            hit = {r for r in by_name.get(pattern.resource.text, ()) if names(pattern, r)}
        else:
            hit = {r for r in candidates if names(pattern, r)}
        candidates -= hit
        found |= hit
        for res in hit:
            by_name[res.resource].discard(res)
        if not candidates:
            return frozenset(found)
    for reach in map(_Reach.of, restrictions.broken_rules):
        hit = {res for res in candidates if reach.reaches(res)}
        candidates -= hit
        found |= hit
    return frozenset(found)


def unjudged(restrictions: Restrictions, served: Iterable[Resource]) -> tuple[str, ...]:
    """The keys of the served namespaced resources the label rule always allows, sorted."""
    candidates = {
        Resource(res.group, res.resource)
        for res in served
        if (res.group, res.resource) not in ALWAYS_JUDGED
    }
    candidates = {res for res in candidates if is_key(key(res))}
    candidates -= named(restrictions, candidates)
    return tuple(sorted(key(res) for res in candidates))


# -- The fence --------------------------------------------------------------------------------

# The most glob matches one check may spend on wildcard patterns and ``*`` rules (each compared
# with every resource left out); a role needing more is refused until fewer are left out. A
# Role's author chooses its patterns and rules: this keeps one check under a few hundredths of a
# second whatever they wrote. Literal patterns and rules are looked up, never scanned.
FENCE_WORK = 50_000


class _TooLarge(Exception):
    pass


@functools.lru_cache(maxsize=2)
def _catalog(unjudged: frozenset[str]) -> tuple[list[Resource], dict[str, list[Resource]]]:
    """The resources left out, and by resource name. Built once per registration read (the
    source hands out the same set until the registration changes)."""
    every = [Resource.parse(text) for text in sorted(unjudged)]
    by_name: dict[str, list[Resource]] = {}
    for res in every:
        by_name.setdefault(res.resource, []).append(res)
    return every, by_name


class _Index:
    """The resources a registration leaves out, and the work one check has spent on them."""

    def __init__(self, unjudged: frozenset[str]) -> None:
        self.all, self.by_name = _catalog(unjudged)
        self.work = 0

    def scan(self) -> list[Resource]:
        self.work += len(self.all)
        if self.work > FENCE_WORK:
            raise _TooLarge
        return self.all


def _restricted(permissions: Permissions, index: _Index) -> set[Resource]:
    """The resources left out that an entry of ``permissions`` names."""
    found: set[Resource] = set()
    for entry in permissions.entries:
        literal = entry.resource.is_literal
        for res in index.by_name.get(entry.resource.text, ()) if literal else index.scan():
            if names(entry, res):
                found.add(res)
    return found


def _written(rules: Iterable[Rule], index: _Index) -> set[Resource]:
    """The resources left out that ``rules`` grant writes of, or a CONNECT of a subresource."""
    found: set[Resource] = set()
    for reach in map(_Reach.of, {id(rule): rule for rule in rules}.values()):
        if not reach.admits:
            continue
        if reach.scans:
            found.update(res for res in index.scan() if reach.grants_writes(res))
            continue
        for name in reach.itself | reach.bases:
            found.update(res for res in index.by_name.get(name, ()) if reach.grants_writes(res))
    return found


def _pending(
    role: CompiledRole, unjudged: frozenset[str], before: Iterable[Rule] = ()
) -> list[str]:
    """The resources left out that ``role`` restricts (a broken role: all) and grants writes of,
    that the rules ``before`` did not grant. Raises ``_TooLarge``."""
    if UNKNOWN in unjudged:  # the list is unreadable: whatever the role restricts may be out
        if role.error is None and role.permissions is None:
            return []
        return [e.pattern for e in role.permissions.entries] if role.permissions else ["*"]
    index = _Index(unjudged)
    pending = _written(role.rules, index)
    if role.error is None:
        pending &= _restricted(role.permissions, index) if role.permissions else set()
    pending -= _written(before, index)
    return sorted(key(res) for res in pending)


def _refusal(kind: str, name: str, resource: str, role: CompiledRole, advice: str) -> Decision:
    what = f"restricted by {role.ref}" if role.error is None else f"granted by {role.ref} (void)"
    return Decision.deny(
        REASON,
        f'{kind} "{name}" cannot be written yet: resource "{resource}" {what} is not yet '
        "judged by label-rbac everywhere (its webhook registration, or the policy it compiles, "
        "is being updated); "
        f"{advice}",
        f"the registration leaves {resource} to the API server alone until label-rbac's "
        "controller covers it",
        mode=role.mode if role.error is None else ENFORCE,
    )


def _too_large(kind: str, name: str, role: CompiledRole, count: int) -> Decision:
    return Decision.deny(
        REASON,
        f'{kind} "{name}" cannot be written yet: {role.ref} has too many wildcard resource '
        f"patterns and rules to check against the {count} resources label-rbac's webhook "
        "registration leaves out; name the resources it restricts and grants literally, or "
        "retry once the registration covers them",
        mode=role.mode if role.error is None else ENFORCE,
    )


def _binding(request: Request, obj: Any, ctx: Context, unjudged: frozenset[str]) -> Decision | None:
    kind = RBAC_RESOURCES[request.resource.resource].kind
    compiler = ctx.options.compiler
    binding = compiler.binding(obj, kind)
    if binding is None:
        return None
    role = ctx.snapshot.roles.get(binding.role)
    if role is None or (role.error is None and role.permissions is None):
        return None  # grants nothing now, or nothing the label rule restricts
    replaced = request.old_object if request.operation == "UPDATE" else None
    old = compiler.binding(replaced, kind) if replaced is not None else None
    if not binding.hands_out_more_than(old):
        return None
    try:
        pending = _pending(role, unjudged)
    except _TooLarge:
        return _too_large(kind, request.name, role, len(unjudged))
    if not pending:
        return None
    return _refusal(kind, request.name, pending[0], role, "retry in a moment")


def _role(request: Request, obj: Any, ctx: Context) -> Decision | None:
    registration = ctx.registration
    assert registration is not None
    kind = RBAC_RESOURCES[request.resource.resource].kind
    compiler = ctx.options.compiler
    new = compiler.role(obj, kind)
    if new.error is not None or new.permissions is None or new.ref not in registration.referred:
        return None  # refused elsewhere, restricts nothing, or bound to nobody yet
    old_rules: tuple[Rule, ...] = ()
    if request.operation == "UPDATE" and request.old_object is not None:
        old_rules = compiler.role(request.old_object, kind).rules
    try:
        pending = _pending(new, registration.unjudged, old_rules)
    except _TooLarge:
        return _too_large(kind, request.name, new, len(registration.unjudged))
    if not pending:
        return None
    return _refusal(
        kind,
        request.name,
        pending[0],
        new,
        "retry in a moment, or add the annotation entry first and grant the resource in a "
        "later write",
    )


def check_coverage(request: Request, ctx: Context) -> Decision | None:
    """Refuse a write that would let subjects write, unjudged, a resource a role restricts."""
    registration = ctx.registration
    res = request.resource
    obj = request.object
    if (
        registration is None
        or not registration.unjudged
        or res.group != RBAC_GROUP
        or res.subresource
        or request.operation not in ("CREATE", "UPDATE")
        or obj is None
    ):
        return None
    if res.resource in _BINDINGS:
        return _binding(request, obj, ctx, registration.unjudged)
    if res.resource in _ROLES:
        return _role(request, obj, ctx)
    return None
