"""The decision: each rule of the label check, its messages, and the checks that run before it."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import pytest

from app.engine.context import (
    Context,
    Options,
    ParentLookup,
    ParentUnavailable,
    no_parent_lookup,
)
from app.engine.decide import evaluate
from app.engine.labels import label_states, object_is_parent
from app.engine.model import Decision, Request, Resource, UserInfo
from app.engine.policy import DEFAULT_ANNOTATION_KEY
from app.engine.rbac import Compiler
from app.webhook.wire import parse_review
from tests.support import binding, load_review, role, rule, snapshot

RBAC = "rbac.authorization.k8s.io"
AKRAINO_KEY = "sdewan-bucket-type-permission"
AKRAINO_LABEL = "sdewan-bucket-type"

Obj = tuple[str, dict[str, Any]]

USERS = {
    "alice": UserInfo("alice", ("tenants", "system:authenticated")),
    "bob": UserInfo("bob", ("tenants", "system:authenticated")),
    "carol": UserInfo("carol", ("auditors", "system:authenticated")),
    "builder": UserInfo(
        "system:serviceaccount:t1:builder",
        ("system:serviceaccounts", "system:serviceaccounts:t1", "system:authenticated"),
    ),
}


def labelled(labels: Mapping[str, str] | None, kind: str = "ConfigMap", name: str = "c2"):
    if labels is None:
        return None
    return {"kind": kind, "metadata": {"name": name, "namespace": "t1", "labels": dict(labels)}}


def request(
    user: str,
    operation: str,
    resource: str = "configmaps",
    *,
    namespace: str = "t1",
    name: str = "c2",
    labels: Mapping[str, str] | None = None,
    old: Mapping[str, str] | None = None,
    kind: str = "",
    obj: Mapping[str, Any] | None = None,
) -> Request:
    """A request as ``parse_review`` builds it; ``resource`` is ``res[.group][/sub]``."""
    return Request(
        uid="uid-1",
        operation=operation,
        user=USERS[user],
        resource=Resource.parse(resource),
        kind=kind,
        namespace=namespace,
        name=name,
        object=obj if obj is not None else labelled(labels, kind or "ConfigMap", name),
        old_object=labelled(old, kind or "ConfigMap", name),
    )


def decide(
    objects: tuple[Obj, ...],
    req: Request,
    *,
    allow_unlabeled: bool = False,
    lookup: ParentLookup = no_parent_lookup,
    annotation_keys: tuple[str, ...] = (DEFAULT_ANNOTATION_KEY,),
    default_label_key: str | None = None,
) -> Decision:
    compiler = Compiler(annotation_keys, default_label_key)
    snap = snapshot(*objects, annotation_keys=annotation_keys, default_label_key=default_label_key)
    return evaluate(req, Context(snap, Options(compiler, allow_unlabeled), lookup))


# --- The RBAC world the table runs in ------------------------------------------------------------

WRITE = "create update patch delete"
TEAM_A = {"configmaps": {"team": ["a"]}}

TEAM_A_ROLE = role("team-a", "t1", [rule(WRITE, "configmaps")], TEAM_A)
BOB_TEAM_A = binding("bob-team-a", "team-a", "User:bob", namespace="t1")
TENANTS_TEAM_A = binding("tenants-team-a", "team-a", "Group:tenants", namespace="t1")
BUILDER_TEAM_A = binding("builder-team-a", "team-a", "ServiceAccount:t1:builder", namespace="t1")

TEAM_B_ROLE = role("team-b", "t1", [rule(WRITE, "configmaps")], {"configmaps": {"team": ["b"]}})
BOB_TEAM_B = binding("bob-team-b", "team-b", "User:bob", namespace="t1")

EDITOR_ROLE = role("editor", "t1", [rule("*", "configmaps")])  # no annotation: unrestricted
BOB_EDITOR = binding("bob-editor", "editor", "User:bob", namespace="t1")

READER_ROLE = role("reader", "t1", [rule("get list watch", "configmaps")], TEAM_A)
BOB_READER = binding("bob-reader", "reader", "User:bob", namespace="t1")

SECRETS_ONLY = role("secrets-only", "t1", [rule(WRITE, "configmaps")], {"secrets": {"team": ["a"]}})
BOB_SECRETS_ONLY = binding("bob-secrets-only", "secrets-only", "User:bob", namespace="t1")

TEAM_A_CLUSTER = role("team-a", rules=[rule(WRITE, "configmaps")], permissions=TEAM_A)
BOB_TEAM_A_CLUSTER_IN_T1 = binding(
    "bob-team-a", "team-a", "User:bob", namespace="t1", role_kind="ClusterRole"
)

INVALID_ROLE = role("broken", "t1", [rule(WRITE, "configmaps")], '{"configmaps": {"team": []}}')
BOB_INVALID = binding("bob-broken", "broken", "User:bob", namespace="t1")

NAMED_ROLE = role(
    "c1-only", "t1", [rule("create update patch delete", "configmaps", names="c1")], TEAM_A
)
BOB_NAMED = binding("bob-c1-only", "c1-only", "User:bob", namespace="t1")

COLLECTION_ROLE = role("sweeper", "t1", [rule("deletecollection", "configmaps")], TEAM_A)
BOB_COLLECTION = binding("bob-sweeper", "sweeper", "User:bob", namespace="t1")

TWO_KEYS_ROLE = role(
    "team-env",
    "t1",
    [rule(WRITE, "configmaps")],
    {"configmaps": {"team": ["a"], "env": ["prod", "dev-*"]}},
)
BOB_TWO_KEYS = binding("bob-team-env", "team-env", "User:bob", namespace="t1")

SCALER_ROLE = role(
    "scaler",
    "t1",
    [rule("get update patch", "*/scale", "*"), rule("create", "pods/exec pods/eviction")],
    {"deployments": {"team": ["a"]}, "pods": {"team": ["a"]}},
)
BOB_SCALER = binding("bob-scaler", "scaler", "User:bob", namespace="t1")

POD_STATUS_ROLE = role(
    "pod-status", "t1", [rule("update patch", "pods/status")], {"pods": {"team": ["a"]}}
)
BOB_POD_STATUS = binding("bob-pod-status", "pod-status", "User:bob", namespace="t1")

CREATE_A = {"team": "a"}
CREATE_B = {"team": "b"}


@dataclass(frozen=True)
class Expect:
    allowed: bool
    reason: str
    contains: tuple[str, ...] = ()
    code: int | None = None


def ok(reason: str) -> Expect:
    return Expect(True, reason, code=200)


def no(reason: str, *contains: str, code: int = 403) -> Expect:
    return Expect(False, reason, contains, code)


CASES = [
    # -- whether any role grants the request at all
    pytest.param(
        (TEAM_A_ROLE, BOB_TEAM_A),
        request("carol", "CREATE", labels=CREATE_B),
        ok("NoGrantingRole"),
        id="unbound-user-left-to-rbac",
    ),
    pytest.param(
        (READER_ROLE, BOB_READER),
        request("bob", "CREATE", labels=CREATE_B),
        ok("NoGrantingRole"),
        id="role-grants-other-verbs-only",
    ),
    pytest.param(
        (TEAM_A_ROLE, BOB_TEAM_A),
        request("bob", "CREATE", labels=CREATE_B, namespace="t2"),
        ok("NoGrantingRole"),
        id="role-in-other-namespace",
    ),
    pytest.param(
        (binding("bob-ghost", "ghost", "User:bob", namespace="t1"),),
        request("bob", "CREATE", labels=CREATE_B),
        ok("NoGrantingRole"),
        id="binding-to-missing-role",
    ),
    # -- unrestricted grants
    pytest.param(
        (EDITOR_ROLE, BOB_EDITOR),
        request("bob", "CREATE", labels=CREATE_B),
        ok("Unrestricted"),
        id="role-without-annotation",
    ),
    pytest.param(
        (SECRETS_ONLY, BOB_SECRETS_ONLY),
        request("bob", "CREATE", labels=CREATE_B),
        ok("Unrestricted"),
        id="annotation-without-entry-for-resource",
    ),
    pytest.param(
        (TEAM_A_ROLE, BOB_TEAM_A, EDITOR_ROLE, BOB_EDITOR),
        request("bob", "CREATE", labels=CREATE_B),
        ok("Unrestricted"),
        id="one-of-two-roles-unrestricted",
    ),
    pytest.param(
        (EDITOR_ROLE, BOB_EDITOR, TEAM_A_ROLE, BOB_TEAM_A),
        request("bob", "CREATE", labels=CREATE_B),
        ok("Unrestricted"),
        id="unrestricted-role-bound-first",
    ),
    # -- CREATE judges the new object
    pytest.param(
        (TEAM_A_ROLE, BOB_TEAM_A),
        request("bob", "CREATE", labels=CREATE_A),
        ok("LabelsPermitted"),
        id="create-permitted",
    ),
    pytest.param(
        (TEAM_A_ROLE, BOB_TEAM_A),
        request("bob", "CREATE", labels=CREATE_B),
        no("LabelNotPermitted", 'label team="b" is not permitted'),
        id="create-wrong-value",
    ),
    pytest.param(
        (TEAM_A_ROLE, BOB_TEAM_A),
        request("bob", "CREATE", labels={}),
        no("LabelNotPermitted", "missing label team"),
        id="create-unlabeled",
    ),
    pytest.param(
        (TEAM_A_ROLE, BOB_TEAM_A),
        request("bob", "CREATE", labels={"team": "a", "other": "x"}),
        ok("LabelsPermitted"),
        id="create-extra-labels-are-free",
    ),
    # -- subjects
    pytest.param(
        (TEAM_A_ROLE, TENANTS_TEAM_A),
        request("bob", "CREATE", labels=CREATE_B),
        no("LabelNotPermitted", "role t1/team-a allows team in [a]"),
        id="group-subject-restricts",
    ),
    pytest.param(
        (TEAM_A_ROLE, TENANTS_TEAM_A),
        request("carol", "CREATE", labels=CREATE_B),
        ok("NoGrantingRole"),
        id="group-subject-other-group",
    ),
    pytest.param(
        (TEAM_A_ROLE, BUILDER_TEAM_A),
        request("builder", "CREATE", labels=CREATE_B),
        no("LabelNotPermitted", 'user "system:serviceaccount:t1:builder" may not create'),
        id="service-account-subject-restricts",
    ),
    pytest.param(
        (TEAM_A_ROLE, BUILDER_TEAM_A),
        request("builder", "CREATE", labels=CREATE_A),
        ok("LabelsPermitted"),
        id="service-account-subject-permitted",
    ),
    # -- RoleBinding to a ClusterRole: the ClusterRole's annotation, in the binding's namespace
    pytest.param(
        (TEAM_A_CLUSTER, BOB_TEAM_A_CLUSTER_IN_T1),
        request("bob", "CREATE", labels=CREATE_B),
        no("LabelNotPermitted", "(clusterrole team-a allows team in [a])"),
        id="rolebinding-to-clusterrole-restricts",
    ),
    pytest.param(
        (TEAM_A_CLUSTER, BOB_TEAM_A_CLUSTER_IN_T1),
        request("bob", "CREATE", labels=CREATE_B, namespace="t2"),
        ok("NoGrantingRole"),
        id="rolebinding-to-clusterrole-other-namespace",
    ),
    pytest.param(
        (TEAM_A_CLUSTER, binding("bob-everywhere", "team-a", "User:bob")),
        request("bob", "CREATE", labels=CREATE_B, namespace="t2"),
        no("LabelNotPermitted", "clusterrole team-a"),
        id="clusterrolebinding-restricts-everywhere",
    ),
    # -- several restricted roles: any one may permit
    pytest.param(
        (TEAM_A_ROLE, BOB_TEAM_A, TEAM_B_ROLE, BOB_TEAM_B),
        request("bob", "CREATE", labels=CREATE_B),
        ok("LabelsPermitted"),
        id="second-restricted-role-permits",
    ),
    pytest.param(
        (TEAM_A_ROLE, BOB_TEAM_A, TEAM_B_ROLE, BOB_TEAM_B),
        request("bob", "CREATE", labels={"team": "c"}),
        no(
            "LabelNotPermitted",
            "(role t1/team-a allows team in [a]; role t1/team-b allows team in [b])",
        ),
        id="no-restricted-role-permits-lists-all",
    ),
    # -- UPDATE judges the stored and the new labels; each must be permitted
    pytest.param(
        (TEAM_A_ROLE, BOB_TEAM_A),
        request("bob", "UPDATE", old=CREATE_A, labels={"team": "a", "x": "y"}),
        ok("LabelsPermitted"),
        id="update-inside-bucket",
    ),
    pytest.param(
        (TEAM_A_ROLE, BOB_TEAM_A),
        request("bob", "UPDATE", old=CREATE_B, labels=CREATE_A),
        no(
            "LabelNotPermitted",
            'user "bob" may not update configmaps "c2"',
            'the existing object\'s label team="b" is not permitted',
        ),
        id="update-steals-foreign-object",
    ),
    pytest.param(
        (TEAM_A_ROLE, BOB_TEAM_A),
        request("bob", "UPDATE", old=CREATE_A, labels=CREATE_B),
        no("LabelNotPermitted", ': label team="b" is not permitted'),
        id="update-relabels-out-of-bucket",
    ),
    pytest.param(
        (TEAM_A_ROLE, BOB_TEAM_A),
        request("bob", "UPDATE", old=CREATE_A, labels={}),
        no("LabelNotPermitted", ": missing label team"),
        id="update-removes-label",
    ),
    pytest.param(
        (TEAM_A_ROLE, BOB_TEAM_A),
        request("bob", "UPDATE", old={}, labels=CREATE_A),
        no("LabelNotPermitted", "the existing object has no label team"),
        id="update-adopts-unlabeled-object",
    ),
    pytest.param(
        (TEAM_A_ROLE, BOB_TEAM_A, TEAM_B_ROLE, BOB_TEAM_B),
        request("bob", "UPDATE", old=CREATE_A, labels=CREATE_B),
        ok("LabelsPermitted"),
        id="update-moves-between-own-buckets",
    ),
    pytest.param(
        (TEAM_A_ROLE, BOB_TEAM_A),
        request("bob", "UPDATE", labels=CREATE_A),
        no("ParentUnavailable", "no oldObject"),
        id="update-without-old-object",
    ),
    # -- DELETE judges oldObject (the API server sends object: null)
    pytest.param(
        (TEAM_A_ROLE, BOB_TEAM_A),
        request("bob", "DELETE", old=CREATE_A),
        ok("LabelsPermitted"),
        id="delete-own",
    ),
    pytest.param(
        (TEAM_A_ROLE, BOB_TEAM_A),
        request("bob", "DELETE", old=CREATE_B),
        no(
            "LabelNotPermitted",
            'user "bob" may not delete configmaps "c2" in namespace "t1": '
            'the existing object\'s label team="b" is not permitted',
        ),
        id="delete-foreign",
    ),
    pytest.param(
        (TEAM_A_ROLE, BOB_TEAM_A),
        request("bob", "DELETE", old=CREATE_B, labels=CREATE_A),
        no("LabelNotPermitted", 'label team="b"'),
        id="delete-judges-old-object-not-object",
    ),
    pytest.param(
        (COLLECTION_ROLE, BOB_COLLECTION),
        request("bob", "DELETE", name="", old=CREATE_B),
        no(
            "LabelNotPermitted",
            'user "bob" may not deletecollection configmaps in namespace "t1": '
            'the existing object\'s label team="b" is not permitted (role t1/sweeper',
        ),
        id="deletecollection-judges-each-object",
    ),
    pytest.param(
        (COLLECTION_ROLE, BOB_COLLECTION),
        request("bob", "DELETE", old=CREATE_B),
        ok("NoGrantingRole"),
        id="named-delete-is-not-deletecollection",
    ),
    pytest.param(
        (TEAM_A_ROLE, BOB_TEAM_A),
        request("bob", "DELETE"),
        no("ParentUnavailable", 'configmaps "c2" is not in this request'),
        id="delete-without-old-object-static",
    ),
    # -- resourceNames
    pytest.param(
        (NAMED_ROLE, BOB_NAMED),
        request("bob", "UPDATE", name="c1", old=CREATE_B, labels=CREATE_B),
        no("LabelNotPermitted", "role t1/c1-only"),
        id="resource-names-listed-restricts",
    ),
    pytest.param(
        (NAMED_ROLE, BOB_NAMED),
        request("bob", "UPDATE", name="c2", old=CREATE_B, labels=CREATE_B),
        ok("NoGrantingRole"),
        id="resource-names-other-name",
    ),
    pytest.param(
        (NAMED_ROLE, BOB_NAMED),
        request("bob", "CREATE", name="c1", labels=CREATE_B),
        no("LabelNotPermitted", "role t1/c1-only"),
        id="resource-names-restrict-a-create-by-apply",
    ),
    # -- requests whose object is not the parent: the parent's labels must be looked up
    pytest.param(
        (SCALER_ROLE, BOB_SCALER),
        request(
            "bob", "UPDATE", "deployments.apps/scale", name="web", kind="Scale", old={}, labels={}
        ),
        no(
            "ParentUnavailable",
            'user "bob" may not update deployments.apps/scale "web" in namespace "t1": '
            "its label permissions cannot be checked: "
            'deployments "web" is not in this request',
        ),
        id="scale-needs-parent-static",
    ),
    pytest.param(
        (SCALER_ROLE, BOB_SCALER),
        request("bob", "CONNECT", "pods/exec", name="app", kind="PodExecOptions", obj={}),
        no("ParentUnavailable", 'user "bob" may not create pods/exec "app"'),
        id="connect-needs-parent-static",
    ),
    pytest.param(
        (SCALER_ROLE, BOB_SCALER),
        request("bob", "CREATE", "pods/eviction", name="app", kind="Eviction", labels={}),
        no("ParentUnavailable", 'pods "app" is not in this request'),
        id="eviction-needs-parent-static",
    ),
    pytest.param(
        (
            EDITOR_ROLE,
            BOB_EDITOR,
            role("x", "t1", [rule("*", "*", "*")]),
            binding("bob-x", "x", "User:bob", namespace="t1"),
        ),
        request(
            "bob", "UPDATE", "deployments.apps/scale", name="web", kind="Scale", old={}, labels={}
        ),
        ok("Unrestricted"),
        id="unrestricted-needs-no-parent",
    ),
    pytest.param(
        (POD_STATUS_ROLE, BOB_POD_STATUS),
        request(
            "bob", "UPDATE", "pods/status", name="app", kind="Pod", old=CREATE_A, labels=CREATE_A
        ),
        ok("LabelsPermitted"),
        id="status-carries-parent-no-lookup",
    ),
    pytest.param(
        (POD_STATUS_ROLE, BOB_POD_STATUS),
        request(
            "bob", "UPDATE", "pods/status", name="app", kind="Pod", old=CREATE_A, labels=CREATE_B
        ),
        no("LabelNotPermitted", 'label team="b"'),
        id="status-relabel-judged",
    ),
    # -- invalid annotations: the role grants nothing through the webhook
    pytest.param(
        (INVALID_ROLE, BOB_INVALID),
        request("bob", "CREATE", labels=CREATE_A),
        no(
            "InvalidAnnotation",
            'user "bob" may not create configmaps "c2" in namespace "t1": ',
            "role t1/broken grants nothing here: invalid labelrbac.io/permissions annotation: ",
            "schema violation at configmaps",
        ),
        id="invalid-annotation-only-role",
    ),
    pytest.param(
        (INVALID_ROLE, BOB_INVALID, EDITOR_ROLE, BOB_EDITOR),
        request("bob", "CREATE", labels=CREATE_B),
        ok("Unrestricted"),
        id="invalid-annotation-plus-unrestricted",
    ),
    pytest.param(
        (INVALID_ROLE, BOB_INVALID, TEAM_A_ROLE, BOB_TEAM_A),
        request("bob", "CREATE", labels=CREATE_A),
        ok("LabelsPermitted"),
        id="invalid-annotation-plus-permitting-role",
    ),
    pytest.param(
        (INVALID_ROLE, BOB_INVALID, TEAM_A_ROLE, BOB_TEAM_A),
        request("bob", "CREATE", labels=CREATE_B),
        no(
            "LabelNotPermitted",
            "role t1/team-a allows team in [a]",
            "role t1/broken grants nothing",
        ),
        id="invalid-annotation-named-in-denial",
    ),
    # -- several label keys: AND across keys, OR within a key
    pytest.param(
        (TWO_KEYS_ROLE, BOB_TWO_KEYS),
        request("bob", "CREATE", labels={"team": "a", "env": "dev-3"}),
        ok("LabelsPermitted"),
        id="two-keys-both-permitted",
    ),
    pytest.param(
        (TWO_KEYS_ROLE, BOB_TWO_KEYS),
        request("bob", "CREATE", labels={"team": "a", "env": "test"}),
        no(
            "LabelNotPermitted",
            'label env="test" is not permitted',
            "allows team in [a] and env in [prod, dev-*]",
        ),
        id="two-keys-second-wrong",
    ),
    pytest.param(
        (TWO_KEYS_ROLE, BOB_TWO_KEYS),
        request("bob", "CREATE", labels={"env": "prod"}),
        no("LabelNotPermitted", "missing label team"),
        id="two-keys-first-missing",
    ),
    # -- operations the engine does not know
    pytest.param(
        (EDITOR_ROLE, BOB_EDITOR),
        request("bob", "WATCH", labels=CREATE_A),
        no("UnknownOperation", "unknown admission operation 'WATCH'", code=400),
        id="unknown-operation",
    ),
]


@pytest.mark.parametrize(("objects", "req", "expect"), CASES)
def test_decision(objects: tuple[Obj, ...], req: Request, expect: Expect) -> None:
    decision = decide(objects, req)
    assert (decision.allowed, decision.reason) == (expect.allowed, expect.reason), decision
    if expect.code is not None:
        assert decision.code == expect.code
    for fragment in expect.contains:
        assert fragment in decision.message
    if decision.allowed:
        assert decision.message == ""
        assert decision.warnings == ()


# --- The message, exactly ------------------------------------------------------------------------


def test_denial_message_format() -> None:
    decision = decide((TEAM_A_ROLE, BOB_TEAM_A), request("bob", "CREATE", labels=CREATE_B))
    assert decision == Decision(
        allowed=False,
        code=403,
        reason="LabelNotPermitted",
        message=(
            'user "bob" may not create configmaps "c2" in namespace "t1": '
            'label team="b" is not permitted (role t1/team-a allows team in [a])'
        ),
    )


def test_denial_message_for_a_cluster_scoped_resource() -> None:
    objects = (
        role(
            "node-labeller",
            rules=[rule("update patch", "nodes")],
            permissions={"nodes": {"team": ["a"]}},
        ),
        binding("bob-node-labeller", "node-labeller", "User:bob"),
    )
    req = request(
        "bob",
        "UPDATE",
        "nodes",
        namespace="",
        name="n1",
        old=CREATE_A,
        labels=CREATE_B,
        kind="Node",
    )
    decision = decide(objects, req)
    assert decision.message == (
        'user "bob" may not update nodes "n1": label team="b" is not permitted '
        "(clusterrole node-labeller allows team in [a])"
    )


# --- Parent lookup -------------------------------------------------------------------------------


class Lookup:
    """A parent lookup returning a fixed object and recording what it was asked for."""

    def __init__(self, parent: Mapping[str, Any] | None = None, error: str = "") -> None:
        self.parent = parent
        self.error = error
        self.calls: list[Request] = []

    def __call__(self, req: Request) -> Mapping[str, Any]:
        self.calls.append(req)
        if self.error:
            raise ParentUnavailable(self.error)
        assert self.parent is not None
        return self.parent


def scale(user: str = "bob") -> Request:
    return request(
        user,
        "UPDATE",
        "deployments.apps/scale",
        name="web",
        kind="Scale",
        obj={"kind": "Scale", "metadata": {"name": "web", "namespace": "t1"}},
    )


@pytest.mark.parametrize(
    ("parent_labels", "allowed", "fragment"),
    [
        pytest.param(CREATE_A, True, "", id="parent-in-bucket"),
        pytest.param(CREATE_B, False, 'the existing object\'s label team="b"', id="foreign"),
        pytest.param({}, False, "the existing object has no label team", id="parent-unlabeled"),
    ],
)
def test_parent_lookup_decides(parent_labels: dict[str, str], allowed: bool, fragment: str) -> None:
    deployment = labelled(parent_labels, "Deployment", "web")
    # A pod template and selector in bob's bucket: only the Deployment's own labels vary here.
    deployment["spec"] = {
        "selector": {"matchLabels": {"team": "a"}},
        "template": {"metadata": {"labels": {"team": "a"}}},
    }
    lookup = Lookup(deployment)
    req = scale()
    decision = decide((SCALER_ROLE, BOB_SCALER), req, lookup=lookup)
    assert decision.allowed is allowed
    assert fragment in decision.message
    # The lookup is asked for the request's own object only (the cluster source caches it).
    assert lookup.calls and all(call == req for call in lookup.calls)


def test_parent_lookup_for_connect() -> None:
    lookup = Lookup(labelled(CREATE_A, "Pod", "app"))
    req = request("bob", "CONNECT", "pods/exec", name="app", kind="PodExecOptions", obj={})
    decision = decide((SCALER_ROLE, BOB_SCALER), req, lookup=lookup)
    assert (decision.allowed, decision.reason) == (True, "LabelsPermitted")
    assert len(lookup.calls) == 1


def test_parent_lookup_failure_message() -> None:
    lookup = Lookup(error='deployments.apps "web" not found')
    decision = decide((SCALER_ROLE, BOB_SCALER), scale(), lookup=lookup)
    assert decision == Decision(
        allowed=False,
        code=403,
        reason="ParentUnavailable",
        message=(
            'user "bob" may not update deployments.apps/scale "web" in namespace "t1": '
            'its label permissions cannot be checked: deployments.apps "web" not found'
        ),
    )


def test_no_lookup_when_nothing_restricts() -> None:
    lookup = Lookup(error="must not be called")
    decision = decide((EDITOR_ROLE, BOB_EDITOR), scale(), lookup=lookup)
    assert decision.reason == "NoGrantingRole"  # editor grants configmaps, not scale
    assert lookup.calls == []


def test_no_lookup_when_the_object_is_the_parent() -> None:
    lookup = Lookup(error="must not be called")
    req = request(
        "bob", "UPDATE", "pods/status", name="app", kind="Pod", old=CREATE_A, labels=CREATE_A
    )
    decision = decide((POD_STATUS_ROLE, BOB_POD_STATUS), req, lookup=lookup)
    assert decision.allowed
    assert lookup.calls == []


def test_delete_without_old_object_uses_lookup() -> None:
    lookup = Lookup(labelled(CREATE_B))
    decision = decide((TEAM_A_ROLE, BOB_TEAM_A), request("bob", "DELETE"), lookup=lookup)
    assert (decision.allowed, decision.reason) == (False, "LabelNotPermitted")
    assert len(lookup.calls) == 1


@pytest.mark.parametrize(
    ("operation", "resource", "kind", "is_parent"),
    [
        pytest.param("CREATE", "configmaps", "ConfigMap", True, id="top-level"),
        pytest.param("UPDATE", "pods/status", "Pod", True, id="status-carries-pod"),
        pytest.param(
            "UPDATE", "ingresses.networking.k8s.io/status", "Ingress", True, id="plural-es"
        ),
        pytest.param(
            "UPDATE",
            "networkpolicies.networking.k8s.io/status",
            "NetworkPolicy",
            True,
            id="plural-ies",
        ),
        pytest.param(
            "UPDATE",
            "gateways.gateway.networking.k8s.io/status",
            "Gateway",
            True,
            id="plural-vowel-y",
        ),
        pytest.param("UPDATE", "endpoints/status", "Endpoints", True, id="plural-is-kind"),
        pytest.param("UPDATE", "deployments.apps/scale", "Scale", False, id="scale"),
        pytest.param("CREATE", "pods/eviction", "Eviction", False, id="eviction"),
        pytest.param("CREATE", "pods/binding", "Binding", False, id="binding"),
        pytest.param("CONNECT", "pods/exec", "PodExecOptions", False, id="connect"),
        pytest.param("CONNECT", "pods", "Pod", False, id="connect-always-looks-up"),
        pytest.param("UPDATE", "pods/status", "", False, id="unknown-kind-looks-up"),
    ],
)
def test_object_is_parent(operation: str, resource: str, kind: str, is_parent: bool) -> None:
    req = request("bob", operation, resource, kind=kind)
    assert object_is_parent(req) is is_parent


def test_label_states() -> None:
    create = request("bob", "CREATE", labels=CREATE_A)
    update = request("bob", "UPDATE", old=CREATE_B, labels=CREATE_A)
    delete = request("bob", "DELETE", old=CREATE_B)
    assert label_states(create, no_parent_lookup) == [(False, CREATE_A)]
    assert label_states(update, no_parent_lookup) == [(True, CREATE_B), (False, CREATE_A)]
    assert label_states(delete, no_parent_lookup) == [(True, CREATE_B)]
    with pytest.raises(ParentUnavailable):
        label_states(scale(), no_parent_lookup)


# --- allow_unlabeled -----------------------------------------------------------------------------

WARNING = (
    "object has no label team; allowed only because unlabeled objects are permitted "
    "(--allow-unlabeled)"
)


def test_allow_unlabeled_allows_with_a_warning() -> None:
    decision = decide(
        (TEAM_A_ROLE, BOB_TEAM_A), request("bob", "CREATE", labels={}), allow_unlabeled=True
    )
    assert (decision.allowed, decision.reason) == (True, "LabelsPermitted")
    assert decision.warnings == (WARNING,)


def test_allow_unlabeled_warns_once_for_update() -> None:
    decision = decide(
        (TEAM_A_ROLE, BOB_TEAM_A),
        request("bob", "UPDATE", old={}, labels={}),
        allow_unlabeled=True,
    )
    assert decision.allowed
    assert decision.warnings == (WARNING,)


def test_allow_unlabeled_never_allows_a_wrong_value() -> None:
    decision = decide(
        (TEAM_A_ROLE, BOB_TEAM_A), request("bob", "CREATE", labels=CREATE_B), allow_unlabeled=True
    )
    assert (decision.allowed, decision.reason) == (False, "LabelNotPermitted")


def test_allow_unlabeled_no_warning_when_labelled() -> None:
    decision = decide(
        (TEAM_A_ROLE, BOB_TEAM_A), request("bob", "CREATE", labels=CREATE_A), allow_unlabeled=True
    )
    assert decision.allowed
    assert decision.warnings == ()


def test_allow_unlabeled_lists_every_missing_key() -> None:
    decision = decide(
        (TWO_KEYS_ROLE, BOB_TWO_KEYS), request("bob", "CREATE", labels={}), allow_unlabeled=True
    )
    assert decision.allowed
    assert decision.warnings == (
        "object has no label env, team; allowed only because unlabeled objects are permitted "
        "(--allow-unlabeled)",
    )


def test_allow_unlabeled_no_warning_when_another_role_permits_outright() -> None:
    # team=a satisfies team-a by itself: the object is allowed on its labels, not because a
    # missing label was tolerated, so a warning saying "allowed only because" would be false.
    env_role = role("env", "t1", [rule(WRITE, "configmaps")], {"configmaps": {"env": ["prod"]}})
    objects = (
        env_role,
        binding("bob-env", "env", "User:bob", namespace="t1"),
        TEAM_A_ROLE,
        BOB_TEAM_A,
    )
    decision = decide(objects, request("bob", "CREATE", labels=CREATE_A), allow_unlabeled=True)
    assert decision.allowed
    assert decision.warnings == ()


# --- Invalid annotations on the roles themselves -------------------------------------------------


def test_two_configured_keys_make_the_role_invalid() -> None:
    both = {DEFAULT_ANNOTATION_KEY: json.dumps(TEAM_A), AKRAINO_KEY: json.dumps(TEAM_A)}
    kind, obj = role("two-keys", "t1", [rule(WRITE, "configmaps")])
    obj["metadata"]["annotations"] = both
    decision = decide(
        ((kind, obj), binding("bob-two-keys", "two-keys", "User:bob", namespace="t1")),
        request("bob", "CREATE", labels=CREATE_A),
        annotation_keys=(DEFAULT_ANNOTATION_KEY, AKRAINO_KEY),
    )
    assert (decision.allowed, decision.reason) == (False, "InvalidAnnotation")
    assert "role t1/two-keys grants nothing here" in decision.message
    assert "more than one permission annotation" in decision.message


def role_write(obj: Mapping[str, Any], operation: str = "CREATE", old: Any = None) -> Request:
    kind = obj["kind"]
    return Request(
        uid="uid-2",
        operation=operation,
        user=UserInfo("admin", ("system:masters", "system:authenticated")),
        resource=Resource(RBAC, "roles" if kind == "Role" else "clusterroles"),
        kind=kind,
        namespace=obj["metadata"].get("namespace", ""),
        name=obj["metadata"]["name"],
        object=obj,
        old_object=old,
    )


@pytest.mark.parametrize(
    ("permissions", "operation", "refused"),
    [
        pytest.param("{", "CREATE", True, id="create-bad-json"),
        pytest.param('{"configmaps": []}', "CREATE", True, id="create-empty-list"),
        pytest.param('{"configmaps": {"team": ["a"]}}', "CREATE", False, id="create-valid"),
        pytest.param("{}", "UPDATE", True, id="update-empty-object"),
        pytest.param('{"configmaps": {"team": ["a"]}}', "UPDATE", False, id="update-valid"),
        pytest.param(None, "CREATE", False, id="no-annotation"),
    ],
)
def test_role_write_with_invalid_annotation_is_refused(
    permissions: str | None, operation: str, refused: bool
) -> None:
    for namespace, kind in (("t1", "Role"), ("", "ClusterRole")):
        _, obj = role("team-a", namespace, [rule(WRITE, "configmaps")], permissions)
        decision = decide((), role_write(obj, operation, old=obj))
        if refused:
            assert (decision.allowed, decision.code, decision.reason) == (
                False,
                422,
                "InvalidAnnotation",
            )
            assert decision.message.startswith(
                f'{kind} "team-a" is invalid: invalid labelrbac.io/permissions annotation: '
            )
        else:
            assert decision.allowed, decision


def test_role_delete_with_invalid_annotation_is_not_refused() -> None:
    _, obj = role("team-a", "t1", [rule(WRITE, "configmaps")], "{")
    req = replace(role_write(obj, "DELETE", old=obj), object=None)
    assert decide((), req).allowed


def test_role_write_with_malformed_rules_is_refused() -> None:
    _, obj = role("team-a", "t1", [rule(WRITE, "configmaps")])
    obj["rules"] = [{"verbs": "create", "resources": ["configmaps"]}]
    decision = decide((), role_write(obj, "CREATE"))
    assert (decision.allowed, decision.code) == (False, 422)
    assert (
        decision.message
        == 'Role "team-a" is invalid: malformed rules: verbs must be a list of strings'
    )


def test_recorded_role_write_needs_the_default_label_key() -> None:
    # a023 writes {"mwan3*": [...]}: the list shorthand is valid only with a default label key.
    req = parse_review(load_review("a023-update-roles")).request
    keys = (DEFAULT_ANNOTATION_KEY, AKRAINO_KEY)
    assert decide((), req, annotation_keys=keys, default_label_key=AKRAINO_LABEL).allowed
    decision = decide((), req, annotation_keys=keys)
    assert (decision.allowed, decision.code) == (False, 422)
    assert decision.message.startswith(
        f'Role "create-intent" is invalid: invalid {AKRAINO_KEY} annotation: '
        "entry 'mwan3*' uses the list shorthand"
    )


def test_recorded_role_write_with_broken_annotation_is_refused() -> None:
    review = copy.deepcopy(load_review("a001-create-roles"))
    review["request"]["object"]["metadata"]["annotations"][AKRAINO_KEY] = '{"mwan3policies": []}'
    req = parse_review(review).request
    decision = decide((), req, annotation_keys=(AKRAINO_KEY,), default_label_key=AKRAINO_LABEL)
    assert (decision.allowed, decision.code, decision.reason) == (False, 422, "InvalidAnnotation")
    assert "schema violation at mwan3policies" in decision.message


# --- The Akraino shorthand, end to end on recorded requests ----------------------------------


def akraino(name: str, permissions: str = '{ "mwan3policies": ["app-intent"] }') -> Decision:
    role_obj = copy.deepcopy(load_review("a001-create-roles")["request"]["object"])
    role_obj["metadata"]["annotations"][AKRAINO_KEY] = permissions
    binding_obj = load_review("a002-create-rolebindings")["request"]["object"]
    return decide(
        (("Role", role_obj), ("RoleBinding", binding_obj)),
        parse_review(load_review(name)).request,
        annotation_keys=(DEFAULT_ANNOTATION_KEY, AKRAINO_KEY),
        default_label_key=AKRAINO_LABEL,
    )


@pytest.mark.parametrize(
    ("name", "allowed"),
    [
        pytest.param("a003-create-mwan3policies", True, id="a003-app-intent"),
        pytest.param("a004-create-mwan3policies", False, id="a004-k8s-service"),
        pytest.param("a005-update-mwan3policies", False, id="a005-relabel"),
        pytest.param("a006-delete-mwan3policies", False, id="a006-delete-k8s-service"),
        pytest.param("a007-create-configmaps", True, id="a007-configmaps-unrestricted"),
    ],
)
def test_akraino_recorded(name: str, allowed: bool) -> None:
    assert akraino(name).allowed is allowed


def test_akraino_widened_role_permits_both_buckets() -> None:
    widened = '{"mwan3*": ["app-intent","k8s-service"]}'
    assert akraino("a004-create-mwan3policies", widened).allowed
    assert akraino("a005-update-mwan3policies", widened).allowed


def test_pre_checks_run_before_the_label_rule() -> None:
    # An invalid Role write is refused even when the writer's own grant is unrestricted.
    _, obj = role("team-a", "t1", [rule(WRITE, "configmaps")], "{")
    admin_all = (
        role("cluster-admin", rules=[rule("*", "*", "*")]),
        binding("cluster-admin", "cluster-admin", "Group:system:masters"),
    )
    decision = decide(admin_all, role_write(obj))
    assert decision.code == 422


def test_allowed_decision_carries_an_explanation() -> None:
    decision = decide(
        (TEAM_A_ROLE, BOB_TEAM_A), request("bob", "UPDATE", old=CREATE_A, labels=CREATE_A)
    )
    assert decision.explanation == (
        "existing labels permitted by role t1/team-a",
        "new labels permitted by role t1/team-a",
    )


def test_context_defaults_to_static_lookup() -> None:
    ctx = Context(snapshot(SCALER_ROLE, BOB_SCALER))
    decision = evaluate(scale(), ctx)
    assert decision.reason == "ParentUnavailable"
    assert "without cluster access" in decision.message


# --- A change of labels is judged by the entries of the subresources the labels decide ---------

# bob manages configmaps of teams a and b but may use their (made-up) proxy only in team a; ed
# writes configmaps without label limits (no entry names them) and uses the proxy in team a.
NARROW_CHILD = role(
    "narrow-child",
    "t1",
    [rule(f"{WRITE} get", "configmaps configmaps/proxy")],
    {"configmaps": {"team": ["a", "b"]}, "configmaps/proxy": {"team": ["a"]}},
)
ONLY_CHILD = role(
    "only-child",
    "t1",
    [rule(f"{WRITE} get", "configmaps configmaps/proxy")],
    {"configmaps/proxy": {"team": ["a"]}},
)
BOB_NARROW = binding("bob-narrow", "narrow-child", "User:bob", namespace="t1")
ALICE_ONLY = binding("alice-only", "only-child", "User:alice", namespace="t1")
TEAM_B = {"team": "b"}


@pytest.mark.parametrize(
    ("objects", "user", "old", "new", "message"),
    [
        pytest.param((NARROW_CHILD, BOB_NARROW), "bob", TEAM_B, CREATE_A,
                     'user "bob" may not update configmaps "c2" in namespace "t1": the existing '
                     "object's label team=\"b\" is not permitted where its subresources are "
                     "concerned, and relabelling would bring it within them (role "
                     "t1/narrow-child allows configmaps: team in [a, b] and configmaps/proxy: "
                     "team in [a])",
                     id="into-the-subresources-bucket"),
        pytest.param((NARROW_CHILD, BOB_NARROW), "bob", CREATE_A, TEAM_B, None, id="out-of-it"),
        pytest.param((NARROW_CHILD, BOB_NARROW), "bob", TEAM_B, {**TEAM_B, "tier": "x"}, None,
                     id="labels-the-subresource-ignores"),
        pytest.param((NARROW_CHILD, BOB_NARROW), "bob", CREATE_A, {**CREATE_A, "tier": "x"},
                     None, id="within-the-subresources-bucket"),
        pytest.param((ONLY_CHILD, ALICE_ONLY), "alice", TEAM_B, CREATE_A,
                     "(role t1/only-child allows configmaps/proxy: team in [a])",
                     id="object-writes-unrestricted"),
        pytest.param((ONLY_CHILD, ALICE_ONLY), "alice", {}, CREATE_A,
                     "the existing object has no label team where its subresources",
                     id="unlabeled-into-the-bucket"),
        pytest.param((TEAM_A_ROLE, BOB_TEAM_A), "bob", CREATE_A, {**CREATE_A, "tier": "x"}, None,
                     id="no-subresource-entry"),
    ],
)  # fmt: skip
def test_a_change_of_labels_is_judged_by_what_the_labels_decide(
    objects: tuple[Obj, ...],
    user: str,
    old: dict[str, str],
    new: dict[str, str],
    message: str | None,
) -> None:
    decision = decide(objects, request(user, "UPDATE", labels=new, old=old))
    assert decision.allowed is (message is None), decision.message
    if message is not None:
        assert decision.reason == "RelabelNotPermitted"
        assert message in decision.message


def test_a_softened_label_denial_is_not_said_again_as_a_change_of_labels() -> None:
    """The label rule refuses the stored object (softened by warn mode): said once, by it."""
    objects = (NARROW_CHILD, BOB_NARROW)
    snap = snapshot(*objects)
    options = Options(Compiler((DEFAULT_ANNOTATION_KEY,)), mode="warn")
    req = request("bob", "UPDATE", labels=CREATE_A, old={"team": "z"})
    decision = evaluate(req, Context(snap, options, no_parent_lookup))
    assert decision.allowed and decision.reason == "LabelNotPermitted", decision
    assert "subresources" not in decision.message
