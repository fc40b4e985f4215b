"""The label rule compiled for the API server: one parameter object per namespace.

With compilation on, a ValidatingAdmissionPolicy (``app.compiled.admission_policy``) judges the
common write path inside kube-apiserver: CREATE, UPDATE and DELETE of namespaced objects that carry
their own labels. Its CEL reads one ``LabelRbacParams`` object per namespace, rendered here from the
same ``Snapshot`` the webhook decides on, with the webhook's own RBAC matching
(``CompiledRole.grants``) and grant classification (``labels.classify``), so both front doors
agree on which roles grant a request and what they permit. ``spec``::

    mode: enforce | warn | audit          # the global mode
    allowUnlabeled: false
    indexed: [configmaps]                 # the resources judged here (the same everywhere)
    users: {alice: ["0"]}                 # subject → role ids, from the namespace's RoleBindings
    groups: {tenants: ["1"]}
    roles:                                # role id → resource → grant id, or operation → grant id
      "0": {configmaps: a}                # every operation (CREATE, UPDATE, DELETE,
                                          # DELETECOLLECTION) → a
      "1": {"*": b, secrets: {CREATE: d}} # "*": every indexed resource not named
    grants:
      a: {role: role t1/team-a, mode: enforce, allows: "role t1/team-a allows team in [a]",
          labels: [{key: team, exact: [a]}],   # prefixes, suffixes, patterns: when not empty
          names: [...]}
      b: {role: clusterrole edit, unrestricted: true}
      c: {role: role t1/broken, invalid: "role t1/broken grants nothing here: ..."}

The ClusterRoleBindings' part (``ClusterPart``: their subjects, the roles they bind and those
roles' grants, in the same shape) is the same for every namespace, so it is stored once: in the
policy itself, as CEL constants (``cluster_chunks``), which the API server builds once per
policy, not per write. Copied into every namespace it made the stored bytes grow as namespaces
times cluster-wide grants, and every ClusterRoleBinding edit a write of every namespace. So are
the served resources no annotation restricts (``ClusterPart.unjudged``, the constant
``unjudged_literal``): the same in every namespace, and changed by discovery (a CRD created or
deleted), which then writes the policy alone.

That is layout 2 (``LAYOUT``), which the policies read beside layout 1 (every entry a map of
operations, every requirement with its four lists, and before 0.3.4 the unjudged resources
listed too), the one an earlier release's policy reads: ``Target.earlier`` renders it.

A subject appears once per namespace, a role once however many subjects it is bound to, and a
grant once however many roles' resources and operations share it; lookups are by key, so the
policy's time does not grow with the bindings in a namespace. Subject lists keep the webhook's
order (a namespace's RoleBindings before ClusterRoleBindings, each by binding name), so denial
messages name the roles in the same order. Every namespace indexes the same resources: those
some annotation names (or a void role reaches), bound anywhere or not (``Target.index``); for
those every granting role is indexed, unrestricted ones included, so a subject RBAC authorizes
but the index does not know can only mean parameters older than RBAC (the policy then denies:
see ``admission_policy``), wherever the subject was bound a moment ago. The other resources
served are the cluster part's ``unjudged`` (allowed as they are); in a namespace marked compiled
the policy refuses, until it is compiled, a resource in neither list: one served since the
compiler last looked, which an annotation may restrict. A namespace's ``indexed`` wins over the
policy's ``unjudged``, so parameters and policy written at different moments never let a
restricted resource pass unjudged where the parameters index it; and the policy keeps listing a
resource only a Role's annotation has just started restricting until every namespace indexes it
(``settling``), so the pass over every namespace it starts never refuses other tenants' writes.

Globs become the cheapest test of their shape (``value_tests``): literals are looked up, ``x*``
and ``*x`` are ``startsWith`` and ``endsWith``, and the rest of a requirement's globs one anchored
RE2 pattern for CEL ``matches``: every character but the two wildcards is escaped, so a pattern
is an alternation of plain sequences of literals, ``.`` and ``.*``, which RE2 matches in linear
time. A namespace whose parameters would exceed ``max_bytes`` is never truncated: it is
rendered ``delegated`` (the policy stands aside and the webhook keeps judging it), and so is a
namespace where a role restricts an object's subresources more than the object's writes: a change
of the object's labels is then judged by those entries too (``labels.check_relabel``), which only
the webhook does. The compiler also leaves to the webhook a namespace where a denial would be
softened (a granting role's ``labelrbac.io/mode``, or the global mode, is warn or audit:
``Target.delegate_softened``): the warning or audit record is then the webhook's own, and the
enforcing policy is the only one a write of any other namespace costs (the warn and audit
policies of ``manifests/compiled/modes`` are needed only for parameters rendered without it).

Rendering is linear in what the roles say: each (role, resource, operation) looks at the role's
rules once and at the names those rules list once (``_names``), never at every name against
every rule. It is also bounded: ``Work`` counts the rules and names looked at, and a namespace
whose render would take more than ``max_work`` units is rendered ``delegated`` as well (the
render stops as soon as the count passes the budget), so a tenant's Role listing tens of
thousands of ``resourceNames`` costs the compiler a bounded slice, not a render longer than its
lease.
"""

from __future__ import annotations

import json
import threading
from collections import Counter, OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from typing import Any

from app.engine.context import Options
from app.engine.coverage import named
from app.engine.glob import ANY, STAR, Glob
from app.engine.incremental import BINDINGS, CATEGORIES, NAMESPACES, ROLES, Change, LiveSnapshot
from app.engine.kinds import RBAC_RESOURCES
from app.engine.labels import classify
from app.engine.model import ENFORCE, Resource
from app.engine.rbac import (
    RBAC_GROUP,
    Binding,
    CompiledRole,
    Restrictions,
    RoleRef,
    Rule,
    Scope,
    Snapshot,
)
from app.engine.workloads import RULES as WORKLOAD_RULES

