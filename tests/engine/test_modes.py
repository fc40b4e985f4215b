"""Enforcement modes: the global ``--mode``, per-role ``labelrbac.io/mode``, and how they combine.

The rules under test (docs/modes.md): a label denial takes the strictest mode among
the granting roles that caused it (a void role counts as ``enforce``); every other rule denies in
``enforce``; the global mode then softens any policy denial (403/422) to at most its own
strictness; 400/500/503 are never softened. Modes never weaken the escalation check.
"""

from __future__ import annotations

from typing import Any

import pytest

from app.engine.context import Context, Options
from app.engine.decide import evaluate
from app.engine.model import Decision, Request, Resource, UserInfo
from app.engine.policy import DEFAULT_ANNOTATION_KEY
from app.engine.rbac import RBAC_GROUP, Compiler
from app.webhook.wire import build_response
from tests.support import binding, role, rule, snapshot

WRITE = "create update patch delete"
RBAC_WRITE = rule("create update", "roles rolebindings", RBAC_GROUP)


def team(value: str) -> dict[str, Any]:
    return {"configmaps": {"team": [value]}}


SNAPSHOT = snapshot(
    role("team-a", "t1", [rule(WRITE, "configmaps"), RBAC_WRITE], team("a")),
    role("team-b", "t1", [rule(WRITE, "configmaps"), RBAC_WRITE], team("b"), mode="warn"),
    role("team-c", "t1", [rule(WRITE, "configmaps")], team("c"), mode="audit"),
    role("team-d", "t1", [rule(WRITE, "configmaps")], "{broken", mode="warn"),
    role("team-e", "t1", [rule(WRITE, "configmaps")], team("e"), mode="loud"),
    role("open", "t1", [rule(WRITE, "configmaps")]),
    role("audited-a", "t1", [rule(WRITE, "configmaps")], team("a"), mode="audit"),
    binding("alice", "team-a", "User:alice", namespace="t1"),
    binding("bob", "team-b", "User:bob", namespace="t1"),
    binding("carl", "team-c", "User:carl", namespace="t1"),
    binding("dave", "team-a", "User:dave", namespace="t1"),
    binding("dave-b", "team-b", "User:dave", namespace="t1"),
    binding("erin-b", "team-b", "User:erin", namespace="t1"),
    binding("erin-c", "team-c", "User:erin", namespace="t1"),
    binding("gina-b", "team-b", "User:gina", namespace="t1"),
    binding("gina-d", "team-d", "User:gina", namespace="t1"),
    binding("hank", "team-e", "User:hank", namespace="t1"),
)
COMPILER = Compiler((DEFAULT_ANNOTATION_KEY,))


def decide(req: Request, mode: str = "enforce") -> Decision:
    return evaluate(req, Context(SNAPSHOT, Options(COMPILER, mode=mode)))


def configmap(user: str, value: str, operation: str = "CREATE") -> Request:
    metadata = {"name": "c", "namespace": "t1", "labels": {"team": value}}
    obj = {"kind": "ConfigMap", "metadata": metadata}
    return Request(
        "uid-1", operation, UserInfo(user), Resource("", "configmaps"), "ConfigMap", "t1", "c",
        object=obj, old_object=obj if operation == "UPDATE" else None,
    )  # fmt: skip


def rbac_write(user: str, plural: str, obj: dict[str, Any]) -> Request:
    return Request(
        "uid-2", "CREATE", UserInfo(user), Resource(RBAC_GROUP, plural), "",
        "t1", obj["metadata"]["name"], object=obj,
    )  # fmt: skip


WIDE = role("wide", "t1", [rule("create", "configmaps")])[1]
BROKEN = role("bad", "t1", permissions="{x", mode="warn")[1]


def node_pod_update() -> Request:
    pod = {"kind": "Pod", "metadata": {"name": "p", "namespace": "t1"}, "spec": {"nodeName": "n1"}}
    return Request(
        "uid-3", "UPDATE", UserInfo("system:node:n1", ("system:nodes",)),
        Resource("", "pods"), "Pod", "t1", "p", object=pod, old_object=pod,
    )  # fmt: skip


