"""The node authorizer's manifests (manifests/node-authorizer/): the AuthorizationConfiguration
without the in-tree Node authorizer, whose matchConditions are evaluated as CEL (cel-python)
against the recorded SubjectAccessReviews, and RBAC's fixed node policy bound to the nodes."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from app.engine.model import IDENTITY_VERBS
from app.source.static import read_manifests
from tests.cel import reaches_authorizer
from tests.support import ACCESS_REVIEWS, ROOT, make_access_review
from tests.test_authorization_manifests import IDENTITIES
from tests.test_authorization_manifests import REACHING as TENANT_REACHING

NODE_AUTHZ = ROOT / "manifests" / "node-authorizer"
CONFIG = yaml.safe_load((NODE_AUTHZ / "authorization-config.yaml").read_text())
DEFAULT = yaml.safe_load((ROOT / "manifests/authorization/authorization-config.yaml").read_text())
(WEBHOOK,) = [a for a in CONFIG["authorizers"] if a["type"] == "Webhook"]
STEMS = sorted(p.stem for p in ACCESS_REVIEWS.glob("c*.json"))
NODES = ("system:nodes",)


def reaches_webhook(spec: dict[str, Any]) -> bool:
    return reaches_authorizer(WEBHOOK, spec)


def test_label_rbac_replaces_the_node_authorizer_before_rbac() -> None:
    assert CONFIG["kind"] == "AuthorizationConfiguration"
    assert [a["type"] for a in CONFIG["authorizers"]] == ["Webhook", "RBAC"]
    webhook, default = (
        WEBHOOK["webhook"],
        next(a["webhook"] for a in DEFAULT["authorizers"] if a["type"] == "Webhook"),
    )
    assert webhook["failurePolicy"] == "Deny"
    for key in ("authorizedTTL", "unauthorizedTTL", "timeout", "connectionInfo"):
        assert webhook[key] == default[key], key


# The recorded kubelet requests the node authorizer narrows; its Node reads and pod status
# writes go to RBAC (so an outage of the webhook does not stop nodes from reporting).
NODE_REACHING = {
    "c039-node-get-secrets",
    "c040-node-get-secrets",
    "c041-node-get-configmaps",
    "c042-node-list-pods",
    "c043-node-list-pods",
    "c049-node-create-serviceaccounts-token",
}


@pytest.mark.parametrize("stem", STEMS)
def test_recorded_requests_reaching_the_webhook(stem: str) -> None:
    spec = json.loads((ACCESS_REVIEWS / f"{stem}.json").read_text())["spec"]
    assert reaches_webhook(spec) is (stem in NODE_REACHING | TENANT_REACHING)


@pytest.mark.parametrize(
    ("verb", "resource", "namespace", "reaches"),
    [
        pytest.param("get", "persistentvolumeclaims", "t1", True, id="claim"),
        pytest.param("patch", "persistentvolumeclaims/status", "t1", True, id="claim-status"),
        pytest.param("get", "persistentvolumes", "", True, id="pv"),
        pytest.param("get", "volumeattachments.storage.k8s.io", "", True, id="attachment"),
        pytest.param("get", "resourceclaims.resource.k8s.io", "t1", True, id="resource-claim"),
        pytest.param("update", "leases.coordination.k8s.io", "kube-node-lease", False, id="lease"),
        pytest.param("patch", "nodes/status", "", False, id="node-status"),
        pytest.param("create", "pods", "t1", False, id="mirror-pod"),
        pytest.param("create", "events", "t1", False, id="event"),
    ],
)
def test_which_kubelet_requests_reach_the_webhook(
    verb: str, resource: str, namespace: str, reaches: bool
) -> None:
    review = make_access_review(
        "system:node:node1", verb, resource, groups=NODES, namespace=namespace, name="x"
    )
    assert reaches_webhook(review["spec"]) is reaches


def test_rbac_binds_the_fixed_node_policy_to_the_nodes() -> None:
    objects = {
        obj["metadata"]["name"]: obj
        for kind, obj in read_manifests(NODE_AUTHZ)
        if kind == "ClusterRoleBinding"
    }
    binding = objects["label-rbac-system-node"]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "system:node",
    }
    assert binding["subjects"] == [
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:nodes"}
    ]


@pytest.mark.parametrize("verb", sorted(IDENTITY_VERBS))
@pytest.mark.parametrize(("resource", "namespace", "name"), IDENTITIES)
def test_tenants_acting_as_another_subject_reach_the_webhook(
    verb: str, resource: str, namespace: str, name: str
) -> None:
    review = make_access_review("alice", verb, resource, namespace=namespace, name=name)
    assert reaches_webhook(review["spec"])