API_VERSION = "labelrbac.io/v1alpha1"
KIND = "LabelRbacParams"
PLURAL = "labelrbacparams"
# Every namespace's parameter object has this name (the policy binding's ``paramRef.name``).
NAME = "label-rbac"
# The label the compiler puts on a Namespace once its parameters are compiled (not delegated):
# the webhook's namespaceSelector can see it, so the webhook leaves that namespace's plain writes
# to the policy, and the policy refuses writes in a namespace carrying it whose parameters are
# delegated, so a mark set by anyone else leaves nothing judged by neither.
MARK = "labelrbac.io/compiled"
# The label the compiler puts beside ``MARK`` on a compiled Namespace whose parameters soften a
# denial (``softened``): the warn and audit policies' bindings select only such namespaces, so
# elsewhere they cost the API server a label lookup, not an evaluation of their own.
SOFTENED_MARK = "labelrbac.io/softened"

# kube-apiserver refuses requests over 3 MiB and etcd values over 1.5 MiB. The spec is kept well
# below the latter: metadata, status and managed fields (one entry: the maps are atomic) share it.
MAX_BYTES = 1_400_000
# Units of rendering work (``Work``: a rule, a resource name or a subject looked at) one
# namespace may take before it is left to the webhook: about half a second of one core on the
# test machine (docs/compiled.md, "Size guard"), more than parameters of ``MAX_BYTES`` take; a
# namespace of ordinary roles takes a few hundred.
MAX_WORK = 1_000_000
# The cluster part's CEL constants: each at most this many code points (kube-apiserver refuses an
# expression over 100,000; the rest is kept for the policy's own text around it), and at most
# this many of them (with the policy's own expressions, under etcd's 1.5 MiB per object).
CHUNK_CODE_POINTS = 90_000
MAX_CHUNKS = 12
# The constant of the served resources no annotation restricts (``unjudged_literal``): about 700
# resources of 40 characters, several times what large clusters serve namespaced.
UNJUDGED_CODE_POINTS = 30_000
# Why a namespace is delegated, as its Compiled condition's reason says.
TOO_LARGE, TOO_COMPLEX = "TooLarge", "TooComplex"
SUBRESOURCE_ENTRIES = "SubresourceEntries"
SOFTENED = "Softened"

# Resources the webhook keeps whatever the labels: RBAC objects (escalation check, annotation
# validation), workloads (templates, selectors, scale targets, references) and pods (references,
# mirror-pod annotation); and what must never wait for parameters to exist (leader election
# Leases, Events, written in a namespace before anything is compiled for it). The policy excludes
# them, and the compiler never indexes them.
WEBHOOK_RESOURCES: frozenset[tuple[str, str]] = frozenset(
    {
        *((RBAC_GROUP, resource) for resource in RBAC_RESOURCES),
        *WORKLOAD_RULES,
        ("", "pods"),
        ("coordination.k8s.io", "leases"),
        ("", "events"),
        ("events.k8s.io", "events"),
    }
)

# The layout of the parameters (``render``) the policies this release writes read, named on
# each policy (``LAYOUT_ANNOTATION``) so that a compiler taking the lease knows whether an earlier
# release's policy may be in force. Layout 2: a resource's entry that points every operation to
# one grant holds the grant's id, and a requirement's empty lists are left out. A policy of
# layout 2 reads layout 1 too; an earlier one reads layout 1 only (``Target.earlier``).
LAYOUT = "2"
LAYOUT_ANNOTATION = "labelrbac.io/params-layout"

# Operation keys of the index and the RBAC verbs behind each (``model.authorizations``): a
# DELETE without a name is one object of a collection delete, authorized as deletecollection.
CREATE, UPDATE, DELETE, DELETECOLLECTION = "CREATE", "UPDATE", "DELETE", "DELETECOLLECTION"
OPERATION_VERBS: Mapping[str, tuple[str, ...]] = {
    CREATE: ("create",),
    UPDATE: ("update", "patch"),
    DELETE: ("delete",),
    DELETECOLLECTION: ("deletecollection",),
}


def namespace_marks(compiled: bool, softened: bool = False) -> dict[str, str | None]:
    """The compiler's labels of a Namespace as a merge patch (None takes a label off):
    ``MARK`` when it is compiled, and ``SOFTENED_MARK`` too when its parameters soften a
    denial."""
    return {
        MARK: "true" if compiled else None,
        SOFTENED_MARK: "true" if compiled and softened else None,
    }


def in_scope(res: Resource) -> bool:
    """Whether the compiled policy judges writes of ``res`` (a namespaced resource)."""
    return not res.subresource and (res.group, res.resource) not in WEBHOOK_RESOURCES


def resource_key(res: Resource) -> str:
    """The index key the policy builds from a request: ``configmaps``, ``widgets.example.com``."""
    return str(Resource(res.group, res.resource))


def glob_pattern(glob: Glob) -> str:
    """An anchored RE2 pattern matching exactly what ``glob`` matches.

    Everything but ``*`` and ``?`` is escaped, so the pattern has no classes, groups,
    alternations or counted repetitions: only literals, ``.`` and ``.*``. It ends in ``\\z``
    (end of text), as every validating pattern here ends in an anchor that cannot match before
    a final newline; in RE2 a bare ``$`` means the same, but says less.
    """
    parts = ["^"]
    for ch in glob.canonical or glob.text:
        if ch == STAR:
            parts.append(".*")
        elif ch == ANY:
            parts.append(".")
        elif ch.isalnum() or ch == "_":
            parts.append(ch)
        else:
            parts.append("\\" + ch)
    parts.append(r"\z")
    return "".join(parts)