# (request, global mode) -> (allowed, mode, reason)
@pytest.mark.parametrize(
    ("req", "global_mode", "expected"),
    [
        pytest.param(configmap("alice", "z"), "enforce", (False, "enforce", "LabelNotPermitted"),
                     id="enforce-role-denies"),
        pytest.param(configmap("bob", "z"), "enforce", (True, "warn", "LabelNotPermitted"),
                     id="warn-role-warns"),
        pytest.param(configmap("carl", "z"), "enforce", (True, "audit", "LabelNotPermitted"),
                     id="audit-role-audits"),
        pytest.param(configmap("bob", "b"), "enforce", (True, "enforce", "LabelsPermitted"),
                     id="permitted-is-not-a-softened-denial"),
        pytest.param(configmap("dave", "z"), "enforce", (False, "enforce", "LabelNotPermitted"),
                     id="enforce-and-warn-roles-strictest-enforces"),
        pytest.param(configmap("erin", "z"), "enforce", (True, "warn", "LabelNotPermitted"),
                     id="warn-and-audit-roles-strictest-warns"),
        pytest.param(configmap("gina", "z"), "enforce", (False, "enforce", "LabelNotPermitted"),
                     id="void-role-never-softens"),
        pytest.param(configmap("hank", "z"), "enforce", (False, "enforce", "InvalidAnnotation"),
                     id="unknown-mode-voids-the-role"),
        pytest.param(configmap("alice", "z"), "warn", (True, "warn", "LabelNotPermitted"),
                     id="global-warn-softens-enforce-role"),
        pytest.param(configmap("bob", "z"), "audit", (True, "audit", "LabelNotPermitted"),
                     id="global-audit-softer-than-warn-role"),
        pytest.param(configmap("carl", "z"), "warn", (True, "audit", "LabelNotPermitted"),
                     id="audit-role-softer-than-global-warn"),
        pytest.param(node_pod_update(), "enforce", (False, "enforce", "NodeRestriction"),
                     id="node-rules-enforced-whatever-roles-say"),
        pytest.param(node_pod_update(), "warn", (True, "warn", "NodeRestriction"),
                     id="node-rules-softened-only-globally"),
        pytest.param(rbac_write("bob", "roles", WIDE),
                     "enforce", (False, "enforce", "Escalation"),
                     id="escalation-enforced-for-warn-role-holder"),
        pytest.param(rbac_write("bob", "roles", WIDE), "audit", (True, "audit", "Escalation"),
                     id="escalation-softened-only-globally"),
        pytest.param(rbac_write("bob", "roles", BROKEN),
                     "enforce", (False, "enforce", "InvalidAnnotation"),
                     id="annotation-validity-enforced"),
        pytest.param(rbac_write("bob", "roles", role("bad", "t1", mode="loud")[1]),
                     "enforce", (False, "enforce", "InvalidAnnotation"), id="invalid-mode-refused"),
        pytest.param(rbac_write("bob", "roles", role("bad", "t1", permissions="{x")[1]),
                     "audit", (True, "audit", "InvalidAnnotation"),
                     id="annotation-validity-softened-only-globally"),
        pytest.param(Request("u", "WRITE", UserInfo("bob"), Resource("", "configmaps")),
                     "audit", (False, "enforce", "UnknownOperation"),
                     id="malformed-never-softened"),
    ],
)  # fmt: skip
def test_mode_table(req: Request, global_mode: str, expected: tuple[bool, str, str]) -> None:
    decision = decide(req, global_mode)
    assert (decision.allowed, decision.mode, decision.reason) == expected


def test_warn_keeps_the_denial_message_as_a_warning_and_audit_record() -> None:
    decision = decide(configmap("bob", "z"))
    denied = 'user "bob" may not create configmaps "c" in namespace "t1": label team="z"'
    assert decision.message.startswith(denied)
    assert decision.warnings == (f"{decision.message} (not enforced: warn mode)",)
    response = build_response("admission.k8s.io/v1", "uid-1", decision)["response"]
    assert response["allowed"] is True and "status" not in response
    assert response["warnings"] == list(decision.warnings)
    assert response["auditAnnotations"] == {
        "mode": "warn",
        "would-deny-reason": "LabelNotPermitted",
        "would-deny": decision.message,
    }


def test_audit_records_without_warning() -> None:
    decision = decide(configmap("carl", "z"))
    response = build_response("admission.k8s.io/v1", "uid-1", decision)["response"]
    assert response["allowed"] is True
    assert "warnings" not in response
    assert response["auditAnnotations"]["mode"] == "audit"
    assert 'label team="z" is not permitted' in response["auditAnnotations"]["would-deny"]


def test_enforced_and_plain_allowed_decisions_carry_no_audit_annotation() -> None:
    for decision in (decide(configmap("alice", "z")), decide(configmap("alice", "a"))):
        response = build_response("admission.k8s.io/v1", "uid-1", decision)["response"]
        assert "auditAnnotations" not in response


