"""Owner references and finalizers through /validate, with the shipped example tenants
(manifests/examples) and the ServiceAccounts `edit` lets them write: a write that makes the
garbage collector delete an object is judged as deleting it. Reviews as the API server sends
them: a recorded v1.35 update, and built ones for ServiceAccounts."""

from __future__ import annotations

import copy
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient

from tests.support import GHOST_OWNER as GHOST
from tests.support import RECENT, binding, load_review, make_review, role, rule, served

TENANTS = Path(__file__).resolve().parents[2] / "manifests" / "examples" / "tenants.yaml"

EXTRA = [
    # alice and bob also write ServiceAccounts, as `edit` lets them; the annotation (their
    # team's bucket) names none, so it limits only whom they lend, hence delete.
    role("accounts-a", "t1", [rule("*", "serviceaccounts")], {"configmaps": {"team": ["a"]}}),
    binding("accounts-a", "accounts-a", "User:alice", namespace="t1"),
    role("accounts-b", "t1", [rule("*", "serviceaccounts")], {"configmaps": {"team": ["b"]}}),
    binding("accounts-b", "accounts-b", "User:bob", namespace="t1"),
    role("root", "", [rule("*", "*", "*")]),
    binding("root", "root", "User:root"),
]

OWNED = {"ownerReferences": [GHOST]}
HELD = {"finalizers": ["example.com/hold"]}


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FlaskClient]:
    directory = tmp_path_factory.mktemp("rbac")
    shutil.copy(TENANTS, directory / "tenants.yaml")
    with served(directory, [obj for _, obj in EXTRA]) as client:
        yield client


def validate(client: FlaskClient, review: Any) -> dict[str, Any]:
    response = client.post("/validate", json=review)
    assert response.status_code == 200, response.get_data(as_text=True)
    result: dict[str, Any] = response.get_json()["response"]
    assert result["uid"] == review["request"]["uid"]
    return result


def account(
    user: str,
    name: str,
    team: str,
    new: dict[str, Any] | None,
    old: dict[str, Any] | None = None,
    operation: str = "UPDATE",
) -> dict[str, Any]:
    """A write of ServiceAccount ``name`` (labeled ``team``) as a patch or an apply reaches
    admission: the whole object and, on an update, the stored one."""
    labels = {"team": team}
    return make_review(
        user,
        operation,
        "serviceaccounts",
        namespace="t1",
        name=name,
        kind="ServiceAccount",
        labels=labels,
        old_labels=labels if operation == "UPDATE" else None,
        object_metadata=new,
        old_metadata=old,
    )


def recorded_update(user: str, metadata: dict[str, Any]) -> dict[str, Any]:
    """The recorded v1.35 update of configmap cm-a (team=a) by alice, made a change of
    ``metadata`` alone, sent as ``user``."""
    review = copy.deepcopy(load_review("c024-tenant-update-configmaps", RECENT))
    request = review["request"]
    request["userInfo"]["username"] = user
    request["userInfo"]["uid"] = user
    request["object"]["metadata"] = {**request["oldObject"]["metadata"], **metadata}
    return review


@pytest.mark.parametrize(
    ("review", "reason"),
    [
        pytest.param(account("alice", "sa-b", "b", OWNED), "OwnerReferenceNotPermitted",
                     id="alice-gives-bobs-account-an-owner"),
        pytest.param(account("alice", "sa-b", "b", HELD), "FinalizerNotPermitted",
                     id="alice-holds-bobs-account"),
        pytest.param(account("alice", "sa-b", "b", None, HELD), "FinalizerNotPermitted",
                     id="alice-releases-bobs-account"),
        pytest.param(account("alice", "sa-b", "b", OWNED, operation="CREATE"),
                     "OwnerReferenceNotPermitted", id="alice-creates-an-owned-account-for-bob"),
        pytest.param(account("alice", "sa-b", "b", OWNED, OWNED), None,
                     id="owners-unchanged"),
        pytest.param(account("alice", "sa-a", "a", OWNED), None, id="alice-owns-her-account"),
        pytest.param(account("bob", "sa-b", "b", OWNED), None, id="bob-owns-his-account"),
        pytest.param(account("root", "sa-b", "b", OWNED), None, id="unrestricted-user"),
        pytest.param(recorded_update("alice", OWNED), None, id="recorded-own-configmap"),
        pytest.param(recorded_update("bob", OWNED), "LabelNotPermitted",
                     id="recorded-other-buckets-configmap"),
    ],
)  # fmt: skip
def test_owner_writes_are_judged_as_deletes(
    client: FlaskClient, review: dict[str, Any], reason: str | None
) -> None:
    response = validate(client, review)
    assert response["allowed"] is (reason is None), response
    if reason is not None:
        status = response["status"]
        assert (status["code"], status["reason"]) == (403, "Forbidden")
        if reason != "LabelNotPermitted":
            field = "ownerReferences" if reason.startswith("Owner") else "finalizers"
            assert f" metadata.{field} (" in status["message"]
            assert "so the write is judged as deleting the object" in status["message"]


def test_the_tenant_reads_what_was_refused_and_what_to_do(client: FlaskClient) -> None:
    message = validate(client, account("alice", "sa-b", "b", OWNED))["status"]["message"]
    assert message == (
        'user "alice" may not update serviceaccounts "sa-b" in namespace "t1": it changes '
        'metadata.ownerReferences (adds ConfigMap "ghost" (v1, uid '
        '"00000000-0000-4000-8000-000000000000")), and the garbage collector deletes an object '
        "once its owners are gone (at once for an owner that does not exist) and whatever a "
        "deleted owner owns, so the write is judged as deleting the object: "
        'user "alice" may not delete serviceaccounts "sa-b" in namespace "t1": the account as '
        'stored has label team="b": deleting a ServiceAccount is judged as lending it, and the '
        "user may lend only ServiceAccounts labeled team in [a] (role t1/accounts-a). Leave "
        "metadata.ownerReferences as stored, or ask someone who may delete the object to make "
        "the change"
    )


def test_malformed_finalizers_are_a_bad_request(client: FlaskClient) -> None:
    review = account("alice", "sa-a", "a", {"finalizers": "example.com/hold"})
    response = client.post("/validate", json=review)
    assert response.status_code == 400
    assert "metadata.finalizers must be a list of strings" in response.get_data(as_text=True)
