"""The escalation check through POST /validate: a tenant who may write Roles and RoleBindings
cannot hand herself (or anyone) reads or identities outside her bucket, while sharing her own
bucket with a teammate stays possible. Every review is an AdmissionReview as the API server sends
it for a Role or RoleBinding write; a token request for a ServiceAccount, the other way to act as
it, is judged by that ServiceAccount's labels."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient

from app.engine.context import ParentUnavailable
from app.engine.model import Request
from app.engine.rbac import RBAC_GROUP
from app.source.static import StaticSource
from tests.support import binding, make_review, role, rule, served

TEAM_A = {"*": {"team": ["a"]}}
READS = "get list watch"

RBAC = [
    # tina administers the shared namespace t1: every verb on every core resource and on RBAC
    # objects, every resource limited to team a (her verbs "*" include escalate and bind).
    role("tenant", "t1", [rule("*", "*"), rule("*", "*", RBAC_GROUP)], TEAM_A),
    binding("tina", "tenant", "User:tina", namespace="t1"),
    # Read-only roles an admin wrote: unrestricted, team a's, team b's.
    role("reader", "t1", [rule(READS, "configmaps secrets")]),
    role("reader-a", "t1", [rule(READS, "configmaps secrets")], TEAM_A),
    role("reader-b", "t1", [rule(READS, "configmaps secrets")], {"*": {"team": ["b"]}}),
]


SERVICE_ACCOUNTS = {"deployer-a": {"team": "a"}, "deployer-b": {"team": "b"}}


class Accounts(StaticSource):
    """RBAC from files; the ServiceAccounts a token request names, as a parent lookup reads them."""

    def fetch_parent(self, request: Request) -> Mapping[str, Any]:
        labels = SERVICE_ACCOUNTS.get(request.name)
        if request.resource.resource != "serviceaccounts" or labels is None:
            raise ParentUnavailable(f'could not read {request.resource} "{request.name}"')
        return {"metadata": {"name": request.name, "namespace": "t1", "labels": labels}}


@pytest.fixture
def client(tmp_path: Path) -> Iterator[FlaskClient]:
    with served(tmp_path, [obj for _, obj in RBAC], Accounts) as client:
        yield client


def write(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    """tina's CREATE of ``obj``, labeled team=a as her own label rule demands of RBAC objects."""
    name = obj["metadata"]["name"]
    obj["metadata"]["labels"] = {"team": "a"}
    return make_review(
        "tina",
        "CREATE",
        f"{kind.lower()}s.{RBAC_GROUP}",
        namespace="t1",
        name=name,
        kind=kind,
        labels={"team": "a"},
        extra_object={**obj, "apiVersion": f"{RBAC_GROUP}/v1"},
    )


def new_role(rules: list[dict[str, Any]], permissions: Any = None) -> dict[str, Any]:
    return write("Role", role("handout", "t1", rules, permissions)[1])


def new_binding(role_name: str, subject: str) -> dict[str, Any]:
    return write("RoleBinding", binding("handout", role_name, subject, namespace="t1")[1])


def decide(client: FlaskClient, review: dict[str, Any]) -> dict[str, Any]:
    response = client.post("/validate", json=review)
    assert response.status_code == 200, response.get_data(as_text=True)
    return response.get_json()["response"]


ESCALATE = '(escalation check; holding the "escalate" verb on roles bypasses it)'
LIMIT = "their own access is limited to team in [a]"