def test_after_a_softened_check_the_remaining_checks_still_decide() -> None:
    """Global warn softens the escalation check; the label rule still runs after it."""
    obj = role("wide", "t1", [rule("create", "configmaps")])[1]
    decision = decide(rbac_write("bob", "roles", obj), "warn")
    assert (decision.allowed, decision.mode, decision.reason) == (True, "warn", "Escalation")
    assert decision.explanation[-2:] == (
        "warn mode: would have been denied (Escalation)",
        "role t1/team-b grants this without label limits",
    )


# -- The escalation check is never weaker for a role in a softer mode ------------------------------


def role_obj(name: str, permissions: Any, mode: str | None = None) -> dict[str, Any]:
    return role(name, "t1", [rule("create", "configmaps")], permissions, mode=mode)[1]


@pytest.mark.parametrize(
    ("user", "plural", "obj", "denied"),
    [
        pytest.param("alice", "roles", role_obj("same", team("a")), None,
                     id="same-limits-same-mode"),
        pytest.param("alice", "roles", role_obj("soft", team("a"), "warn"),
                     'user "alice" may not grant configmaps in warn mode (its label limits are '
                     "not enforced): their own access is limited to team in [a]",
                     id="handing-out-warn-mode-is-widening"),
        pytest.param("alice", "rolebindings",
                     binding("x", "audited-a", "User:alice", namespace="t1")[1],
                     'user "alice" may not grant configmaps in audit mode (its label limits are '
                     "not enforced) through role t1/audited-a",
                     id="binding-to-an-audit-mode-role-is-widening"),
        pytest.param("bob", "roles", role_obj("same", team("b"), "warn"), None,
                     id="warn-holder-may-hand-out-warn"),
        pytest.param("bob", "roles", role_obj("stricter", team("b")), None,
                     id="warn-holder-may-hand-out-enforce"),
        pytest.param("bob", "roles", role_obj("unrestricted", None),
                     'user "bob" may not grant configmaps without a label restriction',
                     id="warn-holder-still-counts-as-restricted"),
        pytest.param("bob", "rolebindings", binding("x", "open", "User:bob", namespace="t1")[1],
                     'user "bob" may not grant configmaps without a label restriction',
                     id="warn-holder-may-not-bind-unrestricted"),
    ],
)  # fmt: skip
def test_escalation_with_modes(
    user: str, plural: str, obj: dict[str, Any], denied: str | None
) -> None:
    decision = decide(rbac_write(user, plural, obj))
    if denied is None:
        assert decision.allowed, decision.message
    else:
        assert (decision.allowed, decision.reason) == (False, "Escalation")
        assert decision.message.startswith(denied), decision.message


def test_changing_only_the_mode_is_judged() -> None:
    before = role_obj("mine", team("a"))
    after = role_obj("mine", team("a"), "audit")
    req = Request(
        "uid-4", "UPDATE", UserInfo("alice"), Resource(RBAC_GROUP, "roles"), "Role", "t1", "mine",
        object=after, old_object=before,
    )  # fmt: skip
    decision = decide(req)
    assert (decision.allowed, decision.reason) == (False, "Escalation")


# -- Several authorizations: each must pass, so the strictest denial among them decides -----------


@pytest.mark.parametrize(
    ("create_mode", "get_mode", "expected"),
    [
        pytest.param("warn", None, (False, "enforce"), id="warned-create-enforced-get"),
        pytest.param(None, "warn", (False, "enforce"), id="enforced-create-warned-get"),
        pytest.param("audit", "warn", (True, "warn"), id="audited-create-warned-get"),
        pytest.param("audit", "audit", (True, "audit"), id="both-audited"),
    ],
)
def test_every_authorization_of_a_connect_counts(
    create_mode: str | None, get_mode: str | None, expected: tuple[bool, str]
) -> None:
    """``kubectl exec`` is authorized as create and as get of pods/exec; both must permit it."""
    snap = snapshot(
        role("exec-create", "t1", [rule("create", "pods/exec")], {"pods": {"team": ["c"]}},
             mode=create_mode),
        role("exec-get", "t1", [rule("get", "pods/exec")], {"pods": {"team": ["g"]}},
             mode=get_mode),
        binding("exec-create", "exec-create", "User:ed", namespace="t1"),
        binding("exec-get", "exec-get", "User:ed", namespace="t1"),
    )  # fmt: skip
    pod = {"kind": "Pod", "metadata": {"name": "p", "namespace": "t1", "labels": {"team": "z"}}}
    req = Request(
        "uid-5", "CONNECT", UserInfo("ed"), Resource("", "pods", "exec"), "PodExecOptions", "t1",
        "p", object={"kind": "PodExecOptions"},
    )  # fmt: skip
    decision = evaluate(req, Context(snap, Options(COMPILER), lambda _: pod))
    assert (decision.allowed, decision.mode) == expected
    assert decision.reason == "LabelNotPermitted"
