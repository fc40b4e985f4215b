"""RBAC as the engine needs it: compiled rules, roles, bindings and the indexed ``Snapshot``.

Rule matching follows the Kubernetes RBAC authorizer, one predicate per rule field (verbs,
apiGroups, resources with ``*``, ``res/sub`` and ``*/sub``, resourceNames). Objects are compiled
once, when loaded or when a watch event arrives; a ``Snapshot`` is immutable, so the request path
reads it without locks.
"""

from __future__ import annotations

import weakref
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import immutables

from app.engine.glob import Glob
from app.engine.model import (
    ENFORCE,
    MODES,
    SERVICE_ACCOUNT_PREFIX,
    Authorization,
    Resource,
    UserInfo,
    annotations_of,
    mapping_items,
)
from app.engine.placement import DEFAULT_PLACEMENT_KEY, Placement, placement_of
from app.engine.policy import AnnotationError, Entry, Permissions, permissions_of

RBAC_GROUP = "rbac.authorization.k8s.io"
# A role's enforcement mode for its label limits, to roll a new restriction out gradually.
MODE_ANNOTATION = "labelrbac.io/mode"
USER = "User"
GROUP = "Group"


class MalformedObject(ValueError):
    """An RBAC object whose fields do not have the shape the API defines."""


def _text(mapping: Any, field: str) -> str:
    """A string field, "" when absent or of another type, or when ``mapping`` is not one (a
    ``metadata: [..]`` in a file): such an object then grants nothing."""
    value = mapping.get(field) if isinstance(mapping, Mapping) else None
    return value if isinstance(value, str) else ""


def _strings(rule: Mapping[str, Any], field: str) -> frozenset[str]:
    value = rule.get(field)
    if value is None:
        return frozenset()
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise MalformedObject(f"{field} must be a list of strings")
    return frozenset(value)


@dataclass(frozen=True, slots=True, weakref_slot=True)
class Rule:
    """One PolicyRule. Empty ``names`` means any name."""

    verbs: frozenset[str]
    groups: frozenset[str]
    resources: frozenset[str]
    names: frozenset[str] = frozenset()

    @classmethod
    def compile(cls, rule: Any) -> Rule:
        """Compile one PolicyRule; raises ``MalformedObject`` when it is not shaped like one."""
        if not isinstance(rule, Mapping):
            raise MalformedObject("each rule must be an object")
        return cls(
            verbs=_strings(rule, "verbs"),
            groups=_strings(rule, "apiGroups"),
            resources=_strings(rule, "resources"),
            names=_strings(rule, "resourceNames"),
        )

    # One predicate per rule field, as pkg/apis/rbac/v1/evaluation_helpers.go: VerbMatches,
    # APIGroupMatches, ResourceMatches, ResourceNameMatches. Which verb and name RBAC saw for an
    # admission request is the mapping's business (``model.authorizations``), not the rule's.

    def allows_verb(self, verb: str) -> bool:
        return "*" in self.verbs or verb in self.verbs

    def allows_group(self, group: str) -> bool:
        # An empty apiGroups list matches nothing; [""] is the core group.
        return "*" in self.groups or group in self.groups

    def allows_resource(self, res: Resource) -> bool:
        """``*``, the exact ``res`` or ``res/sub``, or ``*/sub`` for any resource's ``sub``."""
        if "*" in self.resources:
            return True
        if not res.subresource:
            return res.resource in self.resources
        return (
            f"{res.resource}/{res.subresource}" in self.resources
            or f"*/{res.subresource}" in self.resources
        )

    def allows_name(self, name: str) -> bool:
        """No resourceNames: any name. Otherwise the name RBAC saw must be listed, so a rule
        with resourceNames never grants a request whose URL named no object."""
        return not self.names or name in self.names

    def covers_resource(self, res: Resource) -> bool:
        return self.allows_group(res.group) and self.allows_resource(res)

    def matches(self, verb: str, res: Resource, name: str) -> bool:
        return (
            self.allows_verb(verb)
            and self.allows_group(res.group)
            and self.allows_resource(res)
            and self.allows_name(name)
        )


@dataclass(frozen=True, slots=True)
class RoleRef:
    """A Role (``namespace`` set) or ClusterRole (``namespace`` empty)."""

    namespace: str
    name: str

    @property
    def kind(self) -> str:
        return "Role" if self.namespace else "ClusterRole"

    def __str__(self) -> str:
        return (
            f"role {self.namespace}/{self.name}" if self.namespace else f"clusterrole {self.name}"
        )


