"""RBAC as the RBAC authorizer evaluates it: rules, subjects, bindings and their scopes."""

from __future__ import annotations

import time
from typing import Any

import pytest

from app.engine.kinds import KINDS, snapshot_from_objects
from app.engine.model import Resource, UserInfo, authorizations
from app.engine.policy import DEFAULT_ANNOTATION_KEY
from app.engine.rbac import (
    RBAC_GROUP,
    Compiler,
    RoleRef,
    Rule,
    Snapshot,
    authorizing_roles,
    subject_keys,
    user_keys,
)
from tests.support import API, binding, role, rule, snapshot

ALICE = UserInfo("alice", ("tenants", "system:authenticated"))
BOB = UserInfo("bob", ("tenants", "system:authenticated"))
CAROL = UserInfo("carol", ("auditors", "system:authenticated"))
BUILDER = UserInfo("system:serviceaccount:t1:builder", ("system:serviceaccounts",))


def R(text: str, group: str = "") -> Resource:
    resource, _, sub = text.partition("/")
    return Resource(group, resource, sub)


# --- Rule matching ---------------------------------------------------------------------------


def compiled(verbs: str, resources: str, groups: str = "", names: str = "") -> Rule:
    return Rule.compile(rule(verbs, resources, groups, names))


@pytest.mark.parametrize(
    ("the_rule", "verb", "resource", "name", "expected"),
    [
        # verbs
        pytest.param(compiled("get", "pods"), "get", R("pods"), "p", True, id="verb-exact"),
        pytest.param(compiled("get", "pods"), "create", R("pods"), "p", False, id="verb-other"),
        pytest.param(compiled("*", "pods"), "delete", R("pods"), "p", True, id="verb-star"),
        pytest.param(
            compiled("update", "pods"), "patch", R("pods"), "p", False, id="update-is-not-patch"
        ),
        # apiGroups
        pytest.param(
            compiled("get", "deployments", "apps"),
            "get",
            R("deployments", "apps"),
            "d",
            True,
            id="group-exact",
        ),
        pytest.param(
            compiled("get", "deployments"),
            "get",
            R("deployments", "apps"),
            "d",
            False,
            id="core-group-is-not-apps",
        ),
        pytest.param(
            compiled("get", "deployments", "apps"),
            "get",
            R("deployments"),
            "d",
            False,
            id="apps-is-not-core",
        ),
        pytest.param(
            compiled("get", "deployments", "*"),
            "get",
            R("deployments", "apps"),
            "d",
            True,
            id="group-star",
        ),
        pytest.param(
            compiled("get", "deployments", "extensions apps"),
            "get",
            R("deployments", "apps"),
            "d",
            True,
            id="group-in-list",
        ),
        pytest.param(
            Rule(frozenset({"get"}), frozenset(), frozenset({"pods"})),
            "get",
            R("pods"),
            "p",
            False,
            id="no-api-groups-match-nothing",
        ),
        # resources
        pytest.param(compiled("get", "*"), "get", R("secrets"), "s", True, id="resource-star"),
        pytest.param(
            compiled("get", "*"), "get", R("pods/log"), "p", True, id="resource-star-covers-sub"
        ),
        pytest.param(
            compiled("get", "pods"), "get", R("pods/log"), "p", False, id="parent-not-sub"
        ),
        pytest.param(
            compiled("get", "pods/log"), "get", R("pods/log"), "p", True, id="res-sub-exact"
        ),
        pytest.param(
            compiled("get", "pods/log"), "get", R("pods"), "p", False, id="res-sub-not-parent"
        ),
        pytest.param(
            compiled("get", "pods/log"), "get", R("pods/exec"), "p", False, id="res-sub-other-sub"
        ),
        pytest.param(
            compiled("update", "*/scale", "*"),
            "update",
            R("deployments/scale", "apps"),
            "d",
            True,
            id="star-sub",
        ),
        pytest.param(
            compiled("update", "*/scale", "*"),
            "update",
            R("deployments", "apps"),
            "d",
            False,
            id="star-sub-not-parent",
        ),
        pytest.param(
            compiled("update", "*/scale", "*"),
            "update",
            R("deployments/status", "apps"),
            "d",
            False,
            id="star-sub-other-sub",
        ),
        pytest.param(
            compiled("get", "*/log"), "get", R("pods/xlog"), "p", False, id="star-sub-no-suffix"
        ),
        # resourceNames
        pytest.param(
            compiled("update", "configmaps", names="c1"),
            "update",
            R("configmaps"),
            "c1",
            True,
            id="names-listed",
        ),
        pytest.param(
            compiled("update", "configmaps", names="c1"),
            "update",
            R("configmaps"),
            "c2",
            False,
            id="names-not-listed",
        ),
        pytest.param(
            compiled("create", "configmaps", names="c1"),
            "create",
            R("configmaps"),
            "c1",
            True,
            id="names-create-with-name",
        ),
        pytest.param(
            compiled("create", "configmaps", names="c1"),
            "create",
            R("configmaps"),
            "",
            False,
            id="names-create-without-name",
        ),
        pytest.param(
            compiled("create", "configmaps", names=""),
            "create",
            R("configmaps"),
            "",
            True,
            id="no-names-any-name-even-none",
        ),
        pytest.param(
            compiled("create", "pods/eviction", names="app"),
            "create",
            R("pods/eviction"),
            "app",
            True,
            id="names-subresource-create",
        ),
        pytest.param(
            compiled("delete deletecollection", "configmaps", names="c1"),
            "deletecollection",
            R("configmaps"),
            "",
            False,
            id="names-never-deletecollection",
        ),
        pytest.param(
            compiled("delete deletecollection", "configmaps", names="c1"),
            "delete",
            R("configmaps"),
            "c1",
            True,
            id="names-delete",
        ),
        pytest.param(
            compiled("get", "configmaps", names="c1"),
            "get",
            R("configmaps"),
            "",
            False,
            id="names-need-a-name",
        ),
        pytest.param(
            compiled("create", "configmaps"),
            "create",
            R("configmaps"),
            "c1",
            True,
            id="no-names-any-name",
        ),
    ],
)
def test_rule_matches(the_rule: Rule, verb: str, resource: Resource, name: str, expected: bool):
    assert the_rule.matches(verb, resource, name) is expected


