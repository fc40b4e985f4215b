"""The reverse questions, answered from a snapshot with the admission rule's own parts.

``who_can``: which subjects may do a verb on objects carrying given labels, and through which
roles (``check`` asked the other way round). ``audit``: which existing objects nobody but an
unrestricted holder may still write (orphans), which carry labels no role's bucket permits, and
per namespace the buckets and their holders.

Both enumerate the subjects the binding index names and ask ``find_grants`` (the label rule's
classification of granting roles) for each, so they agree with admission on bindings, rule
matching, annotation entries and their specificity.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from app.engine.labels import Grants, find_grants
from app.engine.model import (
    ENFORCE,
    RESTRICTED_VERBS,
    SERVICE_ACCOUNT_PREFIX,
    Resource,
    UserInfo,
)
from app.engine.policy import Entry
from app.engine.rbac import GROUP, USER, Binding, CompiledRole, RoleRef, Snapshot

# The verbs that "touch" an existing object: what admission judges for it.
WRITE_VERBS = ("update", "patch", "delete")


@dataclass(frozen=True, slots=True, order=True)
class Subject:
    """A binding subject: ``User``, ``Group`` or ``ServiceAccount`` (``namespace/name``)."""

    kind: str
    name: str

    @classmethod
    def from_key(cls, kind: str, name: str) -> Subject:
        if kind == USER and name.startswith(SERVICE_ACCOUNT_PREFIX):
            namespace, _, sa = name[len(SERVICE_ACCOUNT_PREFIX) :].partition(":")
            return cls("ServiceAccount", f"{namespace}/{sa}")
        return cls(kind, name)

    @property
    def user(self) -> UserInfo:
        """An identity holding exactly this subject's bindings."""
        if self.kind == GROUP:
            return UserInfo("", (self.name,))
        if self.kind == "ServiceAccount":
            namespace, _, sa = self.name.partition("/")
            return UserInfo(f"{SERVICE_ACCOUNT_PREFIX}{namespace}:{sa}")
        return UserInfo(self.name)

    def __str__(self) -> str:
        return f"{self.kind} {self.name}"


def subjects_by_scope(snapshot: Snapshot) -> dict[str, set[Subject]]:
    """Namespace ("" for ClusterRoleBindings) → the subjects its bindings name."""
    found: dict[str, set[Subject]] = defaultdict(set)
    for scope, kind, name in snapshot.bindings:
        found[scope].add(Subject.from_key(kind, name))
    return found


def subjects(
    snapshot: Snapshot, namespace: str, index: Mapping[str, set[Subject]] | None = None
) -> list[Subject]:
    """Every subject a RoleBinding in ``namespace`` or a ClusterRoleBinding names, sorted."""
    index = subjects_by_scope(snapshot) if index is None else index
    return sorted(index.get(namespace, set()) | index.get("", set()))


def _through(
    snapshot: Snapshot, subject: Subject, namespace: str, roles: Iterable[CompiledRole]
) -> tuple[tuple[Binding, RoleRef], ...]:
    """The subject's bindings (in scope) to any of ``roles``, with the role each binds."""
    wanted = {role.ref for role in roles}
    return tuple(
        dict.fromkeys(
            (binding, role.ref)
            for binding, role in snapshot.roles_for(subject.user, namespace)
            if role.ref in wanted
        )
    )