@dataclass(frozen=True)
class CompiledRole:
    """A Role/ClusterRole with its rules and permission annotation compiled.

    ``error`` is set when the annotation is unusable: such a role grants nothing through this
    webhook for the resources it grants in RBAC (an invalid annotation never widens access).
    ``mode`` (``labelrbac.io/mode``) says whether denials its label limits cause are enforced.
    ``placement`` (``labelrbac.io/placement``): where the pods it lets its holders write may run
    (``app.engine.scheduling``); an invalid one voids the role as an invalid permission
    annotation does.
    """

    ref: RoleRef
    rules: tuple[Rule, ...]
    permissions: Permissions | None = None
    error: str | None = None
    version: str = field(default="", compare=False)
    mode: str = ENFORCE
    placement: Placement | None = None

    def grants(self, verbs: Sequence[str], res: Resource, name: str) -> bool:
        for rule in self.rules:  # loops, not any(): this runs for every bound role per request
            for verb in verbs:
                if rule.matches(verb, res, name):
                    return True
        return False


@dataclass(frozen=True, slots=True)
class Binding:
    """A RoleBinding (``namespace`` set) or ClusterRoleBinding, with subjects as index keys."""

    namespace: str
    name: str
    role: RoleRef
    subjects: tuple[tuple[str, str], ...]

    def __str__(self) -> str:
        if self.namespace:
            return f"rolebinding {self.namespace}/{self.name}"
        return f"clusterrolebinding {self.name}"

    def hands_out_more_than(self, old: Binding | None) -> bool:
        """Whether this binding, replacing ``old``, gives its role to someone new: always on a
        create, or when the role or a subject changed (dropping subjects hands out nothing)."""
        return old is None or old.role != self.role or not set(self.subjects) <= set(old.subjects)


@dataclass(frozen=True, slots=True)
class KnownNode:
    """A Node as the snapshot keeps it: the uid (the node rules' owner references) and the
    labels (where a placement lets pods be bound)."""

    uid: str
    labels: Mapping[str, str] = field(default_factory=immutables.Map)


@dataclass(frozen=True)
class Compiler:
    """Turns raw RBAC objects into compiled ones, with the configured annotation keys."""

    annotation_keys: tuple[str, ...]
    default_label_key: str | None = None
    placement_keys: tuple[str, ...] = (DEFAULT_PLACEMENT_KEY,)

    def permissions(self, obj: Mapping[str, Any]) -> Permissions | None:
        """The object's permissions; raises ``AnnotationError`` when the annotation is invalid."""
        return permissions_of(annotations_of(obj), self.annotation_keys, self.default_label_key)

    def role(self, obj: Mapping[str, Any], kind: str | None = None) -> CompiledRole:
        """Compile a Role or ClusterRole. List items carry no ``kind``: pass it then."""
        meta = obj.get("metadata") or {}
        cluster_role = (kind or obj.get("kind")) == "ClusterRole"
        ref = RoleRef("" if cluster_role else _text(meta, "namespace"), _text(meta, "name"))
        version = _text(meta, "resourceVersion")
        if not isinstance(meta, Mapping):
            return CompiledRole(ref, (), None, "malformed metadata: not a mapping", version)
        try:
            rules = _compile_rules(obj.get("rules"))
        except MalformedObject as exc:
            # Grants nothing through this webhook, like an invalid annotation.
            return CompiledRole(ref, (), None, f"malformed rules: {exc}", version)
        try:
            permissions, error = self.permissions(obj), None
        except AnnotationError as exc:
            permissions, error = None, str(exc)
        try:
            placement = placement_of(annotations_of(obj), self.placement_keys)
        except AnnotationError as exc:
            placement, error = None, error or str(exc)
        mode = annotations_of(obj).get(MODE_ANNOTATION, ENFORCE)
        if mode not in MODES:
            # Unknown means strictest; and the role is as void as with a broken annotation.
            error = error or (
                f"invalid {MODE_ANNOTATION} annotation {mode!r}: expected one of {', '.join(MODES)}"
            )
            mode = ENFORCE
        return CompiledRole(ref, rules, permissions, error, version, mode, placement)

    @staticmethod
    def namespace(obj: Mapping[str, Any]) -> tuple[str, dict[str, str]]:
        """A Namespace as the node rules read it: its name and annotations."""
        return _text(obj.get("metadata") or {}, "name"), dict(annotations_of(obj))

    @staticmethod
    def node(obj: Mapping[str, Any]) -> tuple[str, KnownNode]:
        """A Node as the rules read it: its name, uid and labels."""
        meta = obj.get("metadata") or {}
        labels = meta.get("labels") if isinstance(meta, Mapping) else None
        return _text(meta, "name"), KnownNode(
            _text(meta, "uid"),
            immutables.Map(
                {k: v for k, v in labels.items() if isinstance(k, str) and isinstance(v, str)}
                if isinstance(labels, Mapping)
                else {}
            ),
        )

    @staticmethod
    def binding(obj: Mapping[str, Any], kind: str | None = None) -> Binding | None:
        """A compiled binding, or None when it cannot grant anything (unknown roleRef kind)."""
        meta = obj.get("metadata") or {}
        cluster_binding = (kind or obj.get("kind")) == "ClusterRoleBinding"
        namespace = "" if cluster_binding else _text(meta, "namespace")
        role_ref = obj.get("roleRef")
        if not isinstance(role_ref, Mapping) or not _text(role_ref, "name"):
            return None
        if role_ref.get("kind") == "ClusterRole":
            ref = RoleRef("", _text(role_ref, "name"))
        elif role_ref.get("kind") == "Role" and namespace:
            ref = RoleRef(namespace, _text(role_ref, "name"))
        else:
            return None
        return Binding(namespace, _text(meta, "name"), ref, subject_keys(obj, namespace))