def value_tests(globs: Sequence[Glob]) -> dict[str, list[str]]:
    """The tests the policy runs on a label value for ``globs`` (any may pass), cheapest first.

    A CEL ``matches`` compiles its pattern on every call, so a glob written as a regular
    expression costs the API server far more than a string comparison on every write carrying
    the label. The usual shapes never reach one: a literal is looked up (``exact``), ``team-*``
    is a ``startsWith`` (``prefixes``), ``*-dev`` an ``endsWith`` (``suffixes``); every other
    glob of the requirement is one alternative of a single pattern (``patterns``: at most one),
    compiled once per write whatever the count. The annotation schema bounds the globs.
    """
    exact: list[str] = []
    prefixes: list[str] = []
    suffixes: list[str] = []
    general: list[str] = []
    for glob in globs:
        canonical = glob.canonical or glob.text
        body = canonical.strip(STAR)
        if glob.is_literal:
            exact.append(glob.text)
        elif ANY not in body and STAR not in body and canonical == body + STAR:
            prefixes.append(body)  # "*" itself: the empty prefix, which every value has
        elif ANY not in body and STAR not in body and canonical == STAR + body:
            suffixes.append(body)
        else:
            general.append(glob_pattern(glob)[1:-2])  # unanchored: one alternative
    patterns = [f"^(?:{'|'.join(general)})\\z"] if general else []
    return {"exact": exact, "prefixes": prefixes, "suffixes": suffixes, "patterns": patterns}


@dataclass(frozen=True)
class Target:
    """What the compiler renders for: the resources the policy may see, the settings, and the
    resources every namespace indexes (None: those the snapshot's annotations name, ``index``)."""

    resources: tuple[Resource, ...]
    options: Options = field(default_factory=Options)
    max_bytes: int = MAX_BYTES
    max_work: int = MAX_WORK
    indexed: tuple[Resource, ...] | None = None
    # Render a namespace whose denials a mode would soften ``delegated`` (the compiler's default).
    delegate_softened: bool = False
    # Code points of each of the policy's constants holding the cluster part.
    chunk_code_points: int = CHUNK_CODE_POINTS
    # Render layout 1 (``LAYOUT``), for an earlier release's policy in force for a moment after
    # an upgrade: the unjudged resources listed in every namespace's parameters too, as
    # releases before 0.3.4 read them, and every entry and requirement spelled out whole, as
    # releases before 0.3.5 read them.
    earlier: bool = False

    @classmethod
    def of(
        cls,
        resources: Iterable[Resource],
        options: Options | None = None,
        max_bytes: int = MAX_BYTES,
        max_work: int = MAX_WORK,
        delegate_softened: bool = False,
    ) -> Target:
        """The resources the policy judges among ``resources`` (discovery's namespaced ones)."""
        kept = sorted(
            {Resource(r.group, r.resource) for r in resources if in_scope(r)}, key=resource_key
        )
        return cls(
            tuple(kept),
            options or Options(),
            max_bytes,
            max_work,
            delegate_softened=delegate_softened,
        )

    def index(
        self, restrictions: Restrictions, lingering: Iterable[str] = ()
    ) -> tuple[Resource, ...]:
        """What every namespace indexes: the resources among ``resources`` that some annotation
        names (or a broken role reaches), bound anywhere or not, and those ``lingering`` (keys
        restricted a moment ago, which the compiler keeps indexed a while).

        The same in every namespace, so a subject bound a moment ago to any existing restricted
        role meets an indexed resource (and "not listed yet"), wherever it is bound."""
        found = set(named(restrictions, self.resources))
        found.update(r for r in map(Resource.parse, lingering) if in_scope(r))
        return tuple(sorted(found, key=resource_key))


class OverBudget(Exception):
    """A render went past its ``Work`` budget."""


class Work:
    """Counts the units of work of one render: each rule, resource name and subject looked at.

    Every loop of the render spends what it looks at, so the count is the render's time up to a
    constant factor (``tests/engine/test_params.py`` checks that it grows linearly with the
    names a role lists); ``spend`` raises ``OverBudget`` past ``limit``.
    """

    def __init__(self, limit: int | None = None) -> None:
        self.limit = limit
        self.spent = 0

    def spend(self, units: int) -> None:
        self.spent += units
        if self.limit is not None and self.spent > self.limit:
            raise OverBudget(self.spent)


@dataclass(frozen=True)
class Rendered:
    """One namespace's parameters: ``spec`` as written, its grant count and size in bytes.

    ``delegated`` is set (and ``spec`` holds no index) when the parameters would exceed the size
    limit: the namespace stays with the webhook.
    """

    namespace: str
    spec: Mapping[str, Any]
    grants: int
    text: str  # ``spec`` serialized by ``spec_text``: compared with what was written
    delegated: str | None = None
    reason: str = ""  # why it is delegated, as the status and Event say it: ``TOO_LARGE``,
    # ``TOO_COMPLEX`` or ``SUBRESOURCE_ENTRIES``
    work: int = 0  # the units of ``Work`` the render took

    @property
    def size(self) -> int:
        return len(self.text.encode())

    @property
    def softened(self) -> bool:
        """Whether the namespace, compiled, is labeled ``SOFTENED_MARK``: its parameters soften
        a denial."""
        return self.delegated is None and bool(self.spec.get("softened"))

    def manifest(self) -> dict[str, Any]:
        """The object to apply (server-side) as the compiler's field manager."""
        return {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": NAME, "namespace": self.namespace},
            "spec": self.spec,
        }


