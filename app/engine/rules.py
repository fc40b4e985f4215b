"""What one user may do in one namespace, rule by rule, with the labels each grant is held to:
``check --list``, as ``kubectl auth can-i --list`` lists a SelfSubjectRulesReview, from the
roles the user's bindings name (RoleBindings in the namespace, every ClusterRoleBinding).

A rule's verbs split in two: those a label permission narrows (``model.RESTRICTED_VERBS``, less
the reads ``--unrestricted-reads`` leaves to RBAC), held to the role's entries for the resource,
and the others (``bind``, ``use``, a custom verb...), which RBAC alone decides.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from app.engine.model import READ_VERBS, RESTRICTED_VERBS, Resource, UserInfo
from app.engine.policy import Entry
from app.engine.rbac import Binding, CompiledRole, RoleRef, Rule, Snapshot

# Members of this group pass every authorizer of the API server, RBAC or not.
SUPERUSERS = "system:masters"


@dataclass(frozen=True, slots=True)
class Allowance:
    """One row: verbs on a resource (``*`` and ``*/sub`` as the rule spells them), through one
    role, and what labels the objects must carry.

    ``scoped``: the verbs are ones a label permission narrows. Then ``entries`` are the role's
    requirements (all must hold; () none), ``others`` whether a resource the wildcard covers but
    no entry names takes any labels, and ``error`` a broken annotation (nothing granted then).
    """

    resource: str
    names: tuple[str, ...]
    verbs: tuple[str, ...]
    role: RoleRef | None
    binding: Binding | None
    scoped: bool
    entries: tuple[Entry, ...] = ()
    others: bool = False
    error: str | None = None
    mode: str = "enforce"

    @property
    def limits(self) -> str:
        """The labels, as a sentence: ``team in [a]``, ``any``, ``none (...)``."""
        if not self.scoped:
            return "any (not label-scoped)"
        if self.error is not None:
            return f"none: {self.role} grants nothing here ({self.error})"
        if not self.entries:
            return "any"
        if self.others or len({e.pattern for e in self.entries}) > 1:
            text = "; ".join(f"{e.pattern}: {e.describe()}" for e in self.entries)
            return text + ("; other resources: any" if self.others else "")
        return " and ".join(e.describe() for e in self.entries)


def allowances(
    snapshot: Snapshot,
    user: UserInfo,
    namespace: str,
    reads_unrestricted: Callable[[Resource], bool],
) -> list[Allowance]:
    """Every rule of every role bound to ``user`` in ``namespace`` (or cluster-wide), per
    resource, sorted by resource; ``system:masters`` first, as everything."""
    found: list[Allowance] = []
    if SUPERUSERS in user.groups:
        found.append(Allowance("*.*", (), ("*",), None, None, scoped=False))
    for binding, role in snapshot.roles_for(user, namespace):
        for rule in role.rules:
            for group in sorted(rule.groups):
                for spelled in sorted(rule.resources):
                    found += _rows(role, binding, group, spelled, rule, reads_unrestricted)
    return sorted(found, key=lambda a: (a.role is not None, a.resource, not a.scoped))


def _rows(
    role: CompiledRole,
    binding: Binding,
    group: str,
    spelled: str,
    rule: Rule,
    reads_unrestricted: Callable[[Resource], bool],
) -> list[Allowance]:
    base, _, sub = spelled.partition("/")
    resource = Resource(group, base, sub)
    free_reads = reads_unrestricted(resource)
    scoped = sorted(
        v for v in rule.verbs if v in RESTRICTED_VERBS and not (free_reads and v in READ_VERBS)
    )
    other = sorted(v for v in rule.verbs if v not in scoped)
    shown = str(resource)  # as kubectl prints it: deployments.apps/scale, *.*
    names = tuple(sorted(rule.names))
    rows = []
    if scoped:
        entries, others = _entries(role, resource)
        rows.append(
            Allowance(shown, names, tuple(scoped), role.ref, binding, True, entries, others,
                      role.error, role.mode)
        )  # fmt: skip
    if other:
        rows.append(Allowance(shown, names, tuple(other), role.ref, binding, False))
    return rows


def _entries(role: CompiledRole, resource: Resource) -> tuple[tuple[Entry, ...], bool]:
    """The role's entries for ``resource``; for a wildcard, all of them, and whether the
    resources no entry names are left free."""
    permissions = role.permissions
    if permissions is None:
        return (), False
    if "*" in (resource.resource, resource.group, resource.subresource):
        universal = any(
            e.resource.is_universal and e.group is None and e.subresource is None
            for e in permissions.entries
        )
        return permissions.entries, not universal
    return permissions.entries_for(resource), False
