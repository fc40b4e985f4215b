"""Acting as another subject, with the shipped example tenant roles (manifests/examples): a role
whose permission annotation confines a tenant to team=a lends only identities within all of its
buckets, whichever resources the annotation names. Impersonation through /authorize; a token
request, the ServiceAccount a pod (or a workload's pods) runs as, and handing out an identity verb
(the escalation check) through /validate; every review as the API server sends it."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from flask.testing import FlaskClient

from app.engine.context import ObjectRef, ParentUnavailable
from app.engine.model import Request
from app.engine.policy import DEFAULT_ANNOTATION_KEY
from app.engine.rbac import RBAC_GROUP
from app.source.static import StaticSource
from tests.support import binding, make_access_review, make_review, pod, role, rule, served

TENANTS = Path(__file__).resolve().parents[2] / "manifests" / "examples" / "tenants.yaml"


def shipped_annotation(name: str) -> dict[str, Any]:
    """The permission annotation of a shipped example Role."""
    for doc in yaml.safe_load_all(TENANTS.read_text()):
        if doc and doc["kind"] == "Role" and doc["metadata"]["name"] == name:
            annotation: dict[str, Any] = json.loads(
                doc["metadata"]["annotations"][DEFAULT_ANNOTATION_KEY]
            )
            return annotation
    raise LookupError(name)


TEAM_A = shipped_annotation("team-a")  # configmaps, secrets, deployments.apps, pods: team a

EXTRA = [
    # alice (bound to the shipped team-a Role) may also act as ServiceAccounts, and write Roles
    # and RoleBindings, limited by the same annotation; it names no serviceaccounts.
    role(
        "team-a-identities",
        "t1",
        [
            rule("impersonate get", "serviceaccounts"),
            rule("create", "serviceaccounts/token"),
            # Not "*": escalate and bind outside her annotation would bypass the check.
            rule("get list create update patch delete", "roles rolebindings", RBAC_GROUP),
        ],
        TEAM_A,
    ),
    binding("team-a-identities", "team-a-identities", "User:alice", namespace="t1"),
    # wendy holds everything, limited the same way ("*" includes impersonate).
    role("team-a-all", "t1", [rule("*", "*")], TEAM_A),
    binding("team-a-all", "team-a-all", "User:wendy", namespace="t1"),
    role("act-as-users", "", [rule("impersonate", "users groups")], TEAM_A),
    binding("wendy-users", "act-as-users", "User:wendy"),
    # ian: an admin's delegate, unrestricted.
    role("act-as-anyone", "", [rule("impersonate", "users serviceaccounts")]),
    binding("ian", "act-as-anyone", "User:ian"),
    # An admin's unannotated Role lending ServiceAccounts.
    role("impersonator", "t1", [rule("impersonate", "serviceaccounts")]),
    # carol: the shipped team-a Role alone (no grant on serviceaccounts), and Jobs and CronJobs
    # limited by the same annotation (which names neither).
    binding("carol", "team-a", "User:carol", namespace="t1"),
    role("team-a-jobs", "t1", [rule("*", "jobs cronjobs", "batch")], TEAM_A),
    binding("carol-jobs", "team-a-jobs", "User:carol", namespace="t1"),
    # root: everything, no annotation.
    role("root", "", [rule("*", "*", "*")]),
    binding("root", "root", "User:root"),
]

ACCOUNTS = {"deployer-a": {"team": "a"}, "deployer-b": {"team": "b"}, "unlabeled": {}}


class Accounts(StaticSource):
    """RBAC from files; ServiceAccounts as the parent and metadata lookups read them."""

    def _account(self, resource: str, name: str) -> Mapping[str, Any]:
        labels = ACCOUNTS.get(name)
        if resource != "serviceaccounts" or labels is None:
            raise ParentUnavailable(f'could not read {resource} "{name}": HTTP 404 NotFound')
        return {"metadata": {"name": name, "namespace": "t1", "labels": labels}}

    def fetch_parent(self, request: Request) -> Mapping[str, Any]:
        return self._account(request.resource.resource, request.name)

    def fetch_metadata(self, ref: ObjectRef) -> Mapping[str, Any]:
        return self._account(ref.resource, ref.name)


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FlaskClient]:
    directory = tmp_path_factory.mktemp("rbac")
    shutil.copy(TENANTS, directory / "tenants.yaml")
    with served(directory, [obj for _, obj in EXTRA], Accounts) as client:
        yield client


def authorize(client: FlaskClient, review: Any) -> dict[str, Any]:
    response = client.post("/authorize", json=review)
    assert response.status_code == 200, response.get_data(as_text=True)
    status: dict[str, Any] = response.get_json()["status"]
    assert status["allowed"] is False  # only ever narrows what RBAC decides
    return status


def validate(client: FlaskClient, review: Any) -> dict[str, Any]:
    response = client.post("/validate", json=review)
    assert response.status_code == 200, response.get_data(as_text=True)
    result: dict[str, Any] = response.get_json()["response"]
    return result


# -- Impersonation (/authorize) --------------------------------------------------------------------

LIMIT_ALICE = "ServiceAccounts labeled team in [a] (role t1/team-a-identities)"


@pytest.mark.parametrize(
    ("user", "verb", "resource", "name", "namespace", "message"),
    [
        pytest.param(
            "alice", "impersonate", "serviceaccounts", "deployer-a", "t1", None, id="own-bucket"
        ),
        pytest.param(
            "alice",
            "impersonate",
            "serviceaccounts",
            "deployer-b",
            "t1",
            'user "alice" may not impersonate serviceaccounts "deployer-b" in namespace "t1": '
            'the existing object\'s label team="b" is not permitted; it may impersonate only '
            + LIMIT_ALICE,
            id="other-bucket",
        ),
        pytest.param(
            "alice",
            "impersonate",
            "serviceaccounts",
            "unlabeled",
            "t1",
            'user "alice" may not impersonate serviceaccounts "unlabeled" in namespace "t1": '
            "the existing object has no label team; it may impersonate only " + LIMIT_ALICE,
            id="unlabeled",
        ),
        pytest.param(
            "wendy",
            "impersonate",
            "serviceaccounts",
            "deployer-b",
            "t1",
            'user "wendy" may not impersonate serviceaccounts "deployer-b" in namespace "t1": '
            'the existing object\'s label team="b" is not permitted; it may impersonate only '
            "ServiceAccounts labeled team in [a] (role t1/team-a-all)",
            id="star-verbs-other-bucket",
        ),
        pytest.param(
            "wendy",
            "impersonate",
            "users",
            "admin",
            "",
            'user "wendy" may not impersonate users "admin": users carry no labels, so only a '
            "role without a permission annotation lends them; a label-restricted role lends "
            "only ServiceAccounts labeled team in [a] (clusterrole act-as-users)",
            id="user",
        ),
        pytest.param(
            "wendy", "impersonate", "serviceaccounts", "deployer-a", "t1", None, id="star-own"
        ),
        pytest.param("ian", "impersonate", "users", "admin", "", None, id="unannotated-user"),
        pytest.param(
            "ian", "impersonate", "serviceaccounts", "deployer-b", "t1", None, id="unannotated-sa"
        ),
    ],
)
def test_an_annotated_role_lends_only_identities_within_all_its_buckets(
    client: FlaskClient,
    user: str,
    verb: str,
    resource: str,
    name: str,
    namespace: str,
    message: str | None,
) -> None:
    review = make_access_review(user, verb, resource, namespace=namespace, name=name)
    status = authorize(client, review)
    if message is None:
        assert not status.get("denied"), status
    else:
        assert status == {"allowed": False, "denied": True, "reason": message}


# -- Token requests and pods (/validate) -----------------------------------------------------------


def token_request(user: str, account: str) -> dict[str, Any]:
    return make_review(
        user,
        "CREATE",
        "serviceaccounts/token",
        namespace="t1",
        name=account,
        kind="TokenRequest",
        labels={},
        extra_object={"apiVersion": "authentication.k8s.io/v1", "spec": {"audiences": ["api"]}},
    )


@pytest.mark.parametrize(
    ("user", "account", "message"),
    [
        pytest.param("alice", "deployer-a", None, id="own-bucket"),
        pytest.param(
            "alice",
            "deployer-b",
            'user "alice" may not create serviceaccounts/token "deployer-b" in namespace "t1": '
            'the existing object\'s label team="b" is not permitted (role t1/team-a-identities '
            "allows team in [a])",
            id="other-bucket",
        ),
        pytest.param(
            "wendy",
            "deployer-b",
            'user "wendy" may not create serviceaccounts/token "deployer-b" in namespace "t1": '
            'the existing object\'s label team="b" is not permitted (role t1/team-a-all allows '
            "team in [a])",
            id="star-verbs-other-bucket",
        ),
    ],
)
def test_a_token_request_is_an_identity_loan(
    client: FlaskClient, user: str, account: str, message: str | None
) -> None:
    response = validate(client, token_request(user, account))
    if message is None:
        assert response["allowed"] is True
    else:
        assert response["allowed"] is False
        assert response["status"]["message"] == message


def pod_review(account: str) -> dict[str, Any]:
    body = pod("web", node="", serviceAccountName=account)
    body["metadata"]["labels"] = {"team": "a"}
    return make_review(
        "wendy",
        "CREATE",
        "pods",
        namespace="t1",
        name="web",
        kind="Pod",
        labels={"team": "a"},
        extra_object=body,
    )


@pytest.mark.parametrize(
    ("account", "allowed"),
    [
        pytest.param("deployer-a", True, id="own-bucket"),
        pytest.param("default", True, id="namespace-default"),
        pytest.param("deployer-b", False, id="other-bucket"),
        pytest.param("unlabeled", False, id="unlabeled"),
    ],
)
def test_a_pod_runs_as_its_service_account_only_within_the_buckets(
    client: FlaskClient, account: str, allowed: bool
) -> None:
    response = validate(client, pod_review(account))
    assert response["allowed"] is allowed, response
    if not allowed:
        message = response["status"]["message"]
        assert message.startswith('user "wendy" may not create pods "web" in namespace "t1"')
        assert f'serviceaccounts "{account}"' in message
        assert "team in [a]" in message


POD_SPEC = {"containers": [{"name": "c", "image": "nginx"}]}
TEAM_A_LABELS = {"team": "a"}


def pod_template(account: str) -> dict[str, Any]:
    return {
        "metadata": {"labels": {**TEAM_A_LABELS, "app": "web"}},
        "spec": {**POD_SPEC, "serviceAccountName": account},
    }


def workload_spec(kind: str, account: str) -> dict[str, Any]:
    """The spec of a ``kind`` whose pods run as ``account``, otherwise within team=a."""
    if kind == "Pod":
        return {**POD_SPEC, "serviceAccountName": account}
    if kind == "Deployment":
        selector = {"matchLabels": {**TEAM_A_LABELS, "app": "web"}}
        return {"replicas": 1, "selector": selector, "template": pod_template(account)}
    template = pod_template(account)
    template["spec"]["restartPolicy"] = "Never"
    job = {"template": template}
    if kind == "Job":
        return job
    job_template = {"metadata": {"labels": TEAM_A_LABELS}, "spec": job}
    return {"schedule": "*/5 * * * *", "jobTemplate": job_template}


# kind → the resource the API server names in the review.
WRITTEN = {
    "Pod": "pods",
    "Deployment": "deployments.apps",
    "Job": "jobs.batch",
    "CronJob": "cronjobs.batch",
}


def running_as(user: str, kind: str, account: str) -> dict[str, Any]:
    """``user``'s CREATE of a ``kind`` named web, labeled team=a, whose pods run as ``account``."""
    group = WRITTEN[kind].partition(".")[2]
    body = {
        "apiVersion": f"{group}/v1" if group else "v1",
        "kind": kind,
        "metadata": {"name": "web", "namespace": "t1", "labels": TEAM_A_LABELS},
        "spec": workload_spec(kind, account),
    }
    return make_review(
        user,
        "CREATE",
        WRITTEN[kind],
        namespace="t1",
        name="web",
        kind=kind,
        labels=TEAM_A_LABELS,
        extra_object=body,
    )