@pytest.mark.parametrize(
    ("review", "message"),
    [
        pytest.param(
            new_role([rule(READS, "secrets configmaps")]),
            f'user "tina" may not grant configmaps without a label restriction: {LIMIT} {ESCALATE}',
            id="unannotated-read-only-role",
        ),
        pytest.param(
            new_role([rule(READS, "secrets configmaps")], {"*": {"team": ["b"]}}),
            f'user "tina" may not grant configmaps with team="b": {LIMIT} {ESCALATE}',
            id="reads-of-another-bucket",
        ),
        pytest.param(
            new_role([rule("get", "secrets", names="s-b")]),
            f'user "tina" may not grant secrets "s-b" without a label restriction: {LIMIT} '
            f"{ESCALATE}",
            id="read-by-name",
        ),
        pytest.param(
            new_role([rule("get", "pods/log")], {"configmaps": {"team": ["a"]}}),
            f'user "tina" may not grant pods/log without a label restriction: {LIMIT} {ESCALATE}',
            id="read-subresource",
        ),
        pytest.param(
            new_role([rule("deletecollection", "configmaps")]),
            f'user "tina" may not grant configmaps without a label restriction: {LIMIT} {ESCALATE}',
            id="deletecollection",
        ),
        pytest.param(
            new_role([rule("impersonate", "serviceaccounts")]),
            f'user "tina" may not grant serviceaccounts without a label restriction: {LIMIT} '
            f"{ESCALATE}",
            id="impersonate-serviceaccounts",
        ),
        pytest.param(
            new_role([rule("*", "secrets")], {"*": {"team": ["*"]}}),
            f'user "tina" may not grant secrets with team="*": {LIMIT} {ESCALATE}',
            id="star-verbs-wider-glob",
        ),
        pytest.param(
            new_binding("reader", "User:tina"),
            f'user "tina" may not grant configmaps without a label restriction through role '
            f't1/reader: {LIMIT} (escalation check; holding the "bind" verb on roles "reader" '
            "bypasses it)",
            id="herself-to-admins-read-only-role",
        ),
        pytest.param(
            new_binding("reader-b", "User:tina"),
            f'user "tina" may not grant configmaps with team="b" through role t1/reader-b: '
            f'{LIMIT} (escalation check; holding the "bind" verb on roles "reader-b" bypasses it)',
            id="herself-to-another-buckets-reader",
        ),
    ],
)
def test_handing_out_reads_or_identities_beyond_her_bucket_is_refused(
    client: FlaskClient, review: dict[str, Any], message: str
) -> None:
    response = decide(client, review)
    assert response["allowed"] is False
    assert response["status"]["code"] == 403
    assert response["status"]["message"] == message


@pytest.mark.parametrize(
    "review",
    [
        pytest.param(
            new_role([rule(READS, "secrets configmaps")], TEAM_A), id="reads-of-her-bucket"
        ),
        pytest.param(
            new_role([rule("get", "configmaps")], {"configmaps": {"team": ["a"], "app": ["x"]}}),
            id="narrower-reads",
        ),
        pytest.param(
            new_role([rule("impersonate", "serviceaccounts")], TEAM_A), id="her-service-accounts"
        ),
        pytest.param(new_binding("reader-a", "User:tom"), id="teammate-to-her-buckets-reader"),
        pytest.param(new_binding("tenant", "User:tom"), id="teammate-to-her-own-role"),
    ],
)
def test_sharing_her_own_bucket_is_allowed(client: FlaskClient, review: dict[str, Any]) -> None:
    assert decide(client, review)["allowed"] is True


@pytest.mark.parametrize(
    ("account", "allowed"),
    [
        pytest.param("deployer-a", True, id="her-bucket"),
        pytest.param("deployer-b", False, id="other"),
    ],
)
def test_a_token_for_a_service_account_is_judged_by_its_labels(
    client: FlaskClient, account: str, allowed: bool
) -> None:
    review = make_review(
        "tina",
        "CREATE",
        "serviceaccounts/token",
        namespace="t1",
        name=account,
        kind="TokenRequest",
        labels={},
        extra_object={"apiVersion": "authentication.k8s.io/v1", "spec": {"audiences": ["api"]}},
    )
    response = decide(client, review)
    assert response["allowed"] is allowed
    if not allowed:
        assert response["status"]["message"] == (
            f'user "tina" may not create serviceaccounts/token "{account}" in namespace "t1": '
            'the existing object\'s label team="b" is not permitted (role t1/tenant allows team '
            "in [a])"
        )
