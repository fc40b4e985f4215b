"""Owner references and finalizers: a write that makes the garbage collector delete an object is
judged as deleting it, by every rule that judges a delete.

Each case is an AdmissionReview as the API server sends it (``tests.support.make_review``, parsed
by ``app.webhook.wire``), decided by the whole pipeline against a small RBAC world in ``t1``.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from app.engine.context import Context, Options
from app.engine.decide import POST_CHECKS, evaluate
from app.engine.model import Decision, Request
from app.engine.owners import check_owners
from app.engine.policy import DEFAULT_ANNOTATION_KEY
from app.engine.rbac import Compiler
from app.webhook.wire import parse_review
from tests.support import GHOST_OWNER as GHOST
from tests.support import binding, make_review, role, rule, snapshot

NS = "t1"
A_ONLY = {"team": ["a"]}
TEAM_A = {"team": "a"}
TEAM_B = {"team": "b"}
EDIT = [rule("*", "configmaps secrets serviceaccounts pods"), rule("*", "deployments", "apps")]

WORLD = snapshot(
    # alice: what `edit` grants, her annotation naming only configmaps. She writes every
    # ServiceAccount (no entry limits them) but lends, hence deletes, only team=a's.
    role("team-a", NS, EDIT, {"configmaps": A_ONLY}),
    binding("alice", "team-a", "User:alice", namespace=NS),
    # nora: writes configmaps, secrets and pods without label limits, deletes only team=a's.
    role("writer", NS, [rule("create update patch", "configmaps secrets pods")]),
    role("deleter-a", NS, [rule("delete", "configmaps secrets pods")], {"*": A_ONLY}),
    binding("nora-write", "writer", "User:nora", namespace=NS),
    binding("nora-delete", "deleter-a", "User:nora", namespace=NS),
    # pat: creates and patches ServiceAccounts and configmaps, deletes neither.
    role(
        "patcher",
        NS,
        [rule("create update patch", "serviceaccounts configmaps")],
        {"configmaps": A_ONLY},
    ),
    binding("pat", "patcher", "User:pat", namespace=NS),
    # tina: deployments and their status without limits, pods only in team=a: deleting a
    # Deployment deletes its pods.
    role("deploy-open", NS, [rule("*", "deployments deployments/status", "apps")]),
    role("pods-a", NS, [rule("*", "pods")], {"pods": A_ONLY}),
    binding("tina-deploy", "deploy-open", "User:tina", namespace=NS),
    binding("tina-pods", "pods-a", "User:tina", namespace=NS),
    # wanda: alice's role, in warn mode.
    role("team-a-warn", NS, EDIT, {"configmaps": A_ONLY}, mode="warn"),
    binding("wanda", "team-a-warn", "User:wanda", namespace=NS),
    # admin: everything, no annotation.
    role("admin", rules=[rule("*", "*", "*")]),
    binding("admin", "admin", "User:admin"),
)

MINE = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "name": "d-a",
    "uid": "11111111-0000-4000-8000-000000000001",
    "controller": True,
    "blockOwnerDeletion": True,
}
HOLD = "example.com/hold"


def owned(*refs: dict[str, Any]) -> dict[str, Any]:
    return {"ownerReferences": [dict(r) for r in refs]}


def held(*finalizers: str) -> dict[str, Any]:
    return {"finalizers": list(finalizers)}


DEPLOYMENT_SPEC = {
    "spec": {
        "selector": {"matchLabels": {"app": "web"}},
        "template": {
            "metadata": {"labels": {"app": "web", "team": "b"}},
            "spec": {"containers": [{"name": "c", "image": "nginx"}]},
        },
    }
}


def write(
    user: str,
    resource: str,
    name: str,
    labels: dict[str, str],
    new: dict[str, Any] | None,
    old: dict[str, Any] | None = None,
    operation: str = "UPDATE",
    kind: str = "",
    extra: dict[str, Any] | None = None,
) -> Request:
    """A write of ``name`` keeping its ``labels``; ``new``/``old``: metadata fields added to the
    object and the stored object (a CREATE has none)."""
    kinds = {"serviceaccounts": "ServiceAccount", "configmaps": "ConfigMap", "secrets": "Secret"}
    review = make_review(
        user,
        operation,
        resource,
        namespace=NS,
        name=name,
        labels=labels,
        old_labels=labels if operation == "UPDATE" else None,
        kind=kind or kinds.get(resource.partition("/")[0], "Pod"),
        extra_object=extra,
        object_metadata=new,
        old_metadata=old,
    )
    return parse_review(json.loads(json.dumps(review))).request


def decide(request: Request, mode: str = "enforce") -> Decision:
    options = Options(Compiler((DEFAULT_ANNOTATION_KEY,)), mode=mode)
    return evaluate(request, Context(WORLD, options))


OWNER = "OwnerReferenceNotPermitted"
FINALIZER = "FinalizerNotPermitted"
LOAN = "AccountNotLent"

CASES = [
    # --- ServiceAccounts: alice writes them all, deletes (lends) only team=a's ----------------
    pytest.param("alice", "serviceaccounts", "sa-b", TEAM_B, owned(GHOST), None, OWNER,
                 id="sa-other-bucket-owner-that-does-not-exist"),
    pytest.param("alice", "serviceaccounts", "sa-b", TEAM_B, owned(MINE), None, OWNER,
                 id="sa-other-bucket-owned-by-her-deployment"),
    pytest.param("alice", "serviceaccounts", "sa-b", TEAM_B, owned({**MINE, "uid": "2"}),
                 owned(MINE), OWNER, id="sa-other-bucket-owner-uid-changed"),
    pytest.param("alice", "serviceaccounts", "sa-b", TEAM_B, owned({**GHOST, "controller": True}),
                 owned(GHOST), OWNER, id="sa-other-bucket-controller-set"),
    pytest.param("alice", "serviceaccounts", "sa-b", TEAM_B,
                 owned({**GHOST, "blockOwnerDeletion": True}), owned(GHOST), OWNER,
                 id="sa-other-bucket-block-owner-deletion-set"),
    pytest.param("alice", "serviceaccounts", "sa-b", TEAM_B, owned(GHOST), owned(GHOST, MINE),
                 OWNER, id="sa-other-bucket-one-owner-removed"),
    pytest.param("alice", "serviceaccounts", "sa-b", TEAM_B, {"ownerReferences": []},
                 owned(MINE), OWNER, id="sa-other-bucket-orphaned"),
    pytest.param("alice", "serviceaccounts", "sa-b", TEAM_B, None, owned(MINE), OWNER,
                 id="sa-other-bucket-owner-field-dropped"),
    pytest.param("alice", "serviceaccounts", "sa-b", TEAM_B, owned(MINE, GHOST),
                 owned(GHOST, MINE), None, id="sa-other-bucket-owners-reordered"),
    pytest.param("alice", "serviceaccounts", "sa-b", TEAM_B, owned({**GHOST, "controller": False}),
                 owned(GHOST), None, id="sa-other-bucket-absent-flag-spelled-false"),
    pytest.param("alice", "serviceaccounts", "sa-b", TEAM_B, owned(GHOST), owned(GHOST), None,
                 id="sa-other-bucket-owners-unchanged"),
    pytest.param("alice", "serviceaccounts", "sa-b", TEAM_B, held(HOLD), None, FINALIZER,
                 id="sa-other-bucket-finalizer-added"),
    pytest.param("alice", "serviceaccounts", "sa-b", TEAM_B, None, held(HOLD), FINALIZER,
                 id="sa-other-bucket-finalizer-removed"),
    pytest.param("alice", "serviceaccounts", "sa-b", TEAM_B, held(HOLD), held(HOLD), None,
                 id="sa-other-bucket-finalizers-unchanged"),
    pytest.param("alice", "serviceaccounts", "sa-a", TEAM_A, owned(GHOST), None, None,
                 id="sa-own-bucket-owner-added"),
    pytest.param("alice", "serviceaccounts", "sa-a", TEAM_A, {"ownerReferences": []},
                 owned(MINE), None, id="sa-own-bucket-orphaned"),
    pytest.param("alice", "serviceaccounts", "sa-a", TEAM_A, held(HOLD), None, None,
                 id="sa-own-bucket-finalizer-added"),
    pytest.param("alice", "serviceaccounts", "sa-none", {}, owned(GHOST), None, OWNER,
                 id="sa-unlabeled-owner-added"),
    pytest.param("admin", "serviceaccounts", "sa-b", TEAM_B, owned(GHOST), None, None,
                 id="sa-unrestricted-user"),
    # Without a delete grant, the roles granting the write judge the delete they cause.
    pytest.param("pat", "serviceaccounts", "sa-b", TEAM_B, owned(GHOST), None, OWNER,
                 id="sa-no-delete-grant-other-bucket"),
    pytest.param("pat", "serviceaccounts", "sa-a", TEAM_A, owned(GHOST), None, None,
                 id="sa-no-delete-grant-own-bucket"),
    pytest.param("pat", "configmaps", "cm-a", TEAM_A, owned(GHOST), None, None,
                 id="configmap-no-delete-grant-own-bucket"),
    # --- Objects whose delete grant is narrower than their write grant -------------------------
    pytest.param("nora", "configmaps", "cm-b", TEAM_B, owned(GHOST), None, OWNER,
                 id="configmap-other-bucket-owner-added"),
    pytest.param("nora", "configmaps", "cm-b", TEAM_B, held(HOLD), None, FINALIZER,
                 id="configmap-other-bucket-finalizer-added"),
    pytest.param("nora", "configmaps", "cm-a", TEAM_A, owned(MINE), None, None,
                 id="configmap-own-bucket-owner-added"),
    pytest.param("nora", "configmaps", "cm-b", TEAM_B, {"annotations": {"x": "y"}}, None, None,
                 id="configmap-other-bucket-other-change"),
    pytest.param("nora", "secrets", "s-b", TEAM_B, owned(GHOST), None, OWNER,
                 id="secret-other-bucket-owner-added"),
    pytest.param("nora", "secrets", "s-a", TEAM_A, owned(GHOST), None, None,
                 id="secret-own-bucket-owner-added"),
    pytest.param("nora", "pods", "web-b", TEAM_B, owned(GHOST), None, OWNER,
                 id="pod-other-bucket-owner-added"),
    pytest.param("nora", "pods/status", "web-b", TEAM_B, owned(GHOST), None, OWNER,
                 id="pod-status-other-bucket-owner-added"),
    # --- A label restriction on the write itself: the label rule refuses first -----------------
    pytest.param("alice", "configmaps", "cm-b", TEAM_B, owned(GHOST), None, "LabelNotPermitted",
                 id="configmap-restricted-write-other-bucket"),
    pytest.param("alice", "configmaps", "cm-a", TEAM_A, owned(GHOST), None, None,
                 id="configmap-restricted-write-own-bucket"),
]  # fmt: skip


@pytest.mark.parametrize(("user", "resource", "name", "labels", "new", "old", "reason"), CASES)
def test_owner_references_and_finalizers_are_judged_as_deleting(
    user: str,
    resource: str,
    name: str,
    labels: dict[str, str],
    new: dict[str, Any] | None,
    old: dict[str, Any] | None,
    reason: str | None,
) -> None:
    decision = decide(write(user, resource, name, labels, new, old))
    assert decision.allowed is (reason is None), decision.message
    if reason is not None:
        assert decision.reason == reason, decision.message


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        pytest.param("ownerReferences", "x", OWNER, id="owners-not-a-list"),
        pytest.param("ownerReferences", [GHOST, 7], OWNER, id="owner-not-an-object"),
        pytest.param("finalizers", {"a": 1}, FINALIZER, id="finalizers-not-a-list"),
        pytest.param("finalizers", [HOLD, 7], FINALIZER, id="finalizer-not-a-string"),
    ],
)
def test_malformed_fields_count_as_changed(field: str, value: Any, reason: str) -> None:
    """The webhook's wire refuses them (400); the engine, fed by other front doors too, never
    takes a malformed list for an empty one."""
    request = write("alice", "serviceaccounts", "sa-b", TEAM_B, None)
    assert request.object is not None
    obj = {**request.object, "metadata": {**request.object["metadata"], field: value}}
    decision = decide(dataclasses.replace(request, object=obj))
    assert (decision.allowed, decision.reason) == (False, reason), decision.message
    assert "a malformed entry" in decision.message


def test_the_refusal_names_the_reference_the_delete_rule_and_the_fix() -> None:
    decision = decide(write("alice", "serviceaccounts", "sa-b", TEAM_B, owned(GHOST)))
    assert (decision.allowed, decision.code, decision.reason) == (False, 403, OWNER)
    assert decision.message == (
        'user "alice" may not update serviceaccounts "sa-b" in namespace "t1": it changes '
        'metadata.ownerReferences (adds ConfigMap "ghost" (v1, uid '
        '"00000000-0000-4000-8000-000000000000")), and the garbage collector deletes an object '
        "once its owners are gone (at once for an owner that does not exist) and whatever a "
        "deleted owner owns, so the write is judged as deleting the object: "
        'user "alice" may not delete serviceaccounts "sa-b" in namespace "t1": the account as '
        'stored has label team="b": deleting a ServiceAccount is judged as lending it, and the '
        "user may lend only ServiceAccounts labeled team in [a] (role t1/team-a). Leave "
        "metadata.ownerReferences as stored, or ask someone who may delete the object to make "
        "the change"
    )
    assert decision.explanation[0] == f"judged as deleting the object: {LOAN}"


def test_a_change_of_both_fields_names_both() -> None:
    request = write("alice", "serviceaccounts", "sa-b", TEAM_B, {**owned(MINE), **held(HOLD)})
    decision = decide(request)
    assert decision.reason == OWNER
    assert "metadata.ownerReferences (adds Deployment" in decision.message
    assert 'and metadata.finalizers (adds "example.com/hold")' in decision.message
    assert "Leave metadata.ownerReferences and metadata.finalizers as stored" in decision.message
    assert "controller, blockOwnerDeletion)" in decision.message


def test_the_delete_judged_without_a_delete_grant_is_by_the_writing_roles() -> None:
    decision = decide(write("pat", "serviceaccounts", "sa-b", TEAM_B, owned(GHOST)))
    assert 'user "pat" may not update serviceaccounts "sa-b"' in decision.message
    assert "lend only ServiceAccounts labeled team in [a] (role t1/patcher)" in decision.message


def test_a_narrower_delete_grant_decides() -> None:
    decision = decide(write("nora", "configmaps", "cm-b", TEAM_B, owned(GHOST)))
    assert (
        'user "nora" may not delete configmaps "cm-b" in namespace "t1": the existing '
        'object\'s label team="b" is not permitted (role t1/deleter-a allows team in [a])'
    ) in decision.message


@pytest.mark.parametrize(
    ("name", "labels", "reason"),
    [
        pytest.param("sa-b", TEAM_B, OWNER, id="other-bucket"),
        pytest.param("sa-a", TEAM_A, None, id="own-bucket"),
    ],
)
def test_a_create_carrying_owners_is_judged_as_deleting_what_it_creates(
    name: str, labels: dict[str, str], reason: str | None
) -> None:
    request = write("alice", "serviceaccounts", name, labels, owned(GHOST), operation="CREATE")
    decision = decide(request)
    assert decision.allowed is (reason is None), decision.message
    if reason is not None:
        assert decision.reason == reason
        assert 'it sets metadata.ownerReferences (adds ConfigMap "ghost"' in decision.message
        assert 'has label team="b": deleting a ServiceAccount' in decision.message
        assert "Create it without metadata.ownerReferences, or ask" in decision.message
    plain = write("alice", "serviceaccounts", name, labels, None, operation="CREATE")
    assert decide(plain).allowed


@pytest.mark.parametrize(
    ("name", "pods", "reason"),
    [
        pytest.param("d-b", "b", OWNER, id="other-bucket-pods"),
        pytest.param("d-a", "a", None, id="own-bucket-pods"),
    ],
)
def test_a_deployment_given_an_owner_is_judged_with_the_pods_it_deletes(
    name: str, pods: str, reason: str | None
) -> None:
    """tina writes Deployments (and their status) without limits; deleting one deletes its pods,
    which she may create only in team=a: its status write setting an owner is judged so."""
    spec = json.loads(json.dumps(DEPLOYMENT_SPEC).replace('"team": "b"', f'"team": "{pods}"'))
    request = write(
        "tina", "deployments.apps/status", name, {}, owned(GHOST), kind="Deployment", extra=spec
    )
    decision = decide(request)
    assert decision.allowed is (reason is None), decision.message
    if reason is not None:
        assert decision.reason == reason
        assert f'its stored pod template (spec.template) has label team="{pods}"' in (
            decision.message
        )


def test_a_softer_mode_softens_the_refusal() -> None:
    request = write("wanda", "serviceaccounts", "sa-b", TEAM_B, owned(GHOST))
    decision = decide(request)
    assert (decision.allowed, decision.mode, decision.reason) == (True, "warn", OWNER)
    assert any("(not enforced: warn mode)" in w for w in decision.warnings)
    enforced = decide(write("alice", "serviceaccounts", "sa-b", TEAM_B, owned(GHOST)), "audit")
    assert (enforced.allowed, enforced.mode) == (True, "audit")


def test_long_reference_lists_are_cut_in_the_message() -> None:
    refs = [{**GHOST, "name": "n" * 300, "uid": str(i)} for i in range(50)]
    decision = decide(write("alice", "serviceaccounts", "sa-b", TEAM_B, owned(*refs)))
    assert decision.reason == OWNER
    assert "47 more" in decision.message
    assert "n" * 81 not in decision.message
    assert len(decision.message) < 2000


def test_the_rule_runs_after_the_label_rule_and_skips_what_it_does_not_judge() -> None:
    assert POST_CHECKS[-1] is check_owners
    ctx = Context(WORLD)
    delete = write("alice", "serviceaccounts", "sa-b", TEAM_B, None)
    assert check_owners(dataclasses.replace(delete, operation="DELETE"), ctx) is None
    scale = write("tina", "deployments.apps/scale", "d-b", {}, owned(GHOST), kind="Scale")
    assert check_owners(scale, ctx) is None


@pytest.mark.parametrize(
    ("new", "reason"),
    [
        pytest.param(owned(GHOST), OWNER, id="owner-added"),
        pytest.param(None, None, id="owners-unchanged"),
    ],
)
def test_the_object_as_written_is_judged_too(
    new: dict[str, Any] | None, reason: str | None
) -> None:
    """nora relabels her team a ConfigMap into team b (her writes are unrestricted) and gives it
    an owner: the garbage collector would delete it as written, which she may not delete."""
    request = write("nora", "configmaps", "cm-a", TEAM_A, new)
    assert request.object is not None
    meta = {**request.object["metadata"], "labels": TEAM_B}
    decision = decide(dataclasses.replace(request, object={**request.object, "metadata": meta}))
    assert decision.allowed is (reason is None), decision.message
    if reason is not None:
        assert decision.reason == reason
        judged = 'delete configmaps "cm-a" in namespace "t1": the existing object\'s label team="b"'
        assert judged in decision.message