@dataclass(frozen=True, slots=True)
class Holder:
    """One subject's answer: allowed or not, the roles that decided and what they permit.

    ``roles`` are the roles that allow it (or, when not allowed, the roles that grant it in RBAC
    but not for these labels); ``limits`` what they permit (empty: unrestricted). ``mode`` is the
    mode a denial would be enforced in (``warn``/``audit``: let through anyway).
    """

    subject: Subject
    allowed: bool
    roles: tuple[RoleRef, ...]
    bindings: tuple[str, ...]
    limits: str = ""
    mode: str = ENFORCE
    # The same as data: (binding, role) pairs, and per deciding role the labels it permits.
    through: tuple[tuple[Binding, RoleRef], ...] = ()
    permits: tuple[tuple[Entry, ...], ...] = ()
    # Where the deciding roles place the pods they let be written (``role: placement``), for
    # the roles that carry a placement annotation.
    placements: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, object]:
        found: dict[str, object] = {
            "subject": subject_dict(self.subject),
            "allowed": self.allowed,
            "mode": self.mode,
            "through": [
                {"binding": binding_dict(b), "role": role_dict(r)} for b, r in self.through
            ],
            "labels": [labels_dict(entries) for entries in self.permits],
        }
        if self.placements:
            found["placements"] = list(self.placements)
        return found


def subject_dict(subject: Subject) -> dict[str, str]:
    return {"kind": subject.kind, "name": subject.name}


def role_dict(ref: RoleRef) -> dict[str, str]:
    return {"kind": ref.kind, "namespace": ref.namespace, "name": ref.name}


def binding_dict(binding: Binding) -> dict[str, str]:
    kind = "RoleBinding" if binding.namespace else "ClusterRoleBinding"
    return {"kind": kind, "namespace": binding.namespace, "name": binding.name}


def labels_dict(entries: Iterable[Entry]) -> list[dict[str, object]]:
    """What one role permits, as data: every requirement (all must hold), each a label key and
    the values (globs) it may take."""
    return [
        {"key": r.key, "values": [g.text for g in r.values]}
        for entry in entries
        for r in entry.requirements
    ]


def granting(grants: Grants) -> tuple[CompiledRole, ...]:
    """Every role ``grants`` found granting the request in RBAC, whatever its labels permit."""
    first = (grants.unrestricted,) if grants.unrestricted is not None else ()
    return (*first, *(role for role, _ in grants.restricted), *grants.invalid)


def judge(
    grants: Grants, labels: Mapping[str, str], allow_unlabeled: bool
) -> tuple[bool, tuple[CompiledRole, ...], str, tuple[tuple[Entry, ...], ...]]:
    """(allowed, deciding roles, what they permit as text and as entries) for an object with
    ``labels``."""
    if grants.unrestricted is not None:
        return True, (grants.unrestricted,), "", ()
    passing = grants.passing(labels, allow_unlabeled)
    chosen = passing or list(grants.restricted)
    limits = "; ".join(
        dict.fromkeys(" and ".join(e.describe() for e in entries) for _, entries in chosen)
    )
    permits = tuple(tuple(entries) for _, entries in chosen)
    return bool(passing), tuple(role for role, _ in chosen) or grants.invalid, limits, permits


def who_can(
    snapshot: Snapshot,
    verb: str,
    resource: Resource,
    namespace: str = "",
    labels: Mapping[str, str] | None = None,
    name: str = "",
    allow_unlabeled: bool = False,
) -> list[Holder]:
    """Every subject RBAC lets do ``verb`` on ``resource``, and whether the labels let it too."""
    labels = labels or {}
    holders: list[Holder] = []
    for subject in subjects(snapshot, namespace):
        grants = find_grants(snapshot, subject.user, namespace, (verb,), resource, name)
        if not grants.any:
            continue
        if verb in RESTRICTED_VERBS:
            allowed, roles, limits, permits = judge(grants, labels, allow_unlabeled)
        else:  # no label permission narrows it (bind, escalate, use...): RBAC's grant stands
            allowed, roles, limits, permits = True, granting(grants), "", ()
        through = _through(snapshot, subject, namespace, roles)
        holders.append(
            Holder(
                subject,
                allowed,
                tuple(role.ref for role in roles),
                tuple(dict.fromkeys(f"{ref} ({binding})" for binding, ref in through)),
                limits,
                ENFORCE if allowed else grants.mode(),
                through,
                permits,
                tuple(f"{r.ref}: {r.placement.describe()}" for r in roles if r.placement),
            )
        )
    return holders