# Compiled rules by value. Thousands of roles repeat the same few rules (one Role per tenant
# namespace), and a Rule is immutable, so equal rules share one object and its frozensets. The
# table holds them weakly: a rule leaves it with the last role that uses it, so roles rewritten
# with ever new rules (a resourceNames list is as long as a role may be) leave nothing behind.
_rules: weakref.WeakValueDictionary[tuple[frozenset[str], ...], Rule] = (
    weakref.WeakValueDictionary()
)


def _intern(rule: Rule) -> Rule:
    key = (rule.verbs, rule.groups, rule.resources, rule.names)
    found = _rules.get(key)
    if found is not None:
        return found
    _rules[key] = rule
    return rule


def _compile_rules(rules: Any) -> tuple[Rule, ...]:
    """A role's rules; those naming no resources (nonResourceURLs only) never reach admission."""
    if rules is None:
        return ()
    if not isinstance(rules, list):
        raise MalformedObject("rules must be a list")
    return tuple(_intern(rule) for rule in map(Rule.compile, rules) if rule.resources)


def subject_keys(binding: Mapping[str, Any], namespace: str) -> tuple[tuple[str, str], ...]:
    """Index keys for a binding's subjects. ServiceAccounts become their user names."""
    keys: list[tuple[str, str]] = []
    for subject in mapping_items(binding.get("subjects")):
        kind, name = subject.get("kind"), _text(subject, "name")
        if not name:
            continue
        if kind == "ServiceAccount":
            # Like the RBAC authorizer, an omitted namespace means the binding's namespace.
            sa_namespace = _text(subject, "namespace") or namespace
            keys.append((USER, f"{SERVICE_ACCOUNT_PREFIX}{sa_namespace}:{name}"))
        elif kind in (USER, GROUP):
            keys.append((kind, name))
    return tuple(keys)


def user_keys(user: UserInfo) -> tuple[tuple[str, str], ...]:
    return ((USER, user.username), *((GROUP, g) for g in user.groups))


# (subject kind, subject name) → what binds that subject, as ``user_keys`` makes them.
SubjectKey = tuple[str, str]
Pair = tuple[Binding, CompiledRole]


def limits(role: CompiledRole) -> bool:
    """Whether the role carries a permission or placement annotation (valid or not): its
    grants are limited."""
    return role.permissions is not None or role.error is not None or role.placement is not None


def in_order(pairs: Iterable[Pair]) -> tuple[Pair, ...]:
    """One subject's bindings in one scope, by binding name: the order never depends on the
    order objects arrived in, so a snapshot updated change by change equals one built whole."""
    found = tuple(pairs)
    return found if len(found) < 2 else tuple(sorted(found, key=lambda pair: pair[0].name))