def _grant_of(role: CompiledRole, res: Resource) -> dict[str, Any]:
    """What ``role`` means for writes of ``res``, classified as the webhook classifies it."""
    grants = classify((role,), res)
    if grants.unrestricted is not None:
        return {"role": str(role.ref), "unrestricted": True}
    if grants.invalid:
        return {"role": str(role.ref), "invalid": grants.broken()}
    _, entries = grants.restricted[0]
    labels = [
        {"key": req.key, **value_tests(req.values)}
        for entry in entries
        for req in entry.requirements
    ]
    return {
        "role": str(role.ref),
        "mode": role.mode,
        "allows": grants.allowances(),
        "labels": labels,
    }


def _names(
    role: CompiledRole, verbs: Sequence[str], res: Resource, work: Work
) -> tuple[str, ...] | None:
    """None when ``role`` grants ``verbs`` on ``res`` whatever the name; else the names it grants
    them on (empty: not at all), as ``role.grants`` decides name by name: the names listed by the
    rules that match the verbs and the resource. Each rule and each of its names is looked at
    once (testing every name against every rule made a role of many rules quadratic)."""
    work.spend(len(role.rules))
    if role.grants(verbs, res, ""):
        return None
    found: set[str] = set()
    for rule in role.rules:
        if rule.names and _rule_grants(rule, verbs, res):
            work.spend(len(rule.names))
            found.update(rule.names)
    work.spend(len(found))
    return tuple(sorted(found))


def _rule_grants(rule: Rule, verbs: Sequence[str], res: Resource) -> bool:
    """Whether ``rule`` grants one of ``verbs`` on ``res`` for some name (``Rule.matches``
    without the name)."""
    return any(rule.allows_verb(v) for v in verbs) and rule.covers_resource(res)


def _short_id(n: int) -> str:
    """0 → "0", 35 → "z", 36 → "10": ids stay short, the index repeats them."""
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = digits[n % 36]
    while n >= 36:
        n //= 36
        out = digits[n % 36] + out
    return out


def _relabelled(scope: Scope | None, resources: Sequence[Resource]) -> str | None:
    """Why the policy cannot judge ``scope``'s writes: a role bound there whose entries for a
    subresource (``configmaps/proxy``) add requirements to a change of its object's labels
    (``labels.check_relabel``), which the policy does not judge. None when there is none."""
    if scope is None:
        return None
    seen: set[RoleRef] = set()
    for key in scope.limited:
        for _, role in scope.entries[key]:
            if role.ref in seen or role.permissions is None:
                continue
            seen.add(role.ref)
            for res in resources:
                if role.permissions.relabel_differs(res):
                    return (
                        f"{role.ref} restricts subresources of {resource_key(res)} more than its "
                        "writes, which only the webhook judges on a change of labels"
                    )
    return None


# A role's entry: resource key → operation → grant id; under DEFAULT, the operations of every
# indexed resource the entry does not name.
Operations = dict[str, str]
DEFAULT = "*"


class _Part:
    """One scope's share of a namespace's parameters: its subjects' role ids (in binding order),
    the roles' entries for the indexed resources, and the grants they point to.

    A role is entered once however many bindings refer to it, and a grant once however many
    roles, resources and operations share it (equal content, one id). ``prefix`` keeps the ids
    of the cluster scope's part, shared by every namespace, apart from the namespace's own.
    """

    def __init__(
        self, scope: Scope | None, resources: Sequence[Resource], prefix: str, work: Work
    ) -> None:
        self.resources = resources
        self.prefix = prefix
        self._work = work
        self.subjects: dict[str, dict[str, list[str]]] = {"User": {}, "Group": {}}
        self.roles: dict[str, dict[str, Operations]] = {}
        self.grants: dict[str, dict[str, Any]] = {}
        self._role_ids: dict[RoleRef, str | None] = {}
        self._grant_ids: dict[str, str] = {}
        if scope is None:
            return
        for (kind, subject), pairs in sorted(scope.entries.items()):
            work.spend(1 + len(pairs))
            ids: list[str] = []
            for _, role in pairs:  # already in binding-name order
                found = self._role_id(role)
                if found is not None and found not in ids:
                    ids.append(found)
            if ids:
                self.subjects[kind][subject] = ids

    def _role_id(self, role: CompiledRole) -> str | None:
        """The id of ``role``'s entry; None when it grants no write of an indexed resource."""
        if role.ref not in self._role_ids:
            entry = _with_default(
                {resource_key(r): self._operations(role, r) for r in self.resources}
            )
            found = None
            if entry:
                found = self.prefix + _short_id(len(self.roles))
                self.roles[found] = entry
            self._role_ids[role.ref] = found
        return self._role_ids[role.ref]

    def _operations(self, role: CompiledRole, res: Resource) -> Operations:
        """operation → grant id, for the operations ``role`` grants on ``res``."""
        found: Operations = {}
        base: dict[str, Any] | None = None
        base_id = ""  # the id of ``base``, looked up once (its key is a serialization)
        for operation, verbs in OPERATION_VERBS.items():
            names = _names(role, verbs, res, self._work)
            # A collection delete names no object: a rule with resourceNames never grants it.
            if names is not None and (not names or operation == DELETECOLLECTION):
                continue
            if base is None:
                base = _grant_of(role, res)
            if names is not None:
                found[operation] = self._grant_id({**base, "names": list(names)})
                continue
            base_id = base_id or self._grant_id(base)
            found[operation] = base_id
        return found

    def _grant_id(self, grant: dict[str, Any]) -> str:
        self._work.spend(len(grant.get("names", ())))  # the key serializes them again
        key = json.dumps(grant, sort_keys=True)
        found = self._grant_ids.get(key)
        if found is None:
            found = self._grant_ids[key] = self.prefix + _short_id(len(self.grants))
            self.grants[found] = grant
        return found