# -- Auditing what exists -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Existing:
    """An existing object as the audit sees it: where it lives and its labels, nothing else."""

    resource: Resource
    namespace: str
    name: str
    labels: Mapping[str, str]
    # Which object of that name it is (reports name it: a re-created object is another one).
    uid: str = field(default="", compare=False)

    def __str__(self) -> str:
        where = f"{self.namespace}/" if self.namespace else ""
        return f"{self.resource} {where}{self.name}"


@dataclass(frozen=True, slots=True)
class Bucket:
    """One role's label limit for a resource pattern, and the subjects bound to the role."""

    role: RoleRef
    pattern: str
    limits: str
    holders: tuple[str, ...]
    mode: str = ENFORCE
    entry: Entry | None = None
    held: tuple[tuple[Subject, Binding], ...] = ()

    def as_dict(self) -> dict[str, object]:
        return {
            "role": role_dict(self.role),
            "resource": self.pattern,
            "labels": labels_dict((self.entry,) if self.entry else ()),
            "mode": self.mode,
            "holders": [
                {"subject": subject_dict(s), "binding": binding_dict(b)} for s, b in self.held
            ],
        }


@dataclass(frozen=True, slots=True)
class Orphan:
    """An object only unrestricted holders may still write, and what the bound roles permit
    instead (none: no bound role holds a bucket of its resource)."""

    obj: Existing
    why: str
    permitted: tuple[tuple[Entry, ...], ...] = ()


@dataclass
class Report:
    """What ``audit`` found. ``orphans``: objects no bound restricted role permits, so only
    unrestricted holders (admins) may still write them; ``unbucketed``: objects whose labels no
    role's entry permits at all (every unbucketed object is also an orphan)."""

    objects: int = 0
    orphans: list[Orphan] = field(default_factory=list)
    unbucketed: list[Existing] = field(default_factory=list)
    buckets: dict[str, list[Bucket]] = field(default_factory=dict)
    # Pods bound to a node outside the pool their bucket is placed on (``misplaced``), and
    # the pods judged by where they run that run within it (not in ``as_dict``: a tally).
    misplaced: list[Misplaced] = field(default_factory=list)
    placed: list[BoundPod] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {
            "objects": self.objects,
            "orphans": [
                _existing(o.obj) | {"permitted": [labels_dict(e) for e in o.permitted]}
                for o in self.orphans
            ],
            "unbucketed": [_existing(obj) for obj in self.unbucketed],
            "misplaced": [m.as_dict() for m in self.misplaced],
            "buckets": {
                namespace or "(cluster)": [b.as_dict() for b in buckets]
                for namespace, buckets in self.buckets.items()
            },
        }


def _existing(obj: Existing) -> dict[str, object]:
    return {
        "resource": str(obj.resource),
        "namespace": obj.namespace,
        "name": obj.name,
        "labels": dict(obj.labels),
    }


def restricting(role: CompiledRole, resource: Resource) -> tuple[Entry, ...]:
    """The entries by which ``role`` limits writes of ``resource``: none unless its rules grant
    a write of it in RBAC and its annotation decides for it."""
    if role.permissions is None or role.error is not None:
        return ()
    if not any(
        rule.covers_resource(resource) and any(rule.allows_verb(v) for v in WRITE_VERBS)
        for rule in role.rules
    ):
        return ()
    return role.permissions.entries_for(resource)


def is_restricted(snapshot: Snapshot, resource: Resource) -> bool:
    """Whether some role (bound or not) limits writes of ``resource`` by labels."""
    return any(restricting(role, resource) for role in snapshot.roles.values())


def _in_some_bucket(snapshot: Snapshot, obj: Existing, allow_unlabeled: bool) -> tuple[bool, bool]:
    """(the resource is restricted by some role, the labels are permitted by one of them)."""
    restricted = False
    for role in snapshot.roles.values():
        entries = restricting(role, obj.resource)
        if not entries:
            continue
        restricted = True
        if all(e.violation(obj.labels, allow_unlabeled) is None for e in entries):
            return True, True
    return restricted, False