LENT = "the user may run pods only as ServiceAccounts labeled team in [a] (role t1/{role})"


def runs_as_denial(kind: str, account: str, has: str) -> str:
    whose = "it" if kind == "Pod" else "its pod template"
    role = "team-a-jobs" if kind in ("Job", "CronJob") else "team-a"
    return (
        f'user "carol" may not create {WRITTEN[kind]} "web" in namespace "t1": {whose} uses '
        f'serviceaccounts "{account}", which {has}: ' + LENT.format(role=role)
    )


@pytest.mark.parametrize("kind", list(WRITTEN))
@pytest.mark.parametrize(
    ("user", "account", "has"),
    [
        pytest.param("carol", "deployer-a", None, id="own-bucket"),
        pytest.param("carol", "default", None, id="namespace-default"),
        pytest.param("carol", "deployer-b", 'has label team="b"', id="other-bucket"),
        pytest.param("carol", "unlabeled", "has no label team", id="unlabeled"),
        pytest.param("root", "deployer-b", None, id="unannotated-admin"),
    ],
)
def test_the_roles_granting_a_write_lend_the_service_account_its_pods_run_as(
    client: FlaskClient, kind: str, user: str, account: str, has: str | None
) -> None:
    """carol holds no grant on ServiceAccounts: the shipped team-a Role that lets her write the
    pod (or the workload) still lends only ServiceAccounts within its buckets."""
    response = validate(client, running_as(user, kind, account))
    if has is None:
        assert response["allowed"] is True, response
    else:
        assert response["allowed"] is False
        assert response["status"]["message"] == runs_as_denial(kind, account, has)