def _layout2(part: _Part) -> tuple[dict[str, Any], dict[str, Any]]:
    """``part``'s roles and grants in ``LAYOUT`` 2: a resource whose every operation points to
    one grant holds that grant's id, not a map, and a requirement leaves out its empty lists.
    The API server keeps two decoded copies of every namespace's parameters, and each small
    map or list costs it more than its bytes stored."""
    roles = {
        role: {key: _uniform(ops) or ops for key, ops in entry.items()}
        for role, entry in part.roles.items()
    }
    grants = {
        grant: {**body, "labels": [{k: v for k, v in r.items() if v != []} for r in body["labels"]]}
        if "labels" in body
        else body
        for grant, body in part.grants.items()
    }
    return roles, grants


def _uniform(ops: Operations) -> str | None:
    """The grant id every operation of ``ops`` points to, None unless all do, to one."""
    ids = set(ops.values())
    return next(iter(ids)) if len(ops) == len(OPERATION_VERBS) and len(ids) == 1 else None


def _with_default(entry: Mapping[str, Operations]) -> dict[str, Operations]:
    """``entry`` without the resources the role does not grant, and with the operations most
    resources share under ``DEFAULT`` when that spares lines: a role granting every indexed
    resource alike (a ``*`` rule) is one line. Empty when the role grants none of them."""
    counts = Counter(tuple(ops.items()) for ops in entry.values())  # in OPERATION_VERBS order
    common: Operations = {}
    if counts:
        items, count = counts.most_common(1)[0]
        common = dict(items) if count > 1 else {}
    if not common:
        return {key: ops for key, ops in entry.items() if ops}
    # Under a default, a resource the role does not grant is written empty.
    return {DEFAULT: common, **{key: ops for key, ops in entry.items() if ops != common}}


class _ClusterScope:
    """The ClusterRoleBindings' part, resolved once for every namespace's render.

    Every namespace's render asks for it (``render_cluster``: whether it softens a denial or
    leaves every namespace to the webhook), and resolving it again for each one made a full
    render cost (namespaces) x (cluster bindings) x (resources). A part depends on
    the cluster scope (the same object until a ClusterRoleBinding or a role it binds changes) and
    the indexed resources (the same in most namespaces); the last few are kept. The work of
    resolving them is spent from the budget of the namespace that needs them first (namespaces
    are rendered by several threads: the lock keeps the cache whole).
    """

    KEPT = 16

    def __init__(self, scope: Scope | None) -> None:
        self.scope = scope
        self._relabelled: dict[tuple[Resource, ...], str | None] = {}
        self._parts: OrderedDict[tuple[Resource, ...], _Part] = OrderedDict()
        self._lock = threading.Lock()

    def relabelled(self, resources: tuple[Resource, ...]) -> str | None:
        with self._lock:
            if resources not in self._relabelled:
                self._relabelled[resources] = _relabelled(self.scope, resources)
            return self._relabelled[resources]

    def part(self, indexed: tuple[Resource, ...], work: Work) -> _Part:
        with self._lock:
            found = self._parts.get(indexed)
            if found is None:
                found = self._parts[indexed] = _Part(self.scope, indexed, CLUSTER_PREFIX, work)
                if len(self._parts) > self.KEPT:
                    self._parts.popitem(last=False)
            self._parts.move_to_end(indexed)
            return found


# Ids of the cluster scope's roles and grants ("c0", ...), apart from a namespace's own ("0").
CLUSTER_PREFIX = "c"
_cluster = _ClusterScope(None)
_cluster_lock = threading.Lock()


def _cluster_scope(snapshot: Snapshot) -> _ClusterScope:
    """The resolved cluster scope of ``snapshot``: the last one, when its scope is the same."""
    global _cluster
    scope = snapshot.bindings.scopes.get("")
    with _cluster_lock:
        current = _cluster
        if current.scope is not scope:
            current = _cluster = _ClusterScope(scope)
        return current


_last_index: tuple[Restrictions, Target, tuple[Resource, ...]] | None = None


def _index(snapshot: Snapshot, target: Target) -> tuple[Resource, ...]:
    """``target.index`` of the snapshot's restrictions, the last one kept: a render of every
    namespace computes it once."""
    global _last_index
    restrictions = snapshot.restrictions()
    last = _last_index
    if last is None or last[0] is not restrictions or last[1] is not target:
        last = _last_index = (restrictions, target, target.index(restrictions))
    return last[2]


def render(snapshot: Snapshot, namespace: str, target: Target) -> Rendered:
    """The parameters of ``namespace``: its RoleBindings' part (the ClusterRoleBindings' is
    ``render_cluster``'s, stored once); delegated past ``target.max_work`` units of work or
    ``target.max_bytes`` bytes, or when the cluster part leaves every namespace to the webhook."""
    base: dict[str, Any] = {
        "mode": target.options.mode,
        "allowUnlabeled": target.options.allow_unlabeled,
    }
    work = Work(target.max_work)
    try:
        return _render(snapshot, namespace, target, base, work)
    except OverBudget:
        reason = (
            f"the parameters of namespace {namespace} would take more than {target.max_work} "
            "units of work to compile (its roles list too many rules or resource names): the "
            "webhook keeps judging its writes"
        )
        delegated = {**base, "delegated": reason}
        return Rendered(
            namespace, delegated, 0, spec_text(delegated), reason, TOO_COMPLEX, work.spent
        )