class _Writers:
    """The grants of every bound subject for writes of a resource in a namespace, computed once
    per (resource, namespace) and shared by the objects there.

    A rule with ``resourceNames`` is the one way an object's name changes the answer, so objects
    named by such a rule get their own entry; subjects bound only cluster-wide get the same
    grants in every namespace, so theirs are computed once per resource.
    """

    def __init__(self, snapshot: Snapshot) -> None:
        self._snapshot = snapshot
        self._index = subjects_by_scope(snapshot)
        self._grants: dict[tuple[Resource, str, str], list[Grants]] = {}
        self._cluster: dict[tuple[Subject, Resource], Grants] = {}
        self._named: dict[Resource, frozenset[str]] = {}
        # Grants lists are kept for the whole audit, so their ids are stable keys.
        self._answers: dict[
            tuple[int, tuple[tuple[str, str], ...]], tuple[bool, tuple[tuple[Entry, ...], ...]]
        ] = {}

    def size(self) -> int:
        """How many answers are kept (what a cache of them is bounded by)."""
        return len(self._grants) + len(self._cluster) + len(self._answers)

    def _names(self, resource: Resource) -> frozenset[str]:
        if resource not in self._named:
            self._named[resource] = frozenset(
                name
                for role in self._snapshot.roles.values()
                for rule in role.rules
                if rule.names and rule.covers_resource(resource)
                for name in rule.names
            )
        return self._named[resource]

    def grants(self, resource: Resource, namespace: str, name: str) -> list[Grants]:
        name = name if name in self._names(resource) else ""
        key = (resource, namespace, name)
        found = self._grants.get(key)
        if found is None:
            local = self._index.get(namespace, set())
            found = []
            for subject in subjects(self._snapshot, namespace, self._index):
                if subject in local or name:
                    found.append(self._find(subject, namespace, resource, name))
                    continue
                cached = self._cluster.get((subject, resource))
                if cached is None:
                    cached = self._find(subject, namespace, resource, "")
                    self._cluster[(subject, resource)] = cached
                found.append(cached)
            self._grants[key] = found
        return found

    def _find(self, subject: Subject, namespace: str, resource: Resource, name: str) -> Grants:
        return find_grants(self._snapshot, subject.user, namespace, WRITE_VERBS, resource, name)

    def writable(
        self, obj: Existing, allow_unlabeled: bool
    ) -> tuple[bool, tuple[tuple[Entry, ...], ...]]:
        """(some label-restricted holder may still write it, the limits the bound roles have)."""
        found = self.grants(obj.resource, obj.namespace, obj.name)
        key = (id(found), tuple(sorted(obj.labels.items())))
        answer = self._answers.get(key)
        if answer is None:
            answer = self._answers[key] = _writable(found, obj.labels, allow_unlabeled)
        return answer


def _writable(
    found: Iterable[Grants], labels: Mapping[str, str], allow_unlabeled: bool
) -> tuple[bool, tuple[tuple[Entry, ...], ...]]:
    """(some label-restricted holder may write an object with ``labels``, else what the bound
    restricted roles permit, each role's entries once)."""
    limits: dict[tuple[Entry, ...], None] = {}
    for grants in found:
        if grants.unrestricted is not None:
            continue  # an admin: the one kind of holder an orphan is left to
        if grants.passing(labels, allow_unlabeled):
            return True, ()
        for _, entries in grants.restricted:
            limits[tuple(entries)] = None
    return False, tuple(limits)


Bucketed = dict[tuple[Resource, tuple[tuple[str, str], ...]], tuple[bool, bool]]
# The most answers an ``AuditCache`` keeps: label sets are the objects' authors' to choose.
MAX_CACHED = 100_000