@dataclass(frozen=True, slots=True)
class Scope:
    """The bindings of one namespace ("" for ClusterRoleBindings), by subject, each with its
    role resolved; ``limited`` holds the subjects bound here to a role with an annotation."""

    entries: Mapping[SubjectKey, tuple[Pair, ...]]
    limited: frozenset[SubjectKey]

    @classmethod
    def of(cls, entries: Mapping[SubjectKey, tuple[Pair, ...]]) -> Scope:
        return cls(
            entries,
            frozenset(key for key, pairs in entries.items() if any(limits(r) for _, r in pairs)),
        )


class BindingIndex(Mapping[tuple[str, str, str], tuple[Pair, ...]]):
    """(namespace or "" for cluster-wide, subject kind, subject name) → the bindings naming that
    subject in that scope, with their roles.

    Stored per scope in a persistent map (``immutables.Map``, a hash array mapped trie): a change
    to one namespace's bindings copies that namespace's entries and a few trie nodes, not the
    index of the whole cluster. ``scopes`` is what the request path reads.
    """

    __slots__ = ("_size", "scopes")

    def __init__(self, scopes: immutables.Map[str, Scope], size: int | None = None) -> None:
        self.scopes = scopes
        self._size = sum(len(s.entries) for s in scopes.values()) if size is None else size

    @classmethod
    def of(cls, flat: Mapping[tuple[str, str, str], Iterable[Pair]]) -> BindingIndex:
        """From flat ``(scope, kind, name) → pairs`` entries."""
        grouped: dict[str, dict[SubjectKey, tuple[Pair, ...]]] = defaultdict(dict)
        for (scope, kind, name), pairs in flat.items():
            grouped[scope][(kind, name)] = in_order(pairs)
        return cls(immutables.Map({name: Scope.of(e) for name, e in grouped.items()}))

    def __getitem__(self, key: tuple[str, str, str]) -> tuple[Pair, ...]:
        scope = self.scopes.get(key[0])
        if scope is None:
            raise KeyError(key)
        return scope.entries[(key[1], key[2])]

    def __iter__(self) -> Iterator[tuple[str, str, str]]:
        for name, scope in self.scopes.items():
            for kind, subject in scope.entries:
                yield (name, kind, subject)

    def __len__(self) -> int:
        return self._size


def index_bindings(
    roles: Mapping[RoleRef, CompiledRole], bindings: Iterable[Binding]
) -> BindingIndex:
    """Resolve each binding's role and index it by scope and subject; a binding whose role
    does not exist grants nothing and is left out."""
    grouped: dict[str, dict[SubjectKey, list[Pair]]] = defaultdict(lambda: defaultdict(list))
    for binding in bindings:
        role = roles.get(binding.role)
        if role is None or not binding.subjects:
            continue
        entries = grouped[binding.namespace]
        for key in dict.fromkeys(binding.subjects):
            entries[key].append((binding, role))
    return BindingIndex(
        immutables.Map(
            {
                name: Scope.of({key: in_order(pairs) for key, pairs in entries.items()})
                for name, entries in grouped.items()
            }
        )
    )


# A role replaced by another (either None: created or deleted).
RoleChange = tuple["CompiledRole | None", "CompiledRole | None"]


@dataclass(frozen=True, slots=True)
class Pattern:
    """Where a permission annotation entry points: its resource and group patterns (None: any
    group), as written. Which resources an entry names depends on these alone (``pods/exec``
    names ``pods``)."""

    resource: Glob
    group: Glob | None

    @classmethod
    def of(cls, entry: Entry) -> Pattern:
        return cls(entry.resource, entry.group)


def _of_cluster_role(role: CompiledRole | None) -> bool:
    return role is not None and not role.ref.namespace