def test_rule_with_only_non_resource_urls_is_dropped() -> None:
    kind, obj = role("metrics-reader", rules=[{"verbs": ["*"], "nonResourceURLs": ["*"]}])
    compiled_role = Compiler((DEFAULT_ANNOTATION_KEY,)).role(obj, kind)
    assert compiled_role.rules == ()
    assert not compiled_role.grants(("get",), R("pods"), "p")


def test_null_rules_grant_nothing() -> None:
    # Aggregated ClusterRoles are listed with ``rules: null`` until the controller fills them.
    compiled_role = Compiler((DEFAULT_ANNOTATION_KEY,)).role(
        {"metadata": {"name": "admin"}, "rules": None}, "ClusterRole"
    )
    assert compiled_role.rules == ()


def test_grants_tries_every_verb_of_the_operation() -> None:
    kind, obj = role("patcher", "t1", [rule("patch", "configmaps")])
    compiled_role = Compiler((DEFAULT_ANNOTATION_KEY,)).role(obj, kind)
    assert compiled_role.grants(("update", "patch"), R("configmaps"), "c1")
    assert not compiled_role.grants(("update",), R("configmaps"), "c1")


# --- Subjects --------------------------------------------------------------------------------


def test_subject_keys() -> None:
    subjects: dict[str, Any] = {
        "subjects": [
            {"kind": "User", "name": "alice"},
            {"kind": "Group", "name": "tenants"},
            {"kind": "ServiceAccount", "name": "builder", "namespace": "t2"},
            {"kind": "ServiceAccount", "name": "deployer"},
            {"kind": "User", "name": ""},
            {"kind": "Robot", "name": "r2d2"},
        ]
    }
    assert subject_keys(subjects, "t1") == (
        ("User", "alice"),
        ("Group", "tenants"),
        ("User", "system:serviceaccount:t2:builder"),
        ("User", "system:serviceaccount:t1:deployer"),
    )