@dataclass
class AuditCache:
    """What audits of one snapshot share: the grants of each namespace's subjects and the
    answers per label set. The background audit passes it from pass to pass, so a pass after a
    label change costs the objects it judges, not a scan of every role and binding; it is
    dropped when the snapshot (an RBAC change) or ``allow_unlabeled`` changes, or past
    ``MAX_CACHED`` answers."""

    snapshot: Snapshot | None = None
    allow_unlabeled: bool = False
    writers: _Writers | None = None
    bucketed: Bucketed = field(default_factory=dict)

    def of(self, snapshot: Snapshot, allow_unlabeled: bool) -> tuple[_Writers, Bucketed]:
        if (
            self.writers is None
            or self.snapshot is not snapshot
            or self.allow_unlabeled != allow_unlabeled
            or len(self.bucketed) + self.writers.size() > MAX_CACHED
        ):
            self.snapshot, self.allow_unlabeled = snapshot, allow_unlabeled
            self.writers, self.bucketed = _Writers(snapshot), {}
        return self.writers, self.bucketed


def audit(
    snapshot: Snapshot,
    objects: Iterable[Existing],
    allow_unlabeled: bool = False,
    with_buckets: bool = True,
    cache: AuditCache | None = None,
    pods: Iterable[BoundPod] = (),
) -> Report:
    """Judge every existing object of a restricted resource, and list the buckets (unless
    ``with_buckets`` is false: the background audit reports findings only); ``pods``, the pods
    bound to nodes, are judged by where they run (``misplaced``)."""
    report = Report()
    for pod, why in placements(snapshot, pods, allow_unlabeled):
        if why is None:
            report.placed.append(pod)
        else:
            report.misplaced.append(Misplaced(pod, why))
    # Objects alike in what is judged are judged once (across audits sharing ``cache``).
    writers, bucketed = (cache or AuditCache()).of(snapshot, allow_unlabeled)
    for obj in objects:
        report.objects += 1
        labels = tuple(sorted(obj.labels.items()))
        if (obj.resource, labels) not in bucketed:
            bucketed[(obj.resource, labels)] = _in_some_bucket(snapshot, obj, allow_unlabeled)
        restricted, permitted = bucketed[(obj.resource, labels)]
        if not restricted:
            continue
        if not permitted:
            report.unbucketed.append(obj)
        writable, bound_limits = writers.writable(obj, allow_unlabeled)
        if not writable:
            limits = "; ".join(dict.fromkeys(
                " and ".join(e.describe() for e in entries) for entries in bound_limits
            ))  # fmt: skip
            why = f"bound roles permit {limits}" if limits else "no bound role holds its bucket"
            report.orphans.append(Orphan(obj, why, bound_limits))
    if with_buckets:
        report.buckets = buckets(snapshot)
    return report


