"""The shipped AuthorizationConfiguration (manifests/authorization/): the chain, its failure and
caching settings, the webhook kubeconfig, and which recorded SubjectAccessReviews its
matchConditions let through to label-rbac, evaluated as CEL (cel-python) as the API server
evaluates them against the typed SubjectAccessReviewSpec."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml

from app.engine.model import AUTHORIZED_VERBS, IDENTITY_VERBS
from app.source.metadata import WATCHED_RESOURCES
from tests.cel import reaches_authorizer
from tests.support import ACCESS_REVIEWS, ROOT, make_access_review

AUTHZ = ROOT / "manifests" / "authorization"
CONFIG = yaml.safe_load((AUTHZ / "authorization-config.yaml").read_text())
KUBECONFIG = yaml.safe_load((AUTHZ / "authorization-webhook.kubeconfig").read_text())
(WEBHOOK,) = [a for a in CONFIG["authorizers"] if a["type"] == "Webhook"]
STEMS = sorted(p.stem for p in ACCESS_REVIEWS.glob("c*.json"))


def reaches_webhook(spec: dict[str, Any]) -> bool:
    return reaches_authorizer(WEBHOOK, spec)


def test_the_webhook_sits_between_node_and_rbac() -> None:
    assert CONFIG["apiVersion"] == "apiserver.config.k8s.io/v1"
    assert CONFIG["kind"] == "AuthorizationConfiguration"
    assert [a["type"] for a in CONFIG["authorizers"]] == ["Node", "Webhook", "RBAC"]
    webhook = WEBHOOK["webhook"]
    assert webhook["subjectAccessReviewVersion"] == "v1"
    assert webhook["matchConditionSubjectAccessReviewVersion"] == "v1"
    assert webhook["failurePolicy"] == "Deny"


def _seconds(duration: str) -> float:
    match = re.fullmatch(r"(\d+)(ms|s)", duration)
    assert match, duration
    return int(match[1]) / (1000 if match[2] == "ms" else 1)


def test_cached_answers_expire_within_about_a_second() -> None:
    webhook = WEBHOOK["webhook"]
    for ttl in ("authorizedTTL", "unauthorizedTTL"):
        assert 0 < _seconds(webhook[ttl]) <= 1, ttl
    # Longer than the webhook's own 2 s metadata lookup, shorter than the API server's default.
    assert 2 < _seconds(webhook["timeout"]) <= 30


def test_kubeconfig_points_at_authorize_with_the_served_certificate() -> None:
    assert WEBHOOK["webhook"]["connectionInfo"]["type"] == "KubeConfigFile"
    (cluster,) = KUBECONFIG["clusters"]
    assert cluster["cluster"]["server"].endswith("/authorize")
    certificates = yaml.safe_load_all((ROOT / "manifests/deploy/certificate.yaml").read_text())
    (serving,) = [
        c for c in certificates if c["kind"] == "Certificate" and not c["spec"].get("isCA")
    ]
    assert cluster["cluster"]["tls-server-name"] in serving["spec"]["dnsNames"]
    assert KUBECONFIG["current-context"] == KUBECONFIG["contexts"][0]["name"]


# The recorded requests the webhook must see: alice's reads of the resources her role restricts.
REACHING = {
    *(f"c{n:03d}-tenant-list-configmaps" for n in range(4, 12)),
    "c002-tenant-get-configmaps",
    "c003-tenant-get-configmaps",
    "c012-tenant-watch-configmaps",
    "c014-tenant-get-secrets",
    "c015-tenant-list-pods",
    "c016-tenant-get-pods",
    "c017-tenant-get-pods-log",
    "c018-tenant-deletecollection-configmaps",
    "c022-tenant-get-configmaps",
    "c029-tenant-list-configmaps",
    "c034-tenant-get-deployments",
}


@pytest.mark.parametrize("stem", STEMS)
def test_recorded_requests_reach_the_webhook_only_when_restrictable(stem: str) -> None:
    spec = json.loads((ACCESS_REVIEWS / f"{stem}.json").read_text())["spec"]
    assert reaches_webhook(spec) is (stem in REACHING)


@pytest.mark.parametrize(
    ("user", "groups", "reaches"),
    [
        pytest.param("alice", ("tenants",), True, id="tenant"),
        pytest.param("system:serviceaccount:t1:ci", (), True, id="tenant-service-account"),
        pytest.param("root", ("system:masters",), False, id="admin"),
        pytest.param("system:serviceaccount:label-rbac:label-rbac", (), False, id="itself"),
        pytest.param("system:serviceaccount:kube-system:coredns", (), False, id="kube-system"),
        pytest.param("system:kube-controller-manager", (), False, id="controller-manager"),
        pytest.param("system:node:node1", ("system:nodes",), False, id="node"),
    ],
)
def test_who_reaches_the_webhook(user: str, groups: tuple[str, ...], reaches: bool) -> None:
    review = make_access_review(user, "list", "secrets", groups=groups, namespace="t1")
    assert reaches_webhook(review["spec"]) is reaches


def test_the_restricted_resources_are_those_whose_labels_are_watched() -> None:
    # ServiceAccounts' labels are watched for the identity loans they decide (impersonation
    # here, token requests and pods through admission), not for label-scoped gets.
    loans = {("", "serviceaccounts")}
    for group, resource in WATCHED_RESOURCES - loans:
        name = f"{resource}.{group}" if group else resource
        review = make_access_review("alice", "get", name, namespace="t1", name="x")
        assert reaches_webhook(review["spec"]), name
    for _, resource in loans:
        review = make_access_review("alice", "impersonate", resource, namespace="t1", name="x")
        assert reaches_webhook(review["spec"]), resource
    other = make_access_review("alice", "get", "deployments.example.com", namespace="t1")
    assert not reaches_webhook(other["spec"])


def test_the_webhook_itself_is_kept_out() -> None:
    account = next(
        doc
        for doc in yaml.safe_load_all((ROOT / "manifests/deploy/rbac.yaml").read_text())
        if doc["kind"] == "ServiceAccount"
    )["metadata"]
    user = f"system:serviceaccount:{account['namespace']}:{account['name']}"
    expressions = " ".join(c["expression"] for c in WEBHOOK["webhook"]["matchConditions"])
    assert f"'{user}'" in expressions


# Impersonation as kube-apiserver authorizes it (one review per impersonated attribute; legacy in
# the group "", constrained modes in authentication.k8s.io), and the certificate verbs its CSR
# admission plugins check: (resource, namespace, name).
IDENTITIES = [
    pytest.param("serviceaccounts", "t1", "deployer-b", id="serviceaccount"),
    pytest.param(
        "serviceaccounts.authentication.k8s.io", "t1", "deployer-b", id="serviceaccount-mode"
    ),
    pytest.param("users", "", "admin", id="user"),
    pytest.param("users.authentication.k8s.io", "", "admin", id="user-mode"),
    pytest.param("groups", "", "system:masters", id="group"),
    pytest.param("uids.authentication.k8s.io", "", "1234", id="uid"),
    pytest.param("userextras.authentication.k8s.io/scopes", "", "view", id="userextra"),
    pytest.param("nodes.authentication.k8s.io", "", "node1", id="node"),
    pytest.param(
        "signers.certificates.k8s.io", "", "kubernetes.io/kube-apiserver-client", id="signer"
    ),
]


@pytest.mark.parametrize("verb", sorted(IDENTITY_VERBS))
@pytest.mark.parametrize(("resource", "namespace", "name"), IDENTITIES)
def test_acting_as_another_subject_reaches_the_webhook(
    verb: str, resource: str, namespace: str, name: str
) -> None:
    tenant = make_access_review("alice", verb, resource, namespace=namespace, name=name)
    assert reaches_webhook(tenant["spec"])
    admin = make_access_review(
        "root", verb, resource, groups=("system:masters",), namespace=namespace, name=name
    )
    assert not reaches_webhook(admin["spec"])


@pytest.mark.parametrize(
    "verb", ["create", "update", "bind", "escalate", "use", "impersonate-on:user-info:list"]
)
def test_verbs_judged_elsewhere_stay_out(verb: str) -> None:
    review = make_access_review("alice", verb, "users", name="admin")
    assert not reaches_webhook(review["spec"])


def test_the_routed_verbs_are_those_authorize_judges() -> None:
    """The conditions name exactly the verbs /authorize judges, so none is routed in vain or
    forgotten."""
    expressions = " ".join(c["expression"] for c in WEBHOOK["webhook"]["matchConditions"])
    quoted = set(re.findall(r"'([a-z:-]+)'", expressions))
    verbs = {word for word in quoted if word in AUTHORIZED_VERBS or word.startswith("impersonate")}
    assert verbs == AUTHORIZED_VERBS