def test_user_keys() -> None:
    assert user_keys(ALICE) == (
        ("User", "alice"),
        ("Group", "tenants"),
        ("Group", "system:authenticated"),
    )


EDITOR = role("editor", "t1", [rule("*", "configmaps")])


def granted(snap: Snapshot, user: UserInfo, namespace: str = "t1", resource: str = "configmaps"):
    roles = snap.granting_roles(user, namespace, ("create",), R(resource), "x")
    return [str(r.ref) for r in roles]


@pytest.mark.parametrize(
    ("subject", "user", "expected"),
    [
        pytest.param("User:alice", ALICE, True, id="user-by-name"),
        pytest.param("User:alice", BOB, False, id="user-other-name"),
        pytest.param("Group:tenants", BOB, True, id="group-member"),
        pytest.param("Group:tenants", CAROL, False, id="group-non-member"),
        pytest.param("Group:system:authenticated", CAROL, True, id="group-authenticated"),
        pytest.param("User:tenants", BOB, False, id="user-subject-is-not-a-group"),
        pytest.param("Group:alice", ALICE, False, id="group-subject-is-not-a-user"),
        pytest.param("ServiceAccount:t1:builder", BUILDER, True, id="service-account"),
        pytest.param("ServiceAccount:t2:builder", BUILDER, False, id="sa-other-namespace"),
        pytest.param("ServiceAccount::builder", BUILDER, True, id="sa-namespace-from-binding"),
        pytest.param(
            "User:system:serviceaccount:t1:builder", BUILDER, True, id="sa-as-user-subject"
        ),
    ],
)
def test_subject_kinds(subject: str, user: UserInfo, expected: bool) -> None:
    snap = snapshot(EDITOR, binding("b", "editor", subject, namespace="t1"))
    assert granted(snap, user) == (["role t1/editor"] if expected else [])


def test_service_account_without_namespace_in_cluster_binding_matches_nobody() -> None:
    # A ClusterRoleBinding has no namespace to default to, as in the RBAC authorizer.
    snap = snapshot(
        role("editor", rules=[rule("*", "configmaps")]),
        binding("b", "editor", "ServiceAccount::builder"),
    )
    assert granted(snap, BUILDER) == []


# --- Bindings and scopes ---------------------------------------------------------------------

CLUSTER_EDITOR = role("cluster-editor", rules=[rule("*", "configmaps")])


def test_rolebinding_to_role_is_namespace_scoped() -> None:
    snap = snapshot(EDITOR, binding("b", "editor", "User:alice", namespace="t1"))
    assert granted(snap, ALICE, "t1") == ["role t1/editor"]
    assert granted(snap, ALICE, "t2") == []
    assert granted(snap, ALICE, "") == []


def test_rolebinding_to_clusterrole_is_scoped_to_the_binding_namespace() -> None:
    snap = snapshot(
        CLUSTER_EDITOR,
        binding("b", "cluster-editor", "User:alice", namespace="t1", role_kind="ClusterRole"),
    )
    assert granted(snap, ALICE, "t1") == ["clusterrole cluster-editor"]
    assert granted(snap, ALICE, "t2") == []
    # Nor does it reach cluster-scoped requests.
    assert granted(snap, ALICE, "") == []


def test_clusterrolebinding_is_cluster_wide() -> None:
    snap = snapshot(CLUSTER_EDITOR, binding("b", "cluster-editor", "Group:tenants"))
    assert granted(snap, ALICE, "t1") == ["clusterrole cluster-editor"]
    assert granted(snap, BOB, "t2") == ["clusterrole cluster-editor"]
    assert granted(snap, ALICE, "") == ["clusterrole cluster-editor"]
    assert granted(snap, CAROL, "t1") == []