def buckets(snapshot: Snapshot) -> dict[str, list[Bucket]]:
    """Per namespace ("" for ClusterRoleBindings): each bound restricted role's entries and the
    subjects bound to it there."""
    holders: dict[tuple[str, RoleRef], dict[tuple[Subject, Binding], None]] = defaultdict(dict)
    roles: dict[RoleRef, CompiledRole] = {}
    for (scope, kind, name), pairs in snapshot.bindings.items():
        for binding, role in pairs:
            if role.permissions is None or role.error is not None:
                continue
            holders[(scope, role.ref)][(Subject.from_key(kind, name), binding)] = None
            roles[role.ref] = role
    found: dict[str, list[Bucket]] = defaultdict(list)
    for (scope, ref), held in sorted(holders.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
        permissions = roles[ref].permissions
        sorted_held = tuple(sorted(held, key=lambda pair: (pair[0], str(pair[1]))))
        names = tuple(f"{subject} ({binding})" for subject, binding in sorted_held)
        for entry in permissions.entries if permissions else ():
            found[scope].append(
                Bucket(
                    ref, entry.pattern, entry.describe(), names, roles[ref].mode, entry, sorted_held
                )
            )
    return dict(sorted(found.items()))


# -- Pods running outside the pool their bucket is placed on --------------------------------------

PODS = Resource("", "pods")


@dataclass(frozen=True, slots=True)
class BoundPod:
    """A pod bound to a node, as the placement audit sees it: where it is, its labels, its node
    (and its uid, which reports name it by)."""

    namespace: str
    name: str
    labels: Mapping[str, str]
    node: str
    uid: str = ""


@dataclass(frozen=True, slots=True)
class Misplaced:
    """A pod bound to a node no role of its bucket places it on, and why."""

    pod: BoundPod
    why: str

    def as_dict(self) -> dict[str, object]:
        return {
            "namespace": self.pod.namespace,
            "name": self.pod.name,
            "labels": dict(self.pod.labels),
            "node": self.pod.node,
            "why": self.why,
        }


def places_pods(snapshot: Snapshot) -> bool:
    """Whether some role carries a placement: else no pod can be misplaced (and none is read)."""
    return any(role.placement is not None for role in snapshot.roles.values())


def _pod_writers(snapshot: Snapshot, namespace: str) -> list[CompiledRole]:
    """The valid roles bound in ``namespace`` (or cluster-wide) that grant creating pods."""
    found: dict[RoleRef, CompiledRole] = {}
    for scope in (namespace, ""):
        entries = snapshot.bindings.scopes.get(scope)
        for pairs in entries.entries.values() if entries is not None else ():
            for _, role in pairs:
                if role.error is None and role.grants(("create",), PODS, ""):
                    found.setdefault(role.ref, role)
    return list(found.values())


def misplaced(
    snapshot: Snapshot, pods: Iterable[BoundPod], allow_unlabeled: bool = False
) -> list[Misplaced]:
    """The pods bound to a node outside every pool their bucket is placed on (``placements``)."""
    return [
        Misplaced(pod, why)
        for pod, why in placements(snapshot, pods, allow_unlabeled)
        if why is not None
    ]


def placements(
    snapshot: Snapshot, pods: Iterable[BoundPod], allow_unlabeled: bool = False
) -> Iterator[tuple[BoundPod, str | None]]:
    """Each pod judged by where it runs, with why it is outside its pool (None: within it).

    A pod's bucket is held by the roles bound in its namespace (or cluster-wide) that grant
    creating pods and either carry a permission entry for pods that permits its labels or
    carry a placement and no such entry (roles with neither, an admin's or a controller's,
    hold no bucket). When each of them carries a placement, the pod's Node must fit one of
    them; a Node the snapshot does not know is a finding too. Pods whose bucket some role
    leaves unplaced, or that no role's bucket holds (``audit``'s orphans), are not judged here.
    """
    writers: dict[str, list[CompiledRole]] = {}
    for pod in pods:
        if not pod.node:
            continue
        if pod.namespace not in writers:
            writers[pod.namespace] = _pod_writers(snapshot, pod.namespace)
        bucket = [
            role for role in writers[pod.namespace] if _holds(role, pod.labels, allow_unlabeled)
        ]
        if not bucket or any(role.placement is None for role in bucket):
            continue
        node = snapshot.nodes.get(pod.node)
        if node is None:
            yield pod, f'node "{pod.node}" is not known'
            continue
        places = [r for r in bucket if r.placement is not None]
        if any(
            r.placement is not None and r.placement.node_misfit(node.labels) is None for r in places
        ):
            yield pod, None
            continue
        where = "; ".join(
            f"{r.ref} places it on {r.placement.describe()}" for r in places if r.placement
        )
        yield pod, f'node "{pod.node}" is outside its pool ({where})'


def _holds(role: CompiledRole, labels: Mapping[str, str], allow_unlabeled: bool) -> bool:
    """Whether ``role`` holds the bucket of a pod with ``labels`` (see ``misplaced``)."""
    entries = role.permissions.entries_for(PODS) if role.permissions else ()
    if not entries:
        return role.placement is not None
    return all(e.violation(labels, allow_unlabeled) is None for e in entries)
