"""Incremental snapshot updates: any sequence of changes decides exactly like a whole build.

``Snapshot.build`` over the objects present is the reference. Changes are made the way the
watches report them (an object's old and new compiled value under its informer key, a re-created
object reported before its predecessor's removal) and applied in batches of any size.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine.incremental import Change, LiveSnapshot
from app.engine.kinds import BY_KIND, build_snapshot
from app.engine.model import Resource, UserInfo
from app.engine.policy import DEFAULT_ANNOTATION_KEY
from app.engine.rbac import Compiler, Restrictions, RoleRef, Snapshot
from tests.support import binding, role, rule

COMPILER = Compiler((DEFAULT_ANNOTATION_KEY,))
NAMESPACES = ("t1", "t2")
RULES = (
    [rule("create update", "configmaps")],
    [rule("get list", "pods secrets")],
    [rule("*", "*", groups="*")],
    [rule("create", "configmaps", names="only")],
)
PERMISSIONS = (None, {"configmaps": {"team": ["a"]}}, {"*": {"env": ["dev-*"]}}, "not json")
SUBJECTS = ("User:alice", "User:bob", "Group:g1", "Group:system:authenticated",
            "ServiceAccount:t1:sa")  # fmt: skip
USERS = (
    UserInfo("alice"),
    UserInfo("bob", ("g1",)),
    UserInfo("carol", ("system:authenticated",)),
    UserInfo("system:serviceaccount:t1:sa", ("system:serviceaccounts",)),
)
CHECKS = (
    (("create",), Resource("", "configmaps"), ""),
    (("create",), Resource("", "configmaps"), "only"),
    (("get",), Resource("", "secrets"), "s1"),
    (("delete",), Resource("apps", "deployments"), "web"),
)

# One object of a kind: (kind, namespace, name) says which, the rest what it holds.
ROLES = st.builds(
    lambda ns, name, rules, permissions: role(name, ns, RULES[rules], PERMISSIONS[permissions]),
    st.sampled_from(("", *NAMESPACES)),
    st.sampled_from(("a", "b")),
    st.integers(0, len(RULES) - 1),
    st.integers(0, len(PERMISSIONS) - 1),
)
BINDINGS = st.builds(
    lambda ns, name, ref, ref_kind, subjects: binding(
        name, ref, *subjects, namespace=ns, role_kind=ref_kind if ns else None
    ),
    st.sampled_from(("", *NAMESPACES)),
    st.sampled_from(("x", "y", "z")),
    st.sampled_from(("a", "b", "missing")),
    st.sampled_from(("Role", "ClusterRole", "Unknown")),
    st.lists(st.sampled_from(SUBJECTS), max_size=4),
)
NAMESPACE_OBJECTS = st.builds(
    lambda name, mirror: ("Namespace", {"kind": "Namespace", "metadata": {
        "name": name, "annotations": {"node.kubernetes.io/x": mirror} if mirror else {}}}),
    st.sampled_from(NAMESPACES), st.sampled_from(("", "a", "b")),
)  # fmt: skip
NODE_OBJECTS = st.builds(
    lambda name, uid: ("Node", {"kind": "Node", "metadata": {"name": name, "uid": uid}}),
    st.sampled_from(("n1", "n2")), st.sampled_from(("u1", "u2")),
)  # fmt: skip
OBJECTS = ROLES | BINDINGS | NAMESPACE_OBJECTS | NODE_OBJECTS
# put: create or update in place; recreate: delete and create again (a new uid); delete.
OPERATIONS = st.tuples(st.sampled_from(("put", "put", "recreate", "delete")), OBJECTS)


class Informers:
    """The watches' caches: compiled objects by informer key (kind, namespace, name, uid)."""

    def __init__(self) -> None:
        self.items: dict[tuple[str, str, str], tuple[int, Any]] = {}
        self.uids = 0

    def do(self, operation: str, kind: str, obj: dict[str, Any]) -> list[Change]:
        """Apply one operation; the changes an informer reports for it, in its order."""
        meta = obj["metadata"]
        key = (kind, meta.get("namespace", ""), meta["name"])
        prior = self.items.get(key)
        old = None if prior is None else prior[1]
        if operation == "delete":
            self.items.pop(key, None)
            return [] if prior is None else [(kind, old, None)]
        new = BY_KIND[kind].compile(COMPILER, obj)
        if operation == "put" and prior is not None:
            self.items[key] = (prior[0], new)
            return [(kind, old, new)]
        self.uids += 1
        self.items[key] = (self.uids, new)
        # A re-list reports the new object first, then the old one's removal.
        return [(kind, None, new)] + ([] if prior is None else [(kind, old, None)])

    def reference(self) -> Snapshot:
        compiled: dict[str, list[Any]] = defaultdict(list)
        for (kind, _, _), (_, value) in self.items.items():
            compiled[kind].append(value)
        return build_snapshot(compiled)