@pytest.mark.parametrize("kind", list(WRITTEN))
def test_a_service_account_that_cannot_be_read_is_not_lent(client: FlaskClient, kind: str) -> None:
    response = validate(client, running_as("carol", kind, "missing"))
    assert response["allowed"] is False
    assert response["status"]["message"].endswith(
        'uses serviceaccounts "missing", whose labels cannot be checked: could not read '
        'serviceaccounts "missing": HTTP 404 NotFound'
    )


# -- Handing out identity verbs (the escalation check) ---------------------------------------------


def write(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    """alice's CREATE of a Role or RoleBinding in t1."""
    return make_review(
        "alice",
        "CREATE",
        f"{kind.lower()}s.{RBAC_GROUP}",
        namespace="t1",
        name=obj["metadata"]["name"],
        kind=kind,
        labels={},
        extra_object={**obj, "apiVersion": f"{RBAC_GROUP}/v1"},
    )


def new_role(rules: list[dict[str, Any]], permissions: Any = None) -> dict[str, Any]:
    return write("Role", role("handout", "t1", rules, permissions)[1])


LIMITED = "their own access is limited to team in [a]"
ESCALATE = '(escalation check; holding the "escalate" verb on roles bypasses it)'


@pytest.mark.parametrize(
    ("review", "message"),
    [
        pytest.param(
            new_role([rule("impersonate", "serviceaccounts")]),
            f'user "alice" may not grant serviceaccounts without a label restriction: {LIMITED} '
            f"{ESCALATE}",
            id="unannotated-impersonation",
        ),
        pytest.param(
            new_role(
                [rule("impersonate", "serviceaccounts")], {"serviceaccounts": {"team": ["b"]}}
            ),
            f'user "alice" may not grant serviceaccounts with team="b": {LIMITED} {ESCALATE}',
            id="another-buckets-accounts",
        ),
        pytest.param(
            new_role([rule("create", "serviceaccounts/token")]),
            f'user "alice" may not grant serviceaccounts/token without a label restriction: '
            f"{LIMITED} {ESCALATE}",
            id="unannotated-token-requests",
        ),
        pytest.param(
            write(
                "RoleBinding", binding("handout", "impersonator", "User:alice", namespace="t1")[1]
            ),
            'user "alice" may not grant serviceaccounts without a label restriction through role '
            f't1/impersonator: {LIMITED} (escalation check; holding the "bind" verb on roles '
            '"impersonator" bypasses it)',
            id="herself-to-an-admins-impersonator",
        ),
    ],
)
def test_handing_out_identities_beyond_her_buckets_is_refused(
    client: FlaskClient, review: dict[str, Any], message: str
) -> None:
    response = validate(client, review)
    assert response["allowed"] is False
    assert response["status"]["message"] == message


@pytest.mark.parametrize(
    "review",
    [
        pytest.param(
            new_role([rule("impersonate", "serviceaccounts")], TEAM_A), id="the-same-annotation"
        ),
        pytest.param(
            new_role([rule("impersonate", "serviceaccounts")], {"configmaps": {"team": ["a"]}}),
            id="one-of-her-buckets",
        ),
        pytest.param(
            new_role(
                [rule("create", "serviceaccounts/token")], {"serviceaccounts": {"team": ["a"]}}
            ),
            id="her-accounts-tokens",
        ),
    ],
)
def test_sharing_her_identities_is_allowed(client: FlaskClient, review: dict[str, Any]) -> None:
    assert validate(client, review)["allowed"] is True