@dataclass(frozen=True)
class Restrictions:
    """What the roles may restrict, for the coverage (``app.engine.coverage.unjudged``): each
    distinct resource pattern of the permission annotations, and each rule of a role whose
    annotation is broken (such a role grants nothing here, so what its rules grant must stay
    judged), with how many roles carry it.

    Counted by pattern rather than by annotation, so tenants' roles that differ in their labels
    but restrict the same resources add nothing to the work; rules are interned and counted by
    identity (the entry holds the rule, so its id cannot be reused while counted). Persistent,
    so a snapshot derived from another updates it by the roles that changed instead of passing
    over every role again.
    """

    patterns: immutables.Map[Pattern, int] = field(default_factory=immutables.Map)
    broken: immutables.Map[int, tuple[Rule, int]] = field(default_factory=immutables.Map)
    # The same of the ClusterRoles alone (None in that one): what every namespace's roles may
    # restrict, where a Role's restriction reaches its own namespace only.
    cluster: Restrictions | None = None

    @classmethod
    def of(cls, roles: Iterable[CompiledRole]) -> Restrictions:
        every = list(roles)
        cluster = cls._of(role for role in every if not role.ref.namespace)
        return replace(cls._of(every), cluster=cluster)

    @classmethod
    def _of(cls, roles: Iterable[CompiledRole]) -> Restrictions:
        # Roles share interned annotations and rules: each distinct one is read once.
        annotations: dict[int, tuple[Permissions, int]] = {}
        rules: dict[int, tuple[Rule, int]] = {}
        for role in roles:
            if role.error is not None:
                for rule in role.rules:
                    rules[id(rule)] = (rule, rules.get(id(rule), (rule, 0))[1] + 1)
            elif (found := role.permissions) is not None:
                annotations[id(found)] = (found, annotations.get(id(found), (found, 0))[1] + 1)
        patterns: dict[Pattern, int] = {}
        for permissions, count in annotations.values():
            for entry in permissions.entries:
                key = Pattern.of(entry)
                patterns[key] = patterns.get(key, 0) + count
        return cls(immutables.Map(patterns), immutables.Map(rules))

    def changed(self, changes: Iterable[RoleChange]) -> Restrictions:
        """These restrictions with each (old, new) role replaced."""
        every = list(changes)
        cluster = self.cluster
        of_cluster = [(old, new) for old, new in every if _of_cluster_role(old or new)]
        if cluster is not None and of_cluster:
            cluster = cluster._changed(of_cluster)
        return replace(self._changed(every), cluster=cluster)

    def _changed(self, changes: Iterable[RoleChange]) -> Restrictions:
        patterns, broken = self.patterns.mutate(), self.broken.mutate()
        for old, new in changes:
            for role, step in ((old, -1), (new, 1)):
                if role is None:
                    continue
                if role.error is not None:
                    for rule in role.rules:
                        count = broken.get(id(rule), (rule, 0))[1] + step
                        if count:
                            broken[id(rule)] = (rule, count)
                        else:
                            del broken[id(rule)]
                elif role.permissions is not None:
                    for entry in role.permissions.entries:
                        key = Pattern.of(entry)
                        count = patterns.get(key, 0) + step
                        if count:
                            patterns[key] = count
                        else:
                            del patterns[key]
        return Restrictions(patterns.finish(), broken.finish())

    @property
    def broken_rules(self) -> list[Rule]:
        return [rule for rule, _ in self.broken.values()]