def assert_decides_alike(live: Snapshot, reference: Snapshot) -> None:
    assert live.roles == reference.roles
    assert dict(live.bindings.items()) == dict(reference.bindings.items())
    assert len(live.bindings) == len(reference.bindings)
    assert {name: scope.limited for name, scope in live.bindings.scopes.items()} == {
        name: scope.limited for name, scope in reference.bindings.scopes.items()
    }
    assert live.namespaces == reference.namespaces
    assert live.nodes == reference.nodes
    for user in USERS:
        for namespace in ("", *NAMESPACES, "elsewhere"):
            assert list(live.roles_for(user, namespace)) == list(
                reference.roles_for(user, namespace)
            )
            assert live.limited(user, namespace) == reference.limited(user, namespace)
            for verbs, res, name in CHECKS:
                assert live.granting_roles(user, namespace, verbs, res, name) == (
                    reference.granting_roles(user, namespace, verbs, res, name)
                )


# Each example is cheap, and the interesting ones (a role changing after a binding to it was
# deleted, ...) are sequences: more examples than the default profile's.
@settings(max_examples=max(200, settings.default.max_examples))
@given(
    operations=st.lists(OPERATIONS, max_size=40),
    cuts=st.lists(st.integers(1, 6), max_size=40),
    whole=st.sampled_from((False, None)),
    asked=st.booleans(),
)
def test_any_changes_applied_in_batches_decide_like_a_whole_build(
    operations: list[tuple[str, tuple[str, dict[str, Any]]]],
    cuts: list[int],
    whole: bool | None,
    asked: bool,
) -> None:
    """``asked``: the restrictions are asked for after every batch, as the compiler asks."""
    informers = Informers()
    live = LiveSnapshot.empty()
    batches = iter(cuts)
    pending: list[Change] = []
    size = next(batches, 1)

    def check() -> None:
        reference = informers.reference()
        assert_decides_alike(live.snapshot, reference)
        if asked:
            kept = live.snapshot.known_restrictions
            assert live.snapshot.restrictions() == Restrictions.of(reference.roles.values())
            if kept is not None:  # updated by the batch's role changes, not computed again
                assert live.snapshot.known_restrictions is kept

    for operation, (kind, obj) in operations:
        pending += informers.do(operation, kind, obj)
        size -= 1
        if size <= 0:
            live = live.apply(pending, whole=whole)
            pending, size = [], next(batches, 1)
            check()
    live = live.apply(pending, whole=whole)
    check()
    # What it keeps to apply further changes is what indexing its objects whole gives.
    rebuilt = LiveSnapshot.of(live.objects)
    assert live.referrers == rebuilt.referrers
    assert live.objects == rebuilt.objects


def tenant_objects(namespaces: int, platform: int | None = None) -> list[tuple[str, Any]]:
    """Namespaces with a Role and its binding; the first ``platform`` (default all) also bind
    the ClusterRole ``platform`` to the group ops."""
    objects = [role("platform", "", RULES[2], PERMISSIONS[2])]
    for i in range(namespaces):
        ns = f"t{i}"
        objects += [
            ("Namespace", {"kind": "Namespace", "metadata": {"name": ns}}),
            role("team", ns, RULES[0], PERMISSIONS[1]),
            binding("team", "team", "User:alice", f"Group:{ns}-devs", namespace=ns),
        ]
        if platform is None or i < platform:
            objects.append(
                binding("platform", "platform", "Group:ops", namespace=ns, role_kind="ClusterRole")
            )
    return objects


