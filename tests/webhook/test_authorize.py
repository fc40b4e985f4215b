"""POST /authorize in-process: label-scoped reads end to end (SubjectAccessReview in, status out),
the wire format's versions, and the 400 channel for bodies that are not SubjectAccessReviews."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient

from app.engine.context import ObjectRef, ParentUnavailable
from app.logs import JsonFormatter
from app.settings import Settings
from app.source.static import StaticSource
from app.webhook.server import NOT_SYNCED, create_app
from tests.support import binding, make_access_review, role, rule

TEAM_A = {"configmaps": {"team": ["a"], "env": ["dev", "staging-*"]}}

RBAC = [
    # alice: two restricted roles in t1 (team a with env limits; team b).
    role("team-a", "t1", [rule("get list watch deletecollection", "configmaps")], TEAM_A),
    role("team-b", "t1", [rule("get list watch", "configmaps")], {"configmaps": {"team": ["b"]}}),
    binding("alice-a", "team-a", "User:alice", namespace="t1"),
    binding("alice-b", "team-b", "User:alice", namespace="t1"),
    # carol: unrestricted reader in t1.
    role("reader", "t1", [rule("get list watch", "configmaps")]),
    binding("carol", "reader", "User:carol", namespace="t1"),
    # dave: restricted cluster-wide; erin: the same ClusterRole, but only inside t1.
    role("cluster-a", "", [rule("get list watch", "configmaps")], {"configmaps": {"team": ["a"]}}),
    binding("dave", "cluster-a", "User:dave"),
    binding("erin", "cluster-a", "User:erin", namespace="t1", role_kind="ClusterRole"),
    # frank: a role with an invalid annotation grants nothing through the webhook.
    role("broken", "t1", [rule("get list", "configmaps")], "{not json"),
    binding("frank", "broken", "User:frank", namespace="t1"),
    # gina: pods restricted; the pods entry covers pods/log.
    role("pods-a", "t1", [rule("get list", "pods pods/log")], {"pods": {"team": ["a"]}}),
    binding("gina", "pods-a", "User:gina", namespace="t1"),
    # tina: a tenant of t2 holding everything there, every resource limited to team a; and a
    # ClusterRole letting her act as anyone, limited the same way.
    # (Constrained impersonation asks for identities in the group authentication.k8s.io.)
    role(
        "tenant",
        "t2",
        [rule("*", "*"), rule("*", "serviceaccounts", "authentication.k8s.io")],
        {"*": {"team": ["a"]}},
    ),
    binding("tina", "tenant", "User:tina", namespace="t2"),
    role(
        "act-as",
        "",
        [
            rule("impersonate", "users groups"),
            rule(
                "impersonate impersonate:user-info",
                "users groups uids userextras/scopes",
                "authentication.k8s.io",
            ),
            rule(
                "impersonate:arbitrary-node impersonate:associated-node",
                "nodes",
                "authentication.k8s.io",
            ),
            rule("approve sign", "signers", "certificates.k8s.io"),
        ],
        {"*": {"team": ["a"]}},
    ),
    binding("tina-act-as", "act-as", "User:tina"),
    # ian: the same verbs without a label restriction (an admin's delegate).
    role("act-as-anyone", "", [rule("impersonate", "users groups serviceaccounts")]),
    binding("ian", "act-as-anyone", "User:ian"),
    # sara: serviceaccounts are not in her annotation, yet she lends identities only within it.
    role("cm-only", "t2", [rule("*", "*")], {"configmaps": {"team": ["a"]}}),
    binding("sara", "cm-only", "User:sara", namespace="t2"),
]

OBJECTS = {
    ("configmaps", "t1", "cm-a"): {"team": "a", "env": "dev"},
    ("configmaps", "t1", "cm-b"): {"team": "b"},
    ("configmaps", "t1", "cm-none"): {},
    ("pods", "t1", "web-a"): {"team": "a"},
    ("pods", "t1", "web-b"): {"team": "b"},
    ("serviceaccounts", "t2", "deployer-a"): {"team": "a"},
    ("serviceaccounts", "t2", "deployer-b"): {"team": "b"},
    ("serviceaccounts", "t2", "default"): {},
}


class Objects(StaticSource):
    """RBAC from files; object labels as a metadata-only lookup returns them."""

    def fetch_metadata(self, ref: ObjectRef) -> Mapping[str, Any]:
        labels = OBJECTS.get((ref.resource, ref.namespace, ref.name))
        if labels is None:
            raise ParentUnavailable(f"could not read {ref}: HTTP 404 NotFound")
        return {"metadata": {"name": ref.name, "namespace": ref.namespace, "labels": labels}}


MakeClient = Callable[..., FlaskClient]


@pytest.fixture
def make_client(tmp_path: Path) -> MakeClient:
    directory = tmp_path / "rbac"
    directory.mkdir()
    (directory / "rbac.json").write_text(
        json.dumps({"kind": "List", "items": [obj for _, obj in RBAC]})
    )

    def make(**settings: Any) -> FlaskClient:
        config = Settings(rbac_dir=directory, **settings)
        source = Objects(directory, config.compiler)
        source.start()
        app = create_app(config, source)
        app.config["TESTING"] = True
        return app.test_client()

    return make


@pytest.fixture
def client(make_client: MakeClient) -> FlaskClient:
    return make_client()


def status_of(client: FlaskClient, review: Any) -> dict[str, Any]:
    response = client.post("/authorize", json=review)
    assert response.status_code == 200, response.get_data(as_text=True)
    body = response.get_json()
    assert body["kind"] == "SubjectAccessReview"
    assert body["apiVersion"] == review["apiVersion"]
    assert body["status"]["allowed"] is False  # only ever narrows what RBAC decides
    return dict(body["status"])


def denied(status: Mapping[str, Any]) -> bool:
    return bool(status.get("denied"))


def lst(user: str, *selector: tuple[str, str, list[str]], namespace: str = "t1") -> Any:
    return make_access_review(
        user, "list", "configmaps", namespace=namespace, selector=list(selector)
    )


IN, NOT_IN, EXISTS, NOT_EXISTS = "In", "NotIn", "Exists", "DoesNotExist"


@pytest.mark.parametrize(
    ("review", "deny"),
    [
        pytest.param(lst("alice", ("team", IN, ["a"]), ("env", IN, ["dev"])), False, id="a+dev"),
        pytest.param(lst("alice", ("team", IN, ["a"])), True, id="a-without-env"),
        pytest.param(lst("alice", ("team", IN, ["b"])), False, id="b-by-the-second-role"),
        pytest.param(
            lst("alice", ("team", IN, ["a", "b"]), ("env", IN, ["dev"])),
            True,
            id="a-or-b-spans-two-roles",
        ),
        pytest.param(
            lst("alice", ("team", IN, ["a"]), ("env", IN, ["staging-1", "dev"])),
            False,
            id="glob-permits-literals-it-matches",
        ),
        pytest.param(
            lst("alice", ("team", IN, ["a"]), ("env", IN, ["prod"])), True, id="glob-not-matched"
        ),
        pytest.param(lst("alice", ("team", NOT_IN, ["a"])), True, id="notin-confines-nothing"),
        pytest.param(
            lst(
                "alice",
                ("team", EXISTS, []),
            ),
            True,
            id="exists-confines-nothing",
        ),
        pytest.param(lst("alice", ("team", NOT_EXISTS, [])), True, id="unlabeled-not-permitted"),
        pytest.param(
            lst("alice", ("team", IN, ["a", "b"]), ("team", IN, ["b", "c"])),
            False,
            id="two-terms-intersect-to-b",
        ),
        pytest.param(
            lst("alice", ("team", IN, ["b"]), ("team", NOT_IN, ["b"])),
            False,
            id="contradiction-matches-nothing",
        ),
        pytest.param(lst("alice"), True, id="no-selector"),
        pytest.param(lst("carol"), False, id="unrestricted-role"),
        pytest.param(lst("nobody"), False, id="no-granting-role"),
        pytest.param(lst("dave", ("team", IN, ["a"]), namespace=""), False, id="cluster-wide-a"),
        pytest.param(lst("dave", namespace=""), True, id="cluster-wide-no-selector"),
        pytest.param(
            lst("erin", namespace=""), False, id="cross-namespace-not-granted-by-rolebinding"
        ),
        pytest.param(lst("erin"), True, id="clusterrole-via-rolebinding-in-t1"),
        pytest.param(lst("frank", ("team", IN, ["a"])), True, id="invalid-annotation"),
    ],
)
def test_list_confinement(client: FlaskClient, review: Any, deny: bool) -> None:
    assert denied(status_of(client, review)) is deny


def test_watch_and_deletecollection_are_confined_like_list(client: FlaskClient) -> None:
    selector = [("team", IN, ["a"]), ("env", IN, ["dev"])]
    for verb in ("watch", "deletecollection"):
        ok = make_access_review("alice", verb, "configmaps", namespace="t1", selector=selector)
        bad = make_access_review("alice", verb, "configmaps", namespace="t1")
        assert not denied(status_of(client, ok)), verb
        assert denied(status_of(client, bad)), verb


def test_denial_says_what_to_add(client: FlaskClient) -> None:
    status = status_of(client, lst("dave", ("team", EXISTS, [])))
    assert status["reason"] == (
        'user "dave" may list configmaps in namespace "t1" only with a label selector within '
        "team in [a] (add -l team=a)"
    )
    status = status_of(client, lst("dave", namespace=""))
    assert status["reason"].startswith('user "dave" may list configmaps in all namespaces only')
    # Several roles: each alternative with its role; the suggestion comes from the first.
    status = status_of(client, lst("alice"))
    assert status["reason"] == (
        'user "alice" may list configmaps in namespace "t1" only with a label selector within '
        "team in [a] and env in [dev, staging-*] (role t1/team-a) or team in [b] "
        "(role t1/team-b) (add -l team=a,env=dev)"
    )


def test_unparseable_selector_is_no_selector(client: FlaskClient) -> None:
    review = make_access_review(
        "dave", "list", "configmaps", namespace="t1", raw_selector="team=a,,("
    )
    assert denied(status_of(client, review))


def test_unlabeled_objects_with_allow_unlabeled(make_client: MakeClient) -> None:
    client = make_client(allow_unlabeled=True)
    assert not denied(status_of(client, lst("dave", ("team", NOT_EXISTS, []))))
    get = make_access_review("dave", "get", "configmaps", namespace="t1", name="cm-none")
    assert not denied(status_of(client, get))


@pytest.mark.parametrize(
    ("user", "resource", "name", "reason"),
    [
        pytest.param("dave", "configmaps", "cm-a", None, id="own-bucket"),
        pytest.param(
            "dave",
            "configmaps",
            "cm-b",
            'user "dave" may not get configmaps "cm-b" in namespace "t1": the existing '
            'object\'s label team="b" is not permitted (clusterrole cluster-a allows team in [a])',
            id="other-bucket",
        ),
        pytest.param(
            "dave",
            "configmaps",
            "cm-none",
            'user "dave" may not get configmaps "cm-none" in namespace "t1": the existing object '
            "has no label team (clusterrole cluster-a allows team in [a])",
            id="unlabeled",
        ),
        pytest.param(
            "dave",
            "configmaps",
            "gone",
            'user "dave" may not get configmaps "gone" in namespace "t1": its labels cannot be '
            'checked (could not read configmaps "gone" in namespace "t1": HTTP 404 NotFound); '
            "only objects labeled team in [a] are permitted",
            id="unknown-object-is-never-revealed",
        ),
        pytest.param("alice", "configmaps", "cm-b", None, id="second-role-permits"),
        pytest.param("gina", "pods/log", "web-a", None, id="subresource-by-parent-labels"),
        pytest.param("gina", "pods/log", "web-b", 'team="b"', id="subresource-other-bucket"),
        pytest.param("carol", "configmaps", "gone", None, id="unrestricted-needs-no-lookup"),
    ],
)
def test_get_by_name(
    client: FlaskClient, user: str, resource: str, name: str, reason: str | None
) -> None:
    review = make_access_review(user, "get", resource, namespace="t1", name=name)
    status = status_of(client, review)
    if reason is None:
        assert status == {"allowed": False}
    else:
        assert status["denied"] is True
        assert reason in status["reason"]


def test_writes_and_non_resource_requests_have_no_opinion(client: FlaskClient) -> None:
    for verb in ("create", "update", "patch", "delete"):
        review = make_access_review("dave", verb, "configmaps", namespace="t1", name="cm-b")
        assert status_of(client, review) == {"allowed": False}, verb
    review = make_access_review("dave", "get", "configmaps")
    del review["spec"]["resourceAttributes"]
    review["spec"]["nonResourceAttributes"] = {"path": "/version", "verb": "get"}
    assert status_of(client, review) == {"allowed": False}


def test_reads_can_be_left_unrestricted_per_resource(make_client: MakeClient) -> None:
    client = make_client(unrestricted_reads=("configmaps",))
    assert status_of(client, lst("dave")) == {"allowed": False}
    pods = make_access_review("gina", "list", "pods", namespace="t1")
    assert denied(status_of(client, pods))  # only the named pattern is exempt


def test_v1beta1_spells_groups_as_group(tmp_path: Path) -> None:
    directory = tmp_path / "rbac"
    directory.mkdir()
    objects = [
        role("g", "t1", [rule("list", "configmaps")], {"configmaps": {"team": ["a"]}})[1],
        binding("g", "g", "Group:tenants", namespace="t1")[1],
    ]
    (directory / "rbac.json").write_text(json.dumps({"kind": "List", "items": objects}))
    source = StaticSource(directory, Settings().compiler)
    source.start()
    client = create_app(Settings(rbac_dir=directory), source).test_client()
    for version in ("authorization.k8s.io/v1beta1", "authorization.k8s.io/v1"):
        review = make_access_review(
            "zed", "list", "configmaps", groups=("tenants",), namespace="t1", api_version=version
        )
        assert denied(status_of(client, review)), version


def _spec(**attributes: Any) -> dict[str, Any]:
    review = make_access_review("alice", "list", "configmaps", namespace="t1")
    review["spec"]["resourceAttributes"].update(attributes)
    return review


@pytest.mark.parametrize(
    ("body", "error"),
    [
        pytest.param(b"{", "body is not valid JSON", id="not-json"),
        pytest.param([], "body must be a JSON object", id="array"),
        pytest.param({"kind": "AdmissionReview"}, "kind must be SubjectAccessReview", id="kind"),
        pytest.param(
            {"kind": "SubjectAccessReview", "apiVersion": "authorization.k8s.io/v2"},
            "apiVersion must be one of",
            id="version",
        ),
        pytest.param(
            {"kind": "SubjectAccessReview", "apiVersion": "authorization.k8s.io/v1"},
            "spec must be an object",
            id="no-spec",
        ),
        pytest.param(
            {
                "kind": "SubjectAccessReview",
                "apiVersion": "authorization.k8s.io/v1",
                "spec": {"user": "alice"},
            },
            "exactly one of resourceAttributes and nonResourceAttributes",
            id="no-attributes",
        ),
        pytest.param(_spec(verb=7), "resourceAttributes.verb must be a string", id="verb-type"),
        pytest.param(_spec(verb=""), "needs a verb and a resource", id="verb-empty"),
        pytest.param(
            _spec(labelSelector={"requirements": [{"key": "team", "operator": "Near"}]}),
            "unknown selector operator",
            id="operator",
        ),
        pytest.param(
            _spec(labelSelector={"requirements": "team=a"}),
            "requirements must be a list of objects",
            id="requirements-type",
        ),
        pytest.param(
            _spec(fieldSelector={"requirements": [{"key": "", "operator": "In"}]}),
            "needs a key",
            id="field-key",
        ),
    ],
)
def test_malformed_bodies_are_400(client: FlaskClient, body: Any, error: str) -> None:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = client.post("/authorize", data=data, content_type="application/json")
    assert response.status_code == 400
    payload = response.get_json()
    assert payload["code"] == 400 and error in payload["error"], payload


def test_groups_must_be_strings(client: FlaskClient) -> None:
    review = lst("alice")
    review["spec"]["groups"] = ["tenants", 3]
    assert client.post("/authorize", json=review).status_code == 400


class Unsynced(StaticSource):
    def start(self) -> None:
        pass


def test_not_synced_denies_rather_than_erroring(tmp_path: Path) -> None:
    source = Unsynced(tmp_path, Settings().compiler)
    client = create_app(Settings(rbac_dir=tmp_path), source).test_client()
    status = status_of(client, lst("alice"))
    assert status == {"allowed": False, "denied": True, "reason": NOT_SYNCED}


def test_each_answer_is_logged_as_one_line(
    client: FlaskClient, caplog: pytest.LogCaptureFixture
) -> None:
    review = lst("alice", ("team", IN, ["a"]))
    with caplog.at_level(logging.INFO, logger="label_rbac"):
        status_of(client, review)
    lines = [r for r in caplog.records if r.name == "label_rbac.decisions"]
    assert len(lines) == 1
    record = json.loads(JsonFormatter().format(lines[0]))
    assert {
        k: v for k, v in record.items() if k not in ("ms", "time", "level", "msg", "logger")
    } == {
        "user": "alice",
        "verb": "list",
        "resource": "configmaps",
        "namespace": "t1",
        "name": "",
        "selector": "team=a",
        "verdict": "Deny",
        "reason": "SelectorNotWithinLabels",
        "message": record["message"],
    }
    assert record["message"].startswith('user "alice" may list configmaps')


# -- Acting as another subject --------------------------------------------------------------------
# As kube-apiserver v1.36 asks (recorded): one review per impersonated attribute, ServiceAccounts
# by namespace and name, the other identities by name; legacy impersonation in the group "",
# constrained impersonation (impersonate:<mode>) in authentication.k8s.io.


def act_as(user: str, verb: str, resource: str, name: str, namespace: str = "") -> Any:
    return make_access_review(user, verb, resource, namespace=namespace, name=name)


IMPERSONATE = [
    pytest.param("impersonate", "serviceaccounts", id="legacy"),
    pytest.param("impersonate:serviceaccount", "serviceaccounts.authentication.k8s.io", id="mode"),
]


@pytest.mark.parametrize(("verb", "resource"), IMPERSONATE)
@pytest.mark.parametrize(
    ("name", "reason"),
    [
        pytest.param("deployer-a", None, id="own-bucket"),
        pytest.param(
            "deployer-b",
            'user "tina" may not {verb} {resource} "deployer-b" in namespace "t2": the '
            'existing object\'s label team="b" is not permitted; it may {verb} only '
            "ServiceAccounts labeled team in [a] (role t2/tenant)",
            id="other-bucket",
        ),
        pytest.param(
            "default",
            'user "tina" may not {verb} {resource} "default" in namespace "t2": the existing '
            "object has no label team; it may {verb} only ServiceAccounts labeled team in [a] "
            "(role t2/tenant)",
            id="unlabeled",
        ),
        pytest.param(
            "ghost",
            'user "tina" may not {verb} {resource} "ghost" in namespace "t2": its labels '
            'cannot be checked (could not read serviceaccounts "ghost" in namespace "t2": HTTP 404 '
            "NotFound); only objects labeled team in [a] are permitted",
            id="unknown-fails-closed",
        ),
    ],
)
def test_impersonating_a_service_account_is_judged_by_its_labels(
    client: FlaskClient, verb: str, resource: str, name: str, reason: str | None
) -> None:
    status = status_of(client, act_as("tina", verb, resource, name, "t2"))
    if reason is None:
        assert status == {"allowed": False}
    else:
        expected = reason.format(verb=verb, resource=resource)
        assert status == {"allowed": False, "denied": True, "reason": expected}


LABELLESS = [
    pytest.param("impersonate", "users", "admin", id="user"),
    pytest.param(
        "impersonate:user-info", "users.authentication.k8s.io", "admin", id="user-constrained"
    ),
    pytest.param(
        "impersonate:user-info", "groups.authentication.k8s.io", "g1", id="group-constrained"
    ),
    pytest.param("impersonate", "groups", "system:masters", id="group"),
    pytest.param("impersonate", "uids.authentication.k8s.io", "1234", id="uid"),
    pytest.param("impersonate", "userextras.authentication.k8s.io/scopes", "view", id="extra"),
    pytest.param("impersonate:arbitrary-node", "nodes.authentication.k8s.io", "node1", id="node"),
    pytest.param(
        "impersonate:associated-node", "nodes.authentication.k8s.io", "*", id="associated-node"
    ),
    pytest.param(
        "approve",
        "signers.certificates.k8s.io",
        "kubernetes.io/kube-apiserver-client",
        id="approve",
    ),
    pytest.param(
        "sign", "signers.certificates.k8s.io", "kubernetes.io/kube-apiserver-client", id="sign"
    ),
]


@pytest.mark.parametrize(("verb", "resource", "name"), LABELLESS)
def test_identities_without_labels_need_an_unrestricted_grant(
    client: FlaskClient, verb: str, resource: str, name: str
) -> None:
    status = status_of(client, act_as("tina", verb, resource, name))
    assert status["denied"] is True
    assert status["reason"].startswith(f'user "tina" may not {verb} ')
    assert status["reason"].endswith(
        "carry no labels, so only a role without a permission annotation lends them; a "
        "label-restricted role lends only ServiceAccounts labeled team in [a] "
        "(clusterrole act-as)"
    )


@pytest.mark.parametrize(
    ("user", "resource", "name", "namespace"),
    [
        pytest.param("ian", "users", "admin", "", id="unrestricted-user"),
        pytest.param("ian", "serviceaccounts", "ghost", "t2", id="unrestricted-needs-no-lookup"),
        pytest.param("zed", "users", "admin", "", id="no-grant-left-to-rbac"),
    ],
)
def test_unrestricted_or_absent_grants_are_rbacs(
    client: FlaskClient, user: str, resource: str, name: str, namespace: str
) -> None:
    review = act_as(user, "impersonate", resource, name, namespace)
    assert status_of(client, review) == {"allowed": False}


def test_lending_verbs_ignore_unrestricted_reads(make_client: MakeClient) -> None:
    # --unrestricted-reads switches off label-scoped reads, not impersonation.
    client = make_client(unrestricted_reads=("*",))
    review = act_as("tina", "impersonate", "serviceaccounts", "deployer-b", "t2")
    assert denied(status_of(client, review))
