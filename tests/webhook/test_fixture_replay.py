"""Replay every recorded run-"a" AdmissionReview through the Flask app, against the RBAC of the
recorded scenario, and check each decision against what the rules say it must be.

The scenario's RBAC is the recorded one: the bootstrap ClusterRoles and ClusterRoleBindings as the
API server listed them (cluster-admin for ``system:masters``; ``system:node`` with no subjects,
since kubelets are authorized by the Node authorizer), the Namespaces, and the Akraino Role
``default/create-intent`` and RoleBinding ``default/alice-create-intent`` exactly as a001/a002
created them. a023 later widens the Role's annotation, so a024 runs against a023's object.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient

from app.engine.decide import PRE_CHECKS
from app.engine.model import Decision, Request
from app.settings import Settings
from app.source.static import StaticSource
from app.webhook.server import create_app
from tests.support import API, REVIEWS, load_review

SETTINGS = Settings(
    annotation_keys=("labelrbac.io/permissions", "sdewan-bucket-type-permission"),
    default_label_key="sdewan-bucket-type",
)
MIRROR_KEYS = "node.kubernetes.io/mirror.allowed-label-keys"

RUN_A = sorted(path.stem for path in REVIEWS.glob("a0*.json"))

# Whether the node rules (NodeRestriction as a webhook) run before the label rule. Without them
# the label engine alone decides node requests; the expectations below follow from each rule set.
NODE_RULES = any(getattr(check, "__name__", "") == "check_node" for check in PRE_CHECKS)

ROLE_BEFORE_A023 = "before-a023"
ROLE_AFTER_A023 = "after-a023"


# --- The scenario ------------------------------------------------------------------------------


def _run_a_namespaces() -> dict[str, Any]:
    """The recorded Namespaces as they were during run "a".

    The list was captured after run "b", whose b001 annotated kube-system with the mirror-pod
    allowed label keys; in run "a" kube-system carried no such annotation.
    """
    namespaces = json.loads((API / "list-namespaces.json").read_text())
    for item in namespaces["items"]:
        (item["metadata"].get("annotations") or {}).pop(MIRROR_KEYS, None)
    return namespaces


def _write_scenario(directory: Path, role: Mapping[str, Any]) -> Path:
    directory.mkdir()
    for name in ("list-clusterroles.json", "list-clusterrolebindings.json"):
        (directory / name).write_text((API / name).read_text())
    (directory / "namespaces.json").write_text(json.dumps(_run_a_namespaces()))
    (directory / "role.json").write_text(json.dumps(role))
    binding = load_review("a002-create-rolebindings")["request"]["object"]
    (directory / "rolebinding.json").write_text(json.dumps(binding))
    return directory


class RecordingSource(StaticSource):
    """The static source, noting every parent lookup (which still fails: no cluster access)."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory, SETTINGS.compiler)
        self.lookups: list[Request] = []

    def fetch_parent(self, request: Request) -> Mapping[str, Any]:
        self.lookups.append(request)
        return super().fetch_parent(request)