def live_of(objects: list[tuple[str, Any]]) -> LiveSnapshot:
    compiled: dict[str, list[Any]] = defaultdict(list)
    for kind, obj in objects:
        compiled[kind].append(BY_KIND[kind].compile(COMPILER, obj))
    return LiveSnapshot.build(compiled)


def compiled(kind_obj: tuple[str, dict[str, Any]]) -> Any:
    return BY_KIND[kind_obj[0]].compile(COMPILER, kind_obj[1])


def test_a_change_in_one_namespace_shares_every_other_namespace_with_the_previous_snapshot() -> (
    None
):
    before = live_of(tenant_objects(50))
    old = before.snapshot.roles[RoleRef("t7", "team")]
    new = compiled(role("team", "t7", RULES[1], PERMISSIONS[1]))
    after = before.apply([("Role", old, new)], whole=False)
    scopes, prior = after.snapshot.bindings.scopes, before.snapshot.bindings.scopes
    assert [name for name in scopes if scopes[name] is not prior[name]] == ["t7"]
    assert after.snapshot.roles[RoleRef("t7", "team")] is new
    assert all(
        after.snapshot.roles[ref] is found for ref, found in before.snapshot.roles.items()
        if ref != RoleRef("t7", "team")
    )  # fmt: skip
    # The binding now resolves to the new role; alice's grants follow.
    alice = UserInfo("alice")
    assert before.snapshot.granting_roles(alice, "t7", ("create",), Resource("", "configmaps"), "")
    assert not after.snapshot.granting_roles(
        alice, "t7", ("create",), Resource("", "configmaps"), ""
    )
    assert after.snapshot.granting_roles(alice, "t7", ("get",), Resource("", "pods"), "p")


def test_a_cluster_role_change_touches_the_namespaces_whose_bindings_refer_to_it() -> None:
    before = live_of(tenant_objects(20, platform=10))
    old = before.snapshot.roles[RoleRef("", "platform")]
    new = compiled(role("platform", "", RULES[1], None))
    after = before.apply([("ClusterRole", old, new)], whole=False)
    scopes, prior = after.snapshot.bindings.scopes, before.snapshot.bindings.scopes
    touched = sorted(name for name in scopes if scopes[name] is not prior[name])
    assert touched == [f"t{i}" for i in range(10)]
    ops = UserInfo("o", ("ops",))
    assert before.snapshot.limited(ops, "t3") and not after.snapshot.limited(ops, "t3")
    assert after.snapshot.bound_roles(ops, "t3") == [new]
    assert after.snapshot.bound_roles(ops, "t15") == []


def test_a_binding_change_keeps_the_limits_of_the_other_subjects_in_its_namespace() -> None:
    before = live_of(tenant_objects(3))
    ops, devs = UserInfo("o", ("ops",)), UserInfo("d", ("t1-devs",))
    assert before.snapshot.limited(ops, "t1") and before.snapshot.limited(devs, "t1")
    old = next(b for b, _ in before.snapshot.roles_for(devs, "t1"))
    new = compiled(binding("team", "team", "User:alice", namespace="t1"))
    after = before.apply([("RoleBinding", old, new)], whole=False)
    assert after.snapshot.limited(ops, "t1") and not after.snapshot.limited(devs, "t1")
    assert after.snapshot.bound_roles(devs, "t1") == []
    assert after.snapshot.bound_roles(UserInfo("alice"), "t1") == [
        before.snapshot.roles[RoleRef("t1", "team")]
    ]


def test_a_binding_to_a_missing_role_grants_once_the_role_appears_and_stops_when_it_goes() -> None:
    live = LiveSnapshot.empty()
    bob = UserInfo("bob")
    bound = compiled(binding("b", "later", "User:bob", namespace="t1"))
    live = live.apply([("RoleBinding", None, bound)], whole=False)
    assert live.snapshot.bound_roles(bob, "t1") == []
    later = compiled(role("later", "t1", RULES[0]))
    live = live.apply([("Role", None, later)], whole=False)
    assert live.snapshot.bound_roles(bob, "t1") == [later]
    live = live.apply([("Role", later, None)], whole=False)
    assert live.snapshot.bound_roles(bob, "t1") == []
    assert RoleRef("t1", "later") in live.referrers  # the binding still waits for its role
    # Once the binding is gone, its role coming back grants nothing.
    live = live.apply([("RoleBinding", bound, None)], whole=False)
    live = live.apply([("Role", None, later)], whole=False)
    assert live.snapshot.bound_roles(bob, "t1") == []
    assert RoleRef("t1", "later") not in live.referrers