def _render(
    snapshot: Snapshot, namespace: str, target: Target, base: dict[str, Any], work: Work
) -> Rendered:
    own_scope = snapshot.bindings.scopes.get(namespace)
    cluster = render_cluster(snapshot, target)
    indexed = _indexed(snapshot, target)
    own = _Part(own_scope, indexed, "", work)
    if cluster.softened or _softened(target, own.grants.values()):
        base["softened"] = True  # the warn and audit policies look further only then
    listed = {"unjudged": list(cluster.unjudged)} if target.earlier else {}
    spec = {
        **base,
        "indexed": [resource_key(r) for r in indexed],
        **listed,
        "users": own.subjects["User"],
        "groups": own.subjects["Group"],
        "roles": own.roles,
        "grants": own.grants,
    }
    if not target.earlier:
        spec["roles"], spec["grants"] = _layout2(own)
    text = spec_text(spec)
    reason, cause = None, TOO_LARGE
    relabelled = _relabelled(own_scope, target.resources)
    if cluster.delegated is not None:
        reason = (
            f"in namespace {namespace}, {cluster.delegated}: the webhook keeps judging its writes"
        )
        cause = cluster.reason
    elif relabelled is not None:
        reason = f"in namespace {namespace}, {relabelled}: the webhook keeps judging its writes"
        cause = SUBRESOURCE_ENTRIES
    elif target.delegate_softened and "softened" in base:
        reason = (
            f"in namespace {namespace}, a denial would be softened (a role's "
            "labelrbac.io/mode, or the global mode, is warn or audit): the webhook keeps "
            "judging its writes and gives the warning or audit record"
        )
        cause = SOFTENED
    elif (size := len(text.encode())) > target.max_bytes:
        reason = (
            f"the parameters of namespace {namespace} would take {size} bytes, over the "
            f"limit of {target.max_bytes}: the webhook keeps judging its writes"
        )
    if reason is not None:
        delegated = {**base, "delegated": reason}
        return Rendered(
            namespace, delegated, len(own.grants), spec_text(delegated), reason, cause, work.spent
        )
    return Rendered(namespace, spec, len(own.grants), text, work=work.spent)


def _indexed(snapshot: Snapshot, target: Target) -> tuple[Resource, ...]:
    return target.indexed if target.indexed is not None else _index(snapshot, target)


def _softened(target: Target, grants: Iterable[Mapping[str, Any]]) -> bool:
    """Whether a denial by one of ``grants`` would be softened (a warn or audit mode)."""
    return target.options.mode != ENFORCE or any(g.get("mode", ENFORCE) != ENFORCE for g in grants)


@dataclass(frozen=True)
class ClusterPart:
    """The ClusterRoleBindings' part of every namespace's parameters, stored once in the policy.

    ``chunks`` are the CEL constants the policy holds (``cluster_chunks``); ``unjudged`` the
    served resources no annotation restricts (none indexed), which the policy allows as they
    are; ``delegated`` says why every namespace is left to the webhook instead (``reason``: as a
    namespace's Compiled condition says it), and then ``chunks`` and ``unjudged`` are empty.
    """

    chunks: tuple[str, ...]
    grants: int
    softened: bool
    delegated: str | None = None
    reason: str = ""
    # The part as a namespace's parameters would hold it (``users``, ``groups``, ``roles``,
    # ``grants``), what ``chunks`` spell in CEL.
    spec: Mapping[str, Any] = field(default_factory=dict)
    unjudged: tuple[str, ...] = ()

    @property
    def size(self) -> int:
        """Code points of the constants, as the API server counts an expression's size."""
        return sum(len(chunk) for chunk in self.chunks)


def unjudged_literal(keys: Iterable[str]) -> str:
    """The served resources no annotation restricts (``ClusterPart.unjudged``) as the policy's
    constant: a CEL map of each key to true, so a write's resource is looked up, not scanned
    for. Empty (no resource passes unjudged) in a policy the compiler has not written."""
    return cel_literal(dict.fromkeys(keys, True))


_last_cluster: tuple[object, Target, ClusterPart] | None = None
_last_cluster_lock = threading.Lock()


def render_cluster(snapshot: Snapshot, target: Target) -> ClusterPart:
    """The ClusterRoleBindings' part for ``target``: the last one kept, as every namespace's
    render asks for it (it only changes with a ClusterRoleBinding or a role one binds)."""
    global _last_cluster
    cluster_scope = _cluster_scope(snapshot)
    indexed = _indexed(snapshot, target)
    key = (cluster_scope, indexed)
    with _last_cluster_lock:
        last = _last_cluster
        if last is not None and last[0] == key and last[1] == target:
            return last[2]
    part = _render_cluster(cluster_scope, indexed, target)
    with _last_cluster_lock:
        _last_cluster = (key, target, part)
    return part