@dataclass(frozen=True)
class Snapshot:
    """Everything the engine reads, indexed for the request path. Never mutated once built.

    Bindings are resolved to their roles at build time, so finding a user's roles is a handful
    of dictionary lookups. Every mapping is persistent (``immutables.Map``), so a new snapshot
    after a change shares all it does not change with the previous one
    (``app.engine.incremental``); ``build`` indexes a whole object set.
    """

    roles: immutables.Map[RoleRef, CompiledRole]
    bindings: BindingIndex
    namespaces: immutables.Map[str, Mapping[str, str]] = field(default_factory=immutables.Map)
    nodes: immutables.Map[str, KnownNode] = field(default_factory=immutables.Map)
    # ``restrictions()`` once asked for (only the compiler asks), then kept by derived snapshots.
    known_restrictions: Restrictions | None = field(default=None, compare=False, repr=False)

    def restrictions(self) -> Restrictions:
        """What the roles may restrict: one pass over the roles the first time it is asked for
        a snapshot not derived from one that knew it."""
        found = self.known_restrictions
        if found is None:
            found = Restrictions.of(self.roles.values())
            object.__setattr__(self, "known_restrictions", found)
        return found

    def restrictions_after(self, changes: Iterable[RoleChange]) -> Restrictions | None:
        """What a snapshot derived from this one by ``changes`` knows of its restrictions: this
        one's updated by them, or None (asked for later) when this one was never asked."""
        known = self.known_restrictions
        return None if known is None else known.changed(changes)

    def __post_init__(self) -> None:
        # Plain mappings (a literal snapshot in a test) become what ``build`` makes.
        for name in ("roles", "namespaces", "nodes"):
            if not isinstance(getattr(self, name), immutables.Map):
                object.__setattr__(self, name, immutables.Map(getattr(self, name)))
        if not isinstance(self.bindings, BindingIndex):
            object.__setattr__(self, "bindings", BindingIndex.of(self.bindings))

    @classmethod
    def build(
        cls,
        roles: Iterable[CompiledRole],
        bindings: Iterable[Binding],
        namespaces: Mapping[str, Mapping[str, str]] | None = None,
        nodes: Mapping[str, KnownNode] | None = None,
    ) -> Snapshot:
        """Index compiled objects. ``namespaces`` maps name→annotations, ``nodes`` name→Node."""
        by_ref = immutables.Map({role.ref: role for role in roles})
        return cls(
            roles=by_ref,
            bindings=index_bindings(by_ref, bindings),
            namespaces=immutables.Map(namespaces or {}),
            nodes=immutables.Map(nodes or {}),
        )

    def _scopes(self, namespace: str) -> Iterator[Scope]:
        scopes = self.bindings.scopes
        for name in (namespace, "") if namespace else ("",):
            scope = scopes.get(name)
            if scope is not None:
                yield scope

    def roles_for(self, user: UserInfo, namespace: str) -> Iterator[Pair]:
        """RoleBindings in ``namespace`` and all ClusterRoleBindings naming the user or a group,
        with their roles."""
        seen: set[int] = set()
        keys = user_keys(user)
        scopes = self.bindings.scopes
        for name in (namespace, "") if namespace else ("",):
            scope = scopes.get(name)
            if scope is None:
                continue
            entries = scope.entries
            for key in keys:
                for pair in entries.get(key, ()):
                    # Identity is enough: each binding exists once per snapshot.
                    if id(pair[0]) not in seen:
                        seen.add(id(pair[0]))
                        yield pair

    def limited(self, user: UserInfo, namespace: str) -> bool:
        """Whether a role bound to the user in ``namespace`` or cluster-wide carries an
        annotation (valid or not): without one, no label limit can apply to the user."""
        keys = user_keys(user)
        for scope in self._scopes(namespace):
            limited = scope.limited
            if limited and any(key in limited for key in keys):
                return True
        return False

    def bound_roles(self, user: UserInfo, namespace: str) -> list[CompiledRole]:
        """Distinct roles bound to the user in ``namespace`` or cluster-wide, in binding order."""
        seen: set[int] = set()
        found: list[CompiledRole] = []
        for _, role in self.roles_for(user, namespace):
            if id(role) not in seen:
                seen.add(id(role))
                found.append(role)
        return found

    def granting_roles(
        self, user: UserInfo, namespace: str, verbs: Sequence[str], res: Resource, name: str
    ) -> list[CompiledRole]:
        """Distinct roles that authorize the request in RBAC, in binding order."""
        return [r for r in self.bound_roles(user, namespace) if r.grants(verbs, res, name)]


def authorizing_roles(
    bound: Sequence[CompiledRole], res: Resource, alternatives: Sequence[Authorization]
) -> list[CompiledRole]:
    """The roles of ``bound`` granting any of ``alternatives``, in order. An alternative the API
    server checks only ``after`` other verbs counts when a bound role grants one of them."""
    found: list[CompiledRole] = []
    later: list[tuple[CompiledRole, Authorization]] = []
    for role in bound:
        only_after: Authorization | None = None
        for alt in alternatives:
            if role.grants((alt.verb,), res, alt.name):
                if not alt.after:
                    found.append(role)
                    break
                only_after = only_after or alt
        else:
            if only_after is not None:
                later.append((role, only_after))
    # Looked at only when it matters (most creates find no role beyond the nameless ones), and
    # once per alternative, so thousands of bound roles cost linear time.
    held: dict[Authorization, bool] = {}
    for role, alt in later:
        if alt not in held:
            held[alt] = any(r.grants(alt.after, res, alt.name) for r in bound)
        if held[alt]:
            found.append(role)
    return found