class ClusterSource(RecordingSource):
    """The same RBAC with cluster access: parents are the objects the recording created."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        pod = load_review("a017-create-pods")["request"]["object"]  # default/app on node1
        self.objects = {("pods", "default", "app"): pod}

    def fetch_parent(self, request: Request) -> Mapping[str, Any]:
        self.lookups.append(request)
        return self.objects[(request.resource.resource, request.namespace, request.name)]


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("scenario")
    before = load_review("a001-create-roles")["request"]["object"]
    after = load_review("a023-update-roles")["request"]["object"]
    assert json.loads(before["metadata"]["annotations"]["sdewan-bucket-type-permission"]) == {
        "mwan3policies": ["app-intent"]
    }
    return {
        ROLE_BEFORE_A023: _write_scenario(root / ROLE_BEFORE_A023, before),
        ROLE_AFTER_A023: _write_scenario(root / ROLE_AFTER_A023, after),
    }


@dataclass
class Webhook:
    client: FlaskClient
    source: RecordingSource
    decisions: list[Decision]

    def review(self, document: Mapping[str, Any]) -> dict[str, Any]:
        response = self.client.post("/validate", json=document)
        assert response.status_code == 200, response.get_data(as_text=True)
        return response.get_json()


def _webhook(source: RecordingSource) -> Webhook:
    source.start()
    decisions: list[Decision] = []
    app = create_app(SETTINGS, source, observers=(lambda _r, d, _s: decisions.append(d),))
    app.config["TESTING"] = True
    return Webhook(app.test_client(), source, decisions)


@pytest.fixture(scope="module")
def webhooks(scenario: dict[str, Path]) -> dict[str, Webhook]:
    return {state: _webhook(RecordingSource(path)) for state, path in scenario.items()}


def role_state(stem: str) -> str:
    """Which version of the Role was stored when the review was sent."""
    return ROLE_AFTER_A023 if stem > "a023" else ROLE_BEFORE_A023


# --- The expectations -----------------------------------------------------------------------------

RULE = "(role default/create-intent allows sdewan-bucket-type in [app-intent])"
MWAN3 = "mwan3policies.batch.sdewan.akraino.org"


@dataclass(frozen=True)
class Row:
    allowed: bool
    reason: str  # the engine's reason, seen through the decision observer
    why: str
    message: str = ""  # exact denial message, when the label rule denies
    contains: tuple[str, ...] = ()  # fragments, when another rule set words the denial


def _node_rows() -> dict[str, Row]:
    if not NODE_RULES:
        why = (
            "node1 is bound to nothing (the bootstrap system:node ClusterRoleBinding has no "
            "subjects; kubelets are authorized by the Node authorizer), so no role grants this "
            "and the label rule leaves it to RBAC"
        )
        return {
            "a015-create-nodes": Row(True, "NoGrantingRole", why),
            "a016-create-pods": Row(True, "NoGrantingRole", why),
            "a018-create-pods-eviction": Row(True, "NoGrantingRole", why),
        }
    return {
        "a015-create-nodes": Row(
            True,
            "NoGrantingRole",
            "node1 creates its own Node with kubernetes.io/hostname (a kubelet label) and an "
            "unprefixed label; the node rules allow it and no role restricts it",
        ),
        "a016-create-pods": Row(
            False,
            "NodeRestriction",
            "a mirror pod may carry only label keys its namespace allows; in run a kube-system "
            "has no allowed-label-keys annotation, so labels component and k8s-app are refused",
            contains=('node "node1"', "mirror pods", "component, k8s-app", '"kube-system"'),
        ),
        "a018-create-pods-eviction": Row(
            False,
            "ParentUnavailable",
            "a node may evict only pods bound to it; the Eviction does not say where the pod "
            "runs and the static source cannot read pod default/app, so it fails closed",
            contains=('node "node1" can only evict pods with spec.nodeName set to itself',),
        ),
    }


ADMIN = "admin is in system:masters, bound to cluster-admin, which carries no annotation"

EXPECTED: dict[str, Row] = {
    "a001-create-roles": Row(
        True,
        "Unrestricted",
        f"{ADMIN}; the Role's annotation is valid with the default label key configured",
    ),
    "a002-create-rolebindings": Row(True, "Unrestricted", ADMIN),
    "a003-create-mwan3policies": Row(
        True,
        "LabelsPermitted",
        "alice's only granting role is create-intent; app-intent is the permitted bucket",
    ),
    "a004-create-mwan3policies": Row(
        False,
        "LabelNotPermitted",
        "k8s-service is not in create-intent's list for mwan3policies",
        message=(
            f'user "alice" may not create {MWAN3} "p2" in namespace "default": '
            f'label sdewan-bucket-type="k8s-service" is not permitted {RULE}'
        ),
    ),
    "a005-update-mwan3policies": Row(
        False,
        "LabelNotPermitted",
        "the PATCH arrives as UPDATE: the old labels are permitted, the new k8s-service is not",
        message=(
            f'user "alice" may not update {MWAN3} "p1" in namespace "default": '
            f'label sdewan-bucket-type="k8s-service" is not permitted {RULE}'
        ),
    ),
    "a006-delete-mwan3policies": Row(
        False,
        "LabelNotPermitted",
        "DELETE judges oldObject (object is null): p2 is labelled k8s-service",
        message=(
            f'user "alice" may not delete {MWAN3} "p2" in namespace "default": '
            'the existing object\'s label sdewan-bucket-type="k8s-service" is not permitted '
            f"{RULE}"
        ),
    ),
    "a007-create-configmaps": Row(
        True,
        "Unrestricted",
        "create-intent grants configmaps * and its annotation has no entry for configmaps",
    ),
    "a008-update-configmaps": Row(True, "Unrestricted", "as a007: configmaps are unrestricted"),
    "a009-create-configmaps": Row(
        True, "Unrestricted", "a server-side dry run is decided as the real create would be"
    ),
    "a010-create-configmaps": Row(True, "Unrestricted", "as a007"),
    "a011-update-configmaps": Row(True, "Unrestricted", "as a008"),
    "a012-delete-configmaps": Row(True, "Unrestricted", f"{ADMIN} (one DELETE per object)"),
    "a013-delete-configmaps": Row(True, "Unrestricted", f"{ADMIN} (one DELETE per object)"),
    "a014-create-nodes": Row(True, "Unrestricted", ADMIN),
    "a017-create-pods": Row(True, "Unrestricted", ADMIN),
    "a019-connect-pods-exec": Row(
        True,
        "Unrestricted",
        f"{ADMIN}: an unrestricted grant needs no parent lookup, even for CONNECT",
    ),
    "a020-connect-pods-exec": Row(True, "Unrestricted", "as a019"),
    "a021-create-deployments": Row(True, "Unrestricted", ADMIN),
    "a022-update-deployments": Row(True, "Unrestricted", ADMIN),
    "a023-update-roles": Row(
        True, "Unrestricted", f"{ADMIN}; the widened annotation mwan3* is valid"
    ),
    "a024-delete-mwan3policies": Row(
        True, "Unrestricted", f"{ADMIN}; replayed against the Role as a023 left it"
    ),
    **_node_rows(),
}


# --- The replay -----------------------------------------------------------------------------------


def test_every_recorded_review_has_an_expectation() -> None:
    assert len(RUN_A) == 24
    assert sorted(EXPECTED) == RUN_A


@pytest.mark.parametrize("stem", RUN_A)
def test_replay(stem: str, webhooks: dict[str, Webhook]) -> None:
    row = EXPECTED[stem]
    webhook = webhooks[role_state(stem)]
    document = load_review(stem)
    seen = len(webhook.decisions)

    body = webhook.review(document)

    assert body["apiVersion"] == document["apiVersion"]
    assert body["kind"] == "AdmissionReview"
    response = body["response"]
    assert response["uid"] == document["request"]["uid"]
    assert response["allowed"] is row.allowed, (row.why, response)
    (decision,) = webhook.decisions[seen:]
    assert decision.reason == row.reason, (row.why, decision)
    if row.allowed:
        assert "status" not in response
    else:
        status = response["status"]
        assert (status["code"], status["reason"], status["status"]) == (403, "Forbidden", "Failure")
        if row.message:
            assert status["message"] == row.message
        for fragment in row.contains:
            assert fragment in status["message"]


def test_admin_exec_needs_no_lookup(webhooks: dict[str, Webhook]) -> None:
    webhook = webhooks[ROLE_BEFORE_A023]
    before = len(webhook.source.lookups)
    for stem in ("a019-connect-pods-exec", "a020-connect-pods-exec"):
        assert webhook.review(load_review(stem))["response"]["allowed"] is True
    assert webhook.source.lookups[before:] == []


@pytest.mark.parametrize(
    "stem", ["a009-create-configmaps", "a004-create-mwan3policies", "a003-create-mwan3policies"]
)
def test_dry_run_is_decided_like_the_real_request(stem: str, webhooks: dict[str, Webhook]) -> None:
    webhook = webhooks[ROLE_BEFORE_A023]
    dry, real = copy.deepcopy(load_review(stem)), copy.deepcopy(load_review(stem))
    dry["request"]["dryRun"], real["request"]["dryRun"] = True, False
    assert webhook.review(dry) == webhook.review(real)
    assert webhook.review(real)["response"]["allowed"] is EXPECTED[stem].allowed


def test_a009_matches_the_real_create_a010(webhooks: dict[str, Webhook]) -> None:
    # a009 (cm2, --dry-run=server) and a010 (cm3, real) are the same create by the same user.
    webhook = webhooks[ROLE_BEFORE_A023]
    dry = webhook.review(load_review("a009-create-configmaps"))["response"]
    real = webhook.review(load_review("a010-create-configmaps"))["response"]
    assert load_review("a009-create-configmaps")["request"]["dryRun"] is True
    assert {**dry, "uid": None} == {**real, "uid": None}


def test_widened_role_admits_what_the_first_refused(webhooks: dict[str, Webhook]) -> None:
    # The replay really reads the Role from the recording: after a023 widens it to
    # {"mwan3*": ["app-intent", "k8s-service"]}, a004-a006 are within alice's buckets.
    webhook = webhooks[ROLE_AFTER_A023]
    for stem in (
        "a004-create-mwan3policies",
        "a005-update-mwan3policies",
        "a006-delete-mwan3policies",
    ):
        assert webhook.review(load_review(stem))["response"]["allowed"] is True, stem
        assert webhook.decisions[-1].reason == "LabelsPermitted"


def test_group_subject_alone_restricts(scenario: dict[str, Path]) -> None:
    # bob is not named in the RoleBinding but is in group tenants: create-intent binds him too.
    bob = copy.deepcopy(load_review("a004-create-mwan3policies"))
    bob["request"]["userInfo"] = {"username": "bob", "groups": ["tenants", "system:authenticated"]}
    webhook = _webhook(RecordingSource(scenario[ROLE_BEFORE_A023]))
    response = webhook.review(bob)["response"]
    assert response["allowed"] is False
    assert response["status"]["message"].startswith('user "bob" may not create')
    # carol (auditors) is bound to nothing that grants writes: left to RBAC.
    carol = copy.deepcopy(bob)
    carol["request"]["userInfo"] = {"username": "carol", "groups": ["auditors"]}
    assert webhook.review(carol)["response"]["allowed"] is True
    assert webhook.decisions[-1].reason == "NoGrantingRole"


@pytest.mark.skipif(not NODE_RULES, reason="without node rules no lookup is made for a018")
def test_eviction_with_cluster_access(scenario: dict[str, Path]) -> None:
    # With the pod readable, node1 may evict default/app: a017 bound it to node1.
    webhook = _webhook(ClusterSource(scenario[ROLE_BEFORE_A023]))
    document = load_review("a018-create-pods-eviction")
    response = webhook.review(document)["response"]
    assert response == {"uid": document["request"]["uid"], "allowed": True}
    assert [(r.resource.resource, r.namespace, r.name) for r in webhook.source.lookups] == [
        ("pods", "default", "app")
    ]


def test_static_lookups_are_attempted_only_where_needed(scenario: dict[str, Path]) -> None:
    webhook = _webhook(RecordingSource(scenario[ROLE_BEFORE_A023]))
    for stem in RUN_A:
        if role_state(stem) == ROLE_BEFORE_A023:
            webhook.review(load_review(stem))
    looked_up = sorted({r.uid for r in webhook.source.lookups})
    expected = [load_review("a018-create-pods-eviction")["request"]["uid"]] if NODE_RULES else []
    assert looked_up == expected


def _iter_items(name: str) -> Iterator[Mapping[str, Any]]:
    yield from json.loads((API / name).read_text())["items"]


def test_scenario_rbac_is_the_recorded_bootstrap(webhooks: dict[str, Webhook]) -> None:
    snap = webhooks[ROLE_BEFORE_A023].source.snapshot()
    assert snap is not None
    cluster_roles = {item["metadata"]["name"] for item in _iter_items("list-clusterroles.json")}
    assert {ref.name for ref in snap.roles if not ref.namespace} == cluster_roles
    assert {str(ref) for ref in snap.roles if ref.namespace} == {"role default/create-intent"}
    assert set(snap.namespaces) == {"default", "kube-node-lease", "kube-public", "kube-system"}
    assert MIRROR_KEYS not in snap.namespaces["kube-system"]
    (role,) = [r for ref, r in snap.roles.items() if ref.namespace]
    assert role.error is None and role.permissions is not None
    assert role.permissions.annotation_key == "sdewan-bucket-type-permission"
