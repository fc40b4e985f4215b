"""Incremental updates of a ``Snapshot``: a change costs what the changed object touches.

A live cluster changes a few objects at a time. ``LiveSnapshot`` is a snapshot together with what
it takes to update it without indexing everything again: every compiled object present, by
identity, and for every role the bindings that refer to it. ``apply`` takes the changes the
watches report — ``(kind, old, new)`` compiled values, ``None`` for absent — and returns a new
``LiveSnapshot`` whose snapshot shares every namespace's index, role and trie node it did not
touch with the previous one (all its mappings are persistent):

- a Namespace or Node change sets one entry;
- a binding change takes its old entries out of its namespace's index and puts its new ones in;
- a role change resolves again the bindings that refer to it, and only those.

Objects are counted per identity as a multiset, so that any sequence of reported changes — even
one where, for a moment, two objects share a name (a re-list after a delete and re-create
reports the new object before the old one's removal) — leaves the snapshot ``Snapshot.build``
gives for the objects present. A batch touching a large part of the objects (the first list, a
re-list after a long disconnection) is indexed whole.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import immutables

from app.engine.kinds import BINDING_KINDS, NAMESPACE, NODE, ROLE_KINDS
from app.engine.rbac import (
    Binding,
    BindingIndex,
    CompiledRole,
    Pair,
    RoleChange,
    RoleRef,
    Scope,
    Snapshot,
    SubjectKey,
    in_order,
    limits,
)

# (kind, the compiled object before the change, after it): None when absent.
Change = tuple[str, Any, Any]

ROLES, BINDINGS, NAMESPACES, NODES = "roles", "bindings", "namespaces", "nodes"
CATEGORIES: Mapping[str, str] = {
    **{spec.kind: ROLES for spec in ROLE_KINDS},
    **{spec.kind: BINDINGS for spec in BINDING_KINDS},
    NAMESPACE.kind: NAMESPACES,
    NODE.kind: NODES,
}
# An object's identity within its category: at most one object of each at a time in a cluster.
IDENTITY: Mapping[str, Callable[[Any], Hashable]] = {
    ROLES: lambda role: role.ref,
    BINDINGS: lambda binding: (binding.namespace, binding.name),
    NAMESPACES: lambda namespace: namespace[0],  # (name, annotations)
    NODES: lambda node: node[0],  # (name, KnownNode)
}
# Index whole when a batch touches more than this share of the objects: updating one object
# costs about as much as indexing a few thousand.
WHOLE_SHARE = 0.25

# Per category, identity → the object present (or ``_Several``, for a moment).
Objects = Mapping[str, immutables.Map[Hashable, Any]]
# Role → the one binding referring to it, or a map (namespace, name) → binding of two or more.
# (A role usually has one; a map for each would cost more than the rest of the index.)
Referrers = immutables.Map[RoleRef, "Binding | immutables.Map[tuple[str, str], Binding]"]


class _Several(tuple[Any, ...]):
    """Two or more objects present under one identity; the last is the one indexed."""

    __slots__ = ()


def _present(found: Any) -> tuple[Any, ...]:
    if found is None:
        return ()
    return found if isinstance(found, _Several) else (found,)


def _stored(present: tuple[Any, ...]) -> Any:
    return None if not present else present[0] if len(present) == 1 else _Several(present)


@dataclass(frozen=True)
class LiveSnapshot:
    """A snapshot and what it takes to apply changes to it (see the module docstring).

    ``objects``: per category, identity → the compiled object present under it (for a moment
    ``_Several``, the last being the one indexed). ``referrers``: role → the bindings referring
    to it, whether that role exists or not.
    """

    snapshot: Snapshot
    objects: Objects
    referrers: Referrers

    @classmethod
    def empty(cls) -> LiveSnapshot:
        return cls.of({category: immutables.Map() for category in IDENTITY})

    @classmethod
    def build(cls, compiled: Mapping[str, Iterable[Any]]) -> LiveSnapshot:
        """From compiled objects given per kind, as ``kinds.build_snapshot`` takes them."""
        changes = ((kind, None, value) for kind, values in compiled.items() for value in values)
        return cls.empty().apply(changes, whole=True)

    @classmethod
    def of(cls, objects: Objects) -> LiveSnapshot:
        """Index ``objects`` whole: the reference that ``apply`` agrees with."""

        def present(category: str) -> list[Any]:
            return [_present(found)[-1] for found in objects[category].values()]

        bindings: list[Binding] = present(BINDINGS)
        snapshot = Snapshot.build(
            present(ROLES), bindings, dict(present(NAMESPACES)), dict(present(NODES))
        )
        referrers: dict[RoleRef, dict[tuple[str, str], Binding]] = defaultdict(dict)
        for binding in bindings:
            referrers[binding.role][(binding.namespace, binding.name)] = binding
        referring: Referrers = immutables.Map(
            {ref: _compact(immutables.Map(found.items())) for ref, found in referrers.items()}
        )
        return cls(snapshot, objects, referring)

    def __len__(self) -> int:
        return sum(len(found) for found in self.objects.values())

    def apply(self, changes: Iterable[Change], whole: bool | None = None) -> LiveSnapshot:
        """The state after ``changes``, in order; ``whole`` forces (True) or forbids (False)
        indexing everything again, which by default happens for large batches only."""
        objects, before = _count(self.objects, changes)
        if whole is None:
            whole = len(before) > WHOLE_SHARE * sum(len(found) for found in objects.values())
        if whole:
            return LiveSnapshot.of(objects)
        net: list[tuple[str, Hashable, Any, Any]] = []
        for (category, key), old in before.items():
            present = _present(objects[category].get(key))
            new = present[-1] if present else None
            if new is not old:
                net.append((category, key, old, new))
        return self._updated(objects, net)

    def _updated(self, objects: Objects, net: list[tuple[str, Hashable, Any, Any]]) -> LiveSnapshot:
        snapshot = self.snapshot
        roles = snapshot.roles.mutate()
        namespaces = snapshot.namespaces.mutate()
        nodes = snapshot.nodes.mutate()
        changed_roles: list[RoleRef] = []
        replaced: list[RoleChange] = []
        changed_bindings: list[tuple[Binding | None, Binding | None]] = []
        for category, key, old, new in net:
            if category == ROLES:
                _put(roles, key, new)
                changed_roles.append(key)  # type: ignore[arg-type]
                replaced.append((old, new))
            elif category == BINDINGS:
                changed_bindings.append((old, new))
            else:
                # (name, annotations) or (name, KnownNode): the name maps to the second.
                value = None if new is None else new[1]
                _put(namespaces if category == NAMESPACES else nodes, key, value)
        # Unchanged roles keep their map, so a reader can tell a bindings-only batch at once.
        resolved: immutables.Map[RoleRef, CompiledRole] = (
            roles.finish() if changed_roles else snapshot.roles
        )
        index = _Editor(snapshot.bindings)
        referrers = self.referrers.mutate()
        done: set[tuple[str, str]] = set()
        for old, new in changed_bindings:
            if old is not None:
                _refer(referrers, old, present=False)
                index.remove(old)
            if new is not None:
                _refer(referrers, new, present=True)
                role = resolved.get(new.role)
                if role is not None:
                    index.add(new, role)
            done.add(_identity(old or new))
        referring: Referrers = referrers.finish()
        for ref in changed_roles:
            role = resolved.get(ref)
            for key, binding in _referring(referring.get(ref)).items():
                if key not in done:
                    index.remove(binding)
                    if role is not None:
                        index.add(binding, role)
        restrictions = (
            snapshot.restrictions_after(replaced) if replaced else snapshot.known_restrictions
        )
        updated = Snapshot(
            resolved, index.finish(), namespaces.finish(), nodes.finish(), restrictions
        )
        return LiveSnapshot(updated, objects, referring)


def _identity(binding: Binding | None) -> tuple[str, str]:
    assert binding is not None
    return (binding.namespace, binding.name)


def _count(
    objects: Objects, changes: Iterable[Change]
) -> tuple[Objects, dict[tuple[str, Hashable], Any]]:
    """The objects after ``changes``, and what was indexed under each touched identity before."""
    mutations = {category: found.mutate() for category, found in objects.items()}
    before: dict[tuple[str, Hashable], Any] = {}
    for kind, old, new in changes:
        category = CATEGORIES[kind]
        identity, mutation = IDENTITY[category], mutations[category]
        for value, adding in ((old, False), (new, True)):
            if value is None:
                continue
            key = identity(value)
            present = _present(mutation.get(key))
            before.setdefault((category, key), present[-1] if present else None)
            present = (*present, value) if adding else _without(present, value)
            _put(mutation, key, _stored(present))
    return {category: m.finish() for category, m in mutations.items()}, before


def _without(found: tuple[Any, ...], value: Any) -> tuple[Any, ...]:
    """``found`` less one occurrence of ``value`` (the very object, else an equal one)."""
    for i, item in enumerate(found):
        if item is value:
            return found[:i] + found[i + 1 :]
    for i, item in enumerate(found):
        if item == value:
            return found[:i] + found[i + 1 :]
    return found  # not present: nothing to take out


def _put(mutation: Any, key: Hashable, value: Any) -> None:
    if value is not None:
        mutation[key] = value
    elif key in mutation:
        del mutation[key]


def _refer(referrers: Any, binding: Binding, *, present: bool) -> None:
    """Add or remove ``binding`` among those referring to its role."""
    found = _referring(referrers.get(binding.role))
    key = (binding.namespace, binding.name)
    if present:
        found = found.set(key, binding)
    elif key in found:
        found = found.delete(key)
    _put(referrers, binding.role, _compact(found))


def _compact(found: immutables.Map[tuple[str, str], Binding]) -> Any:
    """How ``Referrers`` holds ``found``: nothing, the one binding, or the map."""
    return None if not found else next(iter(found.values())) if len(found) == 1 else found


def _referring(found: Any) -> immutables.Map[tuple[str, str], Binding]:
    """What ``Referrers`` holds for a role, as a map."""
    if found is None:
        return immutables.Map()
    if isinstance(found, Binding):
        return immutables.Map({(found.namespace, found.name): found})
    return found


class _Editor:
    """Edits to a ``BindingIndex``: each touched namespace's entries are copied once, edited,
    and put into a new index sharing every other namespace with the old one."""

    def __init__(self, index: BindingIndex) -> None:
        self._index = index
        self._entries: dict[str, dict[SubjectKey, tuple[Pair, ...]]] = {}
        self._touched: dict[str, set[SubjectKey]] = defaultdict(set)

    def _scope(self, name: str) -> dict[SubjectKey, tuple[Pair, ...]]:
        entries = self._entries.get(name)
        if entries is None:
            scope = self._index.scopes.get(name)
            entries = self._entries[name] = dict(scope.entries) if scope is not None else {}
        return entries

    def remove(self, binding: Binding) -> None:
        """Take out the binding's entries, whatever role they were resolved to."""
        entries, touched = self._scope(binding.namespace), self._touched[binding.namespace]
        for key in dict.fromkeys(binding.subjects):
            pairs = entries.get(key)
            if pairs is None:
                continue
            kept = tuple(pair for pair in pairs if pair[0].name != binding.name)
            if kept:
                entries[key] = kept
            else:
                del entries[key]
            touched.add(key)

    def add(self, binding: Binding, role: CompiledRole) -> None:
        entries, touched = self._scope(binding.namespace), self._touched[binding.namespace]
        for key in dict.fromkeys(binding.subjects):
            entries[key] = in_order((*entries.get(key, ()), (binding, role)))
            touched.add(key)

    def finish(self) -> BindingIndex:
        old = self._index.scopes
        scopes = old.mutate()
        size = len(self._index)
        for name, entries in self._entries.items():
            prior = old.get(name)
            size += len(entries) - (len(prior.entries) if prior is not None else 0)
            if not entries:
                _put(scopes, name, None)
                continue
            limited = set(prior.limited) if prior is not None else set()
            for key in self._touched[name]:
                pairs = entries.get(key)
                if pairs and any(limits(role) for _, role in pairs):
                    limited.add(key)
                else:
                    limited.discard(key)
            scopes[name] = Scope(entries, frozenset(limited))
        return BindingIndex(scopes.finish(), size)
