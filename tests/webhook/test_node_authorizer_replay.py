"""The recorded kubelet SubjectAccessReviews (kube-apiserver v1.35) through ``POST /authorize`` with
``--node-authorizer``, in static mode: the recording's RBAC and its pods from one manifest dir.

Pod ``t1/web-a`` is the one the API server stored (the ``oldObject`` of the recorded pods/status
update): on node1, secret volume ``s-ref``, envFrom configmap ``cm-a``, and no service account
(that recording ran without the ServiceAccount admission plugin, so the token request of c049 is
related to nothing, and the in-tree authorizer would refuse it too). ``t1/web-b`` is on node2.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient

from app.settings import Settings
from app.webhook.serve import make_source
from app.webhook.server import create_app
from tests.support import (
    ACCESS_REVIEWS,
    V135_RBAC,
    V135_REVIEWS,
    load_access_review,
    make_access_review,
    pod,
)

NO_RELATIONSHIP = "no relationship found between node 'node1' and this object"
ALLOW: dict[str, Any] = {"allowed": True}


def deny(reason: str) -> dict[str, Any]:
    return {"allowed": False, "denied": True, "reason": reason}


# Fixture → the status the webhook answers with the node authorizer on.
EXPECTED: dict[str, dict[str, Any]] = {
    "c039-node-get-secrets": ALLOW,
    "c040-node-get-secrets": deny(NO_RELATIONSHIP),
    "c041-node-get-configmaps": ALLOW,
    "c042-node-list-pods": ALLOW,
    "c043-node-list-pods": deny(
        "can only list/watch pods with spec.nodeName field selector "
        "(add --field-selector spec.nodeName=node1)"
    ),
    "c044-node-get-nodes": ALLOW,
    "c045-node-get-nodes": deny("node 'node1' cannot read 'node2', only its own Node object"),
    "c046-node-list-nodes": ALLOW,
    "c047-node-patch-pods-status": ALLOW,
    "c049-node-create-serviceaccounts-token": deny(NO_RELATIONSHIP),
    "c050-node-get-nonresource": {"allowed": False},
}


@pytest.fixture(scope="module")
def manifests(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("cluster")
    shutil.copy(V135_RBAC, directory / "rbac.yaml")
    stored = json.loads((V135_REVIEWS / "c048-node-update-pods-status.json").read_text())
    pods = {"kind": "List", "items": [stored["request"]["oldObject"], pod("web-b", node="node2")]}
    (directory / "pods.json").write_text(json.dumps(pods))
    return directory


def client(directory: Path, node_authorizer: bool) -> FlaskClient:
    settings = Settings(rbac_dir=directory, node_authorizer=node_authorizer)
    source = make_source(settings)
    source.start()
    app = create_app(settings, source)
    app.config["TESTING"] = True
    return app.test_client()


@pytest.fixture(scope="module")
def webhook(manifests: Path) -> FlaskClient:
    return client(manifests, node_authorizer=True)


def authorize(webhook: FlaskClient, document: dict[str, Any]) -> dict[str, Any]:
    response = webhook.post("/authorize", json=document)
    assert response.status_code == 200, response.get_data(as_text=True)
    body = response.get_json()
    assert body["kind"] == "SubjectAccessReview"
    return body["status"]


def test_every_recorded_node_review_has_an_expectation() -> None:
    assert sorted(EXPECTED) == sorted(p.stem for p in ACCESS_REVIEWS.glob("c*-node-*.json"))


@pytest.mark.parametrize("stem", sorted(EXPECTED))
def test_replay_node_review(stem: str, webhook: FlaskClient) -> None:
    assert authorize(webhook, load_access_review(stem)) == EXPECTED[stem]


def test_without_the_flag_the_node_reviews_are_left_to_rbac(manifests: Path) -> None:
    plain = client(manifests, node_authorizer=False)
    for stem in ("c039-node-get-secrets", "c040-node-get-secrets", "c043-node-list-pods"):
        assert authorize(plain, load_access_review(stem)) == {"allowed": False}, stem


def test_tenants_still_meet_the_label_rule(webhook: FlaskClient) -> None:
    status = authorize(webhook, load_access_review("c004-tenant-list-configmaps"))
    assert status["denied"] is True
    assert "only with a label selector within team in [a]" in status["reason"]


@pytest.mark.parametrize(
    ("user", "groups", "expected"),
    [
        pytest.param(
            "system:node:node2",
            ("system:nodes",),
            deny(NO_RELATIONSHIP.replace("node1", "node2")),
            id="other-node",
        ),
        pytest.param("system:node:node1", (), {"allowed": False}, id="not-in-system-nodes"),
        pytest.param(
            "system:node:",
            ("system:nodes",),
            deny('unknown node for user "system:node:"'),
            id="unnamed-node",
        ),
    ],
)
def test_only_the_referencing_node_reads_the_secret(
    webhook: FlaskClient, user: str, groups: tuple[str, ...], expected: dict[str, Any]
) -> None:
    document = make_access_review(
        user, "get", "secrets", groups=groups, namespace="t1", name="s-ref"
    )
    assert authorize(webhook, document) == expected