def test_rolebinding_cannot_reach_a_role_in_another_namespace() -> None:
    # roleRef has no namespace: a RoleBinding's Role is always in the binding's own namespace.
    other = role("editor", "t2", [rule("*", "configmaps")])
    snap = snapshot(other, binding("b", "editor", "User:alice", namespace="t1"))
    assert granted(snap, ALICE, "t1") == []
    assert granted(snap, ALICE, "t2") == []


def test_binding_to_a_missing_role_grants_nothing() -> None:
    snap = snapshot(
        binding("b1", "ghost", "User:alice", namespace="t1"),
        binding("b2", "ghost", "User:alice"),
    )
    assert list(snap.roles_for(ALICE, "t1")) == []
    assert granted(snap, ALICE) == []


@pytest.mark.parametrize(
    ("kind", "namespace", "ref_kind", "expected"),
    [
        pytest.param("RoleBinding", "t1", "Role", RoleRef("t1", "r"), id="rb-role"),
        pytest.param("RoleBinding", "t1", "ClusterRole", RoleRef("", "r"), id="rb-clusterrole"),
        pytest.param("ClusterRoleBinding", "", "ClusterRole", RoleRef("", "r"), id="crb-cr"),
        # A ClusterRoleBinding cannot refer to a Role: the API rejects it, the engine ignores it.
        pytest.param("ClusterRoleBinding", "", "Role", None, id="crb-role-ignored"),
        pytest.param("RoleBinding", "t1", "Group", None, id="unknown-kind-ignored"),
        pytest.param("RoleBinding", "", "Role", None, id="rb-without-namespace-ignored"),
    ],
)
def test_role_ref_kinds(kind: str, namespace: str, ref_kind: str, expected: RoleRef | None):
    obj = {
        "metadata": {"name": "b", **({"namespace": namespace} if namespace else {})},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": ref_kind, "name": "r"},
        "subjects": [{"kind": "User", "name": "alice"}],
    }
    compiled_binding = Compiler.binding(obj, kind)
    if expected is None:
        assert compiled_binding is None
    else:
        assert compiled_binding is not None and compiled_binding.role == expected
        assert compiled_binding.role.kind == ref_kind


def test_role_and_clusterrole_of_the_same_name_are_distinct() -> None:
    snap = snapshot(
        role("editor", "t1", [rule("get", "configmaps")]),
        role("editor", rules=[rule("create", "configmaps")]),
        binding("b", "editor", "User:alice", namespace="t1"),
    )
    # The RoleBinding refers to the Role, which does not grant create.
    assert granted(snap, ALICE) == []


def test_granting_roles_are_distinct_and_in_binding_order() -> None:
    snap = snapshot(
        EDITOR,
        CLUSTER_EDITOR,
        binding("b1", "editor", "User:alice", "Group:tenants", namespace="t1"),
        binding("b2", "editor", "Group:tenants", namespace="t1"),
        binding("b3", "cluster-editor", "User:alice"),
    )
    assert granted(snap, ALICE) == ["role t1/editor", "clusterrole cluster-editor"]


def test_only_roles_granting_the_request_are_returned() -> None:
    snap = snapshot(
        role("reader", "t1", [rule("get list", "configmaps")]),
        EDITOR,
        binding("b1", "reader", "User:alice", namespace="t1"),
        binding("b2", "editor", "User:bob", namespace="t1"),
    )
    assert granted(snap, ALICE) == []
    assert granted(snap, BOB) == ["role t1/editor"]


def test_role_str_and_kind() -> None:
    assert str(RoleRef("t1", "team-a")) == "role t1/team-a"
    assert str(RoleRef("", "view")) == "clusterrole view"
    assert RoleRef("t1", "x").kind == "Role"
    assert RoleRef("", "x").kind == "ClusterRole"


def test_invalid_annotation_is_recorded_not_raised() -> None:
    snap = snapshot(role("bad", "t1", [rule("*", "configmaps")], permissions="{"))
    compiled_role = snap.roles[RoleRef("t1", "bad")]
    assert compiled_role.permissions is None
    assert compiled_role.error is not None and "not valid JSON" in compiled_role.error