def _render_cluster(
    cluster_scope: _ClusterScope, indexed: tuple[Resource, ...], target: Target
) -> ClusterPart:
    work = Work(target.max_work)
    try:
        part = cluster_scope.part(indexed, work)
    except OverBudget:
        reason = (
            f"the ClusterRoleBindings' part of the parameters would take more than "
            f"{target.max_work} units of work to compile"
        )
        return ClusterPart((), 0, False, reason, TOO_COMPLEX)
    softened = _softened(target, part.grants.values())
    relabelled = cluster_scope.relabelled(target.resources)
    if relabelled is not None:
        return ClusterPart((), len(part.grants), softened, relabelled, SUBRESOURCE_ENTRIES)
    if target.delegate_softened and softened:
        reason = (
            "a denial would be softened (a role's labelrbac.io/mode, or the global mode, is "
            "warn or audit)"
        )
        return ClusterPart((), len(part.grants), softened, reason, SOFTENED)
    chunks = cluster_chunks(part, target.chunk_code_points)
    spec = {"users": part.subjects["User"], "groups": part.subjects["Group"],
            "roles": part.roles, "grants": part.grants}  # fmt: skip
    if chunks is None:
        reason = (
            "the ClusterRoleBindings' part of the parameters would take more than "
            f"{MAX_CHUNKS} constants of {CHUNK_CODE_POINTS} code points"
        )
        return ClusterPart((), len(part.grants), softened, reason, TOO_LARGE, spec)
    judged = frozenset(indexed)
    unjudged = tuple(resource_key(r) for r in target.resources if r not in judged)
    if len(unjudged_literal(unjudged)) > UNJUDGED_CODE_POINTS:
        reason = (
            f"the {len(unjudged)} served resources no annotation restricts would take more "
            f"than {UNJUDGED_CODE_POINTS} code points of the policy"
        )
        return ClusterPart((), len(part.grants), softened, reason, TOO_LARGE, spec)
    return ClusterPart(tuple(chunks), len(part.grants), softened, spec=spec, unjudged=unjudged)


def settling(part: ClusterPart, target: Target, keys: AbstractSet[str]) -> ClusterPart:
    """``part`` still letting pass unjudged the indexed resources ``keys``: those only a Role's
    annotation restricts since some namespaces were last written. The policy lets them pass where
    a namespace's parameters do not index them yet (its indexed wins elsewhere), so a tenant's
    Role restricting a resource nothing restricted before never has other namespaces' writes of
    it refused until each is written again; a ClusterRole's restriction, which every namespace's
    roles may hand out, is never among them. ``part`` as it is (those judged at once, refused
    where not yet indexed) when the constant would grow past its limit."""
    if part.delegated is not None or not keys:
        return part
    listed = set(part.unjudged) | set(keys)
    unjudged = tuple(key for key in map(resource_key, target.resources) if key in listed)
    if len(unjudged_literal(unjudged)) > UNJUDGED_CODE_POINTS:
        return part
    return replace(part, unjudged=unjudged)


def cluster_chunks(
    part: _Part, limit: int = CHUNK_CODE_POINTS, most: int = MAX_CHUNKS
) -> list[str] | None:
    """``part`` as CEL map literals of at most ``limit`` code points each, None when it takes
    more than ``most`` of them.

    Each holds ``users``, ``groups``, ``roles`` and ``grants`` as a namespace's parameters do,
    and is whole: a subject is in one chunk with every role it is bound to and every grant
    those roles point to (a role or grant shared by subjects of several chunks is in each). So
    the policy finds a subject's roles, in binding order, in the one chunk holding it, and the
    order of subjects (the user, then each group) is the request's whatever the chunks. Sizes
    are counted entry by entry as an upper bound of the literal's (linear in the part).
    """
    chunks: list[_Chunk] = [_Chunk()]
    for kind in ("User", "Group"):
        for subject, ids in part.subjects[kind].items():
            if not chunks[-1].add(part, kind, subject, ids, limit):
                chunks.append(_Chunk())
                if not chunks[-1].add(part, kind, subject, ids, limit):
                    return None  # one subject's roles alone are too large
                if len(chunks) > most:
                    return None
    return [chunk.literal() for chunk in chunks]


# The literal of an empty chunk, and what each entry may add to it beside its own text: a
# separator, the quotes of its key, a colon and a ``dyn()``.
_EMPTY_CHUNK = 80
_PER_ENTRY = 10


class _Chunk:
    """One CEL constant of the cluster part, being filled (``cluster_chunks``). Its grants are
    held as ``grant_maps`` spells them: no list or map in it mixes types, but the chunk's own."""

    def __init__(self) -> None:
        self.maps: dict[str, dict[str, Any]] = {
            "users": {}, "groups": {}, "roles": {}, "grants": {}, "labels": {}, "names": {}
        }  # fmt: skip
        self.size = _EMPTY_CHUNK

    def add(self, part: _Part, kind: str, subject: str, ids: list[str], limit: int) -> bool:
        """Add ``subject`` and what it needs unless that takes the chunk past ``limit``."""
        subjects = self.maps["users" if kind == "User" else "groups"]
        roles = {i: part.roles[i] for i in ids if i not in self.maps["roles"]}
        used = {g for entry in roles.values() for ops in entry.values() for g in ops.values()}
        grants = {g: grant_maps(part.grants[g]) for g in sorted(used)
                  if g not in self.maps["grants"]}  # fmt: skip
        added = [(subject, ids), *roles.items(),
                 *((g, v) for g, maps in grants.items() for v in maps.values())]  # fmt: skip
        size = sum(len(k) + len(cel_literal(v)) + _PER_ENTRY for k, v in added)
        if self.size + size > limit and (self.maps["users"] or self.maps["groups"]):
            return False
        if _EMPTY_CHUNK + size > limit:
            return False
        subjects[subject] = ids
        self.maps["roles"].update(roles)
        for grant, maps in grants.items():
            for field_name, value in maps.items():
                self.maps[field_name][grant] = value
        self.size += size
        return True

    def literal(self) -> str:
        return cel_literal(self.maps)