def test_restrictions_once_asked_are_updated_by_each_role_change_without_a_pass() -> None:
    live = live_of(tenant_objects(3))
    known = live.snapshot.restrictions()
    # A binding changes no role: the same restrictions, shared.
    bound = ("RoleBinding", None, compiled(binding("more", "team", "User:bob", namespace="t0")))
    assert live.apply([bound]).snapshot.known_restrictions is known
    # Three team roles restrict configmaps, the platform role "*": counted by pattern.
    counts = {key.resource.text: count for key, count in known.patterns.items()}
    assert counts == {"configmaps": 3, "*": 1}
    # The ClusterRoles' alone: what any namespace's roles may restrict.
    assert known.cluster is not None
    assert {key.resource.text: count for key, count in known.cluster.patterns.items()} == {"*": 1}
    # One of them edited to the platform's annotation: counted there, without a pass.
    edited = compiled(role("team", "t0", RULES[0], PERMISSIONS[2]))
    old = live.snapshot.roles[RoleRef("t0", "team")]
    changed = live.apply([("Role", old, edited)]).snapshot
    after = changed.known_restrictions
    assert after is not None and after == Restrictions.of(changed.roles.values())
    counts = {key.resource.text: count for key, count in after.patterns.items()}
    assert counts == {"configmaps": 2, "*": 2}
    assert after.cluster is known.cluster  # no ClusterRole changed: shared
    # A role whose annotation is unreadable: its rules restrict, and go with it.
    broken = compiled(role("team", "t1", RULES[0], PERMISSIONS[3]))
    old = live.snapshot.roles[RoleRef("t1", "team")]
    after = live.apply([("Role", old, broken)]).snapshot.known_restrictions
    assert after is not None and after.broken_rules == list(broken.rules)
    gone = live.apply([("Role", old, broken)]).apply([("Role", broken, None)])
    assert gone.snapshot.known_restrictions is not None
    assert gone.snapshot.known_restrictions.broken_rules == []


def test_a_recreated_object_reported_before_its_predecessors_removal_stays() -> None:
    # A re-list after a delete and re-create: the same compiled value under two informer keys,
    # the new one reported first.
    team = compiled(role("team", "t1", RULES[0]))
    again = compiled(role("team", "t1", RULES[0]))
    live = LiveSnapshot.empty().apply([("Role", None, team)])
    live = live.apply([("Role", None, again), ("Role", team, None)], whole=False)
    assert live.snapshot.roles[RoleRef("t1", "team")] == team
    live = live.apply([("Role", again, None)], whole=False)
    assert RoleRef("t1", "team") not in live.snapshot.roles


def test_a_removal_of_an_object_never_seen_changes_nothing() -> None:
    live = live_of(tenant_objects(3))
    ghost = compiled(role("ghost", "t1", RULES[0]))
    after = live.apply([("Role", ghost, None)], whole=False)
    assert after.snapshot == live.snapshot


def test_a_node_relabelled_changes_the_labels_the_snapshot_keeps() -> None:
    """The placement rule reads Nodes' labels from the snapshot: a Node moved to another pool
    (or deleted) is seen as such after the change, one change at a time."""
    pool = "node-restriction.kubernetes.io/pool"

    def node(value: str) -> Any:
        return compiled(
            ("Node", {"metadata": {"name": "n1", "uid": "u1", "labels": {pool: value}}})
        )

    live = LiveSnapshot.empty()
    first, moved = node("a"), node("b")
    live = live.apply([("Node", None, first)], whole=False)
    assert live.snapshot.nodes["n1"].labels[pool] == "a"
    live = live.apply([("Node", first, moved)], whole=False)
    assert live.snapshot.nodes["n1"].labels[pool] == "b" and live.snapshot.nodes["n1"].uid == "u1"
    live = live.apply([("Node", moved, None)], whole=False)
    assert "n1" not in live.snapshot.nodes