@pytest.mark.parametrize(
    ("rules", "fragment"),
    [
        pytest.param(7, "rules must be a list", id="rules-not-list"),
        pytest.param(["x"], "each rule must be an object", id="rule-not-object"),
        pytest.param([{"verbs": "create", "resources": ["pods"]}], "verbs", id="verbs-string"),
        pytest.param([{"verbs": ["*"], "resources": [1]}], "resources", id="resource-int"),
    ],
)
def test_malformed_rules_grant_nothing(rules: Any, fragment: str) -> None:
    kind, obj = role("odd", "t1")
    obj["rules"] = rules
    compiled = Compiler((DEFAULT_ANNOTATION_KEY,)).role(obj, kind)
    assert compiled.rules == ()
    assert compiled.error is not None and fragment in compiled.error


@pytest.mark.parametrize(
    ("field", "value"),
    [
        pytest.param("roleRef", 7, id="role-ref-int"),
        pytest.param("roleRef", {"kind": "ClusterRole", "name": ["view"]}, id="role-name-list"),
        pytest.param("roleRef", {"kind": "ClusterRole"}, id="role-name-missing"),
    ],
)
def test_malformed_role_ref_binds_nothing(field: str, value: Any) -> None:
    kind, obj = binding("b", "view", "User:alice")
    obj[field] = value
    assert Compiler.binding(obj, kind) is None


def test_malformed_subjects_are_skipped() -> None:
    kind, obj = binding("b", "view", "User:alice")
    obj["subjects"] = [7, {"kind": "User", "name": ["bob"]}, {"kind": "Group", "name": "ops"}]
    compiled = Compiler.binding(obj, kind)
    assert compiled is not None and compiled.subjects == (("Group", "ops"),)


@pytest.mark.parametrize("metadata", [7, "x", [1], {"name": ["n"], "namespace": 7}])
@pytest.mark.parametrize("kind", [spec.kind for spec in KINDS])
def test_malformed_metadata_compiles_to_nothing_granted(kind: str, metadata: Any) -> None:
    """A file's object with metadata of the wrong shape (``--rbac-dir``, ``lint``) is no error
    of the process reading it: it compiles, nameless, and grants nothing."""
    obj = {"apiVersion": "v1", "kind": kind, "metadata": metadata,
           "rules": [rule("create", "configmaps")],
           "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": "r"},
           "subjects": [{"kind": "User", "name": "alice"}]}  # fmt: skip
    snap = snapshot_from_objects([(kind, obj)], Compiler((DEFAULT_ANNOTATION_KEY,)))
    assert snap.granting_roles(ALICE, "t1", ("create",), Resource("", "configmaps"), "x") == []


# --- The recorded bootstrap RBAC -------------------------------------------------------------


def _bootstrap() -> Snapshot:
    from app.source.static import read_manifests

    objects = read_manifests(
        API / "list-clusterroles.json",
        API / "list-clusterrolebindings.json",
        API / "list-roles.json",
        API / "list-rolebindings.json",
    )
    return snapshot_from_objects(objects, Compiler((DEFAULT_ANNOTATION_KEY,)))


def test_recorded_cluster_admin_grants_everything_to_system_masters() -> None:
    admin = UserInfo("admin", ("system:masters", "system:authenticated"))
    roles = _bootstrap().granting_roles(
        admin, "default", ("create",), R("mwan3policies", "batch.sdewan.akraino.org"), "p1"
    )
    assert [str(r.ref) for r in roles] == ["clusterrole cluster-admin"]


def test_recorded_system_node_binding_has_no_subjects() -> None:
    # Nodes are authorized by the Node authorizer, not RBAC: the bootstrap system:node
    # ClusterRoleBinding has no subjects, so no role grants a kubelet anything here.
    node1 = UserInfo("system:node:node1", ("system:nodes", "system:authenticated"))
    snap = _bootstrap()
    assert snap.granting_roles(node1, "", ("create",), R("nodes"), "node1") == []
    assert snap.granting_roles(node1, "default", ("create",), R("pods/eviction"), "app") == []