def grant_maps(grant: Mapping[str, Any]) -> dict[str, Any]:
    """A grant as the cluster part's constants hold it, in maps each of one type: ``grants``,
    its strings (``role``, ``mode``, ``allows``, ``invalid``, ``unrestricted`` as "true", and
    ``kind``: ``unrestricted``, ``invalid`` or ``labels``); ``labels``, its requirements with
    every value a list of strings (``key`` a list of one), an empty one left out; ``names``, its
    resourceNames. The API
    server's CEL checks a literal mixing types only through one ``dyn`` per value, and building
    those took it seconds per policy write (3.8 s for 250 grants, against 0.3 s without)."""
    kind = next(k for k in ("unrestricted", "invalid", "labels") if k in grant)
    strings = {
        "kind": kind,
        **{k: "true" if v is True else v for k, v in grant.items() if k not in ("labels", "names")},
    }
    found: dict[str, Any] = {"grants": strings}
    if "labels" in grant:
        # Without its empty lists: each empty list literal cost the API server's type checker
        # more than the rest of the constant (0.5 s against 0.1 s for 200 grants).
        found["labels"] = [
            {k: v for k, v in {**r, "key": [r["key"]]}.items() if v != []} for r in grant["labels"]
        ]
    if "names" in grant:
        found["names"] = list(grant["names"])
    return found


def cel_literal(value: Any) -> str:
    """``value`` (JSON: strings, booleans, integers, lists and maps with string keys) as a CEL
    literal of the same value. The API server's CEL refuses a list or map literal whose elements
    differ in type: those elements are each ``dyn`` (an empty list is of any list type)."""
    return _cel(value)[0]


def _cel(value: Any) -> tuple[str, Any]:
    """(``value`` as CEL, its CEL type), the type as the checker infers it."""
    if isinstance(value, bool):
        return ("true" if value else "false"), ("bool",)
    if isinstance(value, (int, str)):
        return json.dumps(value, ensure_ascii=False), (type(value).__name__,)
    if isinstance(value, Mapping):
        items = [(json.dumps(str(k), ensure_ascii=False), *_cel(v)) for k, v in value.items()]
        inner, dyn = _join([t for _, _, t in items])
        body = ",".join(f"{k}:{f'dyn({v})' if dyn else v}" for k, v, _ in items)
        return "{" + body + "}", ("map", inner)
    if isinstance(value, (list, tuple)):
        elements = [_cel(v) for v in value]
        inner, dyn = _join([t for _, t in elements])
        body = ",".join(f"dyn({v})" if dyn else v for v, _ in elements)
        return "[" + body + "]", ("list", inner) if elements else None
    raise TypeError(f"{type(value).__name__} has no CEL literal here")


def _join(types: list[Any]) -> tuple[Any, bool]:
    """The one type of an aggregate's elements, and whether they need ``dyn`` (they differ)."""
    found: Any = None
    for each in types:
        joined = _unify(found, each)
        if joined is _MISMATCH:
            return ("dyn",), True
        found = joined
    return found, False


_MISMATCH = ("mismatch",)


def _unify(a: Any, b: Any) -> Any:
    if a is None:
        return b
    if b is None or a == b:
        return a
    if a[0] == b[0] and a[0] in ("list", "map"):
        inner = _unify(a[1], b[1])
        return _MISMATCH if inner is _MISMATCH else (a[0], inner)
    return _MISMATCH


def spec_text(spec: Mapping[str, Any]) -> str:
    """``spec`` as one compact, key-sorted JSON text: its size, and what equal content shares."""
    return json.dumps(spec, sort_keys=True, separators=(",", ":"))


def namespaces_of(snapshot: Snapshot) -> set[str]:
    """Every namespace that gets parameters: those known, and those holding RoleBindings."""
    return set(snapshot.namespaces) | {name for name in snapshot.bindings.scopes if name}


class Namespaces(AbstractSet[str]):
    """``namespaces_of(snapshot)`` as a view: a membership test is two lookups, and the set is
    built only when iterated. (The compiler asks after every write; building the set each time
    was most of its work at 12,000 namespaces.)"""

    def __init__(self, snapshot: Snapshot) -> None:
        self._snapshot = snapshot

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        return name in self._snapshot.namespaces or (
            name != "" and name in self._snapshot.bindings.scopes
        )

    def __iter__(self) -> Iterator[str]:
        return iter(namespaces_of(self._snapshot))

    def __len__(self) -> int:
        return len(namespaces_of(self._snapshot))


# Every namespace must be rendered again.
ALL: frozenset[str] = frozenset({"*"})
# In what ``touched`` returns: the cluster part (``render_cluster``) may have changed.
CLUSTER = ""


def touched(live: LiveSnapshot, changes: Iterable[Change]) -> frozenset[str]:
    """The namespaces whose parameters ``changes`` may alter, with ``CLUSTER`` when the cluster
    part may change (a ClusterRoleBinding, or a ClusterRole one binds: a write of the policy,
    not of every namespace).

    ``live`` is the state after the changes; a role change reaches the namespaces of the
    bindings referring to it.
    """
    found: set[str] = set()
    for kind, old, new in changes:
        category = CATEGORIES.get(kind)
        for value in (old, new):
            if value is None:
                continue
            if category == NAMESPACES:
                found.add(value[0])
            elif category == BINDINGS:
                binding: Binding = value
                found.add(binding.namespace or CLUSTER)
            elif category == ROLES:
                role: CompiledRole = value
                found.update(ns or CLUSTER for ns in _referring_namespaces(live, role.ref))
    return frozenset(found)


def _referring_namespaces(live: LiveSnapshot, ref: RoleRef) -> Iterator[str]:
    if ref.namespace:
        yield ref.namespace  # a Role is bound in its own namespace only
        return
    found = live.referrers.get(ref)
    if found is None:
        return
    if isinstance(found, Binding):
        yield found.namespace
    else:
        for namespace, _ in found:
            yield namespace