def test_recorded_aggregated_view_role_is_empty_until_aggregated() -> None:
    # The recording ran without kube-controller-manager, so ``view`` is listed with
    # ``rules: null``. The engine reads rules as stored (aggregation is the controller's job):
    # carol's binding to it grants nothing, not even reads.
    snap = _bootstrap()
    assert snap.roles[RoleRef("", "view")].rules == ()
    assert snap.roles[RoleRef("", "system:aggregate-to-view")].rules != ()
    assert snap.granting_roles(CAROL, "default", ("get",), R("configmaps"), "c") == []


def test_recorded_tenant_role_is_restricted() -> None:
    alice = UserInfo("alice", ("system:authenticated",))
    (tenant_a,) = _bootstrap().granting_roles(alice, "default", ("create",), R("configmaps"), "c")
    assert str(tenant_a.ref) == "role default/tenant-a"
    assert tenant_a.permissions is not None
    (entry,) = tenant_a.permissions.entries_for(R("configmaps"))
    assert entry.describe() == "team in [a]"


def test_thousands_of_granting_roles_are_found_in_linear_time() -> None:
    """A namespace admin may bind herself to as many roles as she likes: finding the distinct
    granting ones must not cost their number squared (it used to: seconds of CPU at 10,000)."""
    count = 10_000
    objects = []
    for i in range(count):
        objects.append(role(f"r{i}", "t1", rules=[rule("create", "configmaps")]))
        objects.append(binding(f"b{i}", f"r{i}", "User:alice", namespace="t1"))
    snap = snapshot(*objects)
    started = time.process_time()
    found = snap.granting_roles(
        UserInfo("alice"), "t1", ("create",), Resource("", "configmaps"), ""
    )
    elapsed = time.process_time() - started
    assert len(found) == count
    assert len({id(r) for r in found}) == count
    assert elapsed < 1.0, f"{count} granting roles took {elapsed:.2f}s of CPU"


def test_thousands_of_name_scoped_create_roles_are_found_in_linear_time() -> None:
    """A create with a name counts roles granting it only after update or patch is held on that
    name: that is looked up once per request, not once per such role."""
    count = 10_000
    objects = [role("patcher", "t1", rules=[rule("patch", "configmaps", names="c1")])]
    objects.append(binding("patcher", "patcher", "User:alice", namespace="t1"))
    for i in range(count):
        objects.append(role(f"r{i}", "t1", rules=[rule("create", "configmaps", names="c1")]))
        objects.append(binding(f"b{i}", f"r{i}", "User:alice", namespace="t1"))
    snap = snapshot(*objects)
    alternatives = authorizations("CREATE", Resource("", "configmaps"), "c1")[0]
    started = time.process_time()
    found = authorizing_roles(
        snap.bound_roles(UserInfo("alice"), "t1"), R("configmaps"), alternatives
    )
    elapsed = time.process_time() - started
    assert len(found) == count
    assert elapsed < 2.0, f"{elapsed:.2f}s for {count} roles"


def test_equal_rules_and_annotations_of_many_roles_are_shared() -> None:
    # A Role per tenant namespace repeats the same rules and annotation: compiled once, shared.
    rules = [rule("create update", "configmaps secrets"), rule("get", "pods", names="p1")]
    permissions = {"configmaps": {"team": ["shared-rules"]}}
    snap = snapshot(*(role("team", f"ns-{i}", rules, permissions) for i in range(3)))
    compiled = [snap.roles[RoleRef(f"ns-{i}", "team")] for i in range(3)]
    for other in compiled[1:]:
        assert all(a is b for a, b in zip(other.rules, compiled[0].rules, strict=True))
        assert other.permissions is compiled[0].permissions
    # A rule that differs in any field is its own.
    changed = snapshot(role("team", "ns-x", [rule("create update", "configmaps secrets",
                                                  names="only")], permissions))  # fmt: skip
    assert changed.roles[RoleRef("ns-x", "team")].rules[0] is not compiled[0].rules[0]
    assert changed.roles[RoleRef("ns-x", "team")].rules[0].names == frozenset({"only"})
