"""The shipped manifests: they parse, reference each other consistently, and fail closed."""

from __future__ import annotations

from typing import Any

import yaml

from app.source.static import read_manifests
from tests.support import ROOT

DEPLOY = ROOT / "manifests" / "deploy"


def deploy_objects() -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (kind, obj["metadata"]["name"]): dict(obj)
        for kind, obj in read_manifests(DEPLOY)
        if kind != "Kustomization"
    }


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    listed = set(kustomization["resources"])
    present = {p.name for p in DEPLOY.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == present


def test_webhook_fails_closed_and_points_at_the_service() -> None:
    objects = deploy_objects()
    (webhook,) = objects[("ValidatingWebhookConfiguration", "label-rbac")]["webhooks"]
    assert webhook["failurePolicy"] == "Fail"
    assert webhook["sideEffects"] == "None"
    assert "v1" in webhook["admissionReviewVersions"]
    assert set(webhook["rules"][0]["operations"]) == {"CREATE", "UPDATE", "DELETE", "CONNECT"}
    service = webhook["clientConfig"]["service"]
    assert service["path"] == "/validate"
    assert ("Service", service["name"]) in objects
    # The webhook never judges its own namespace, so it can always be repaired.
    (expression,) = webhook["namespaceSelector"]["matchExpressions"]
    assert expression["operator"] == "NotIn" and service["namespace"] in expression["values"]


def test_serving_certificate_matches_service_and_secret() -> None:
    objects = deploy_objects()
    cert = objects[("Certificate", "label-rbac-serving")]["spec"]
    assert "label-rbac.label-rbac.svc" in cert["dnsNames"]
    annotations = objects[("ValidatingWebhookConfiguration", "label-rbac")]["metadata"]
    assert annotations["annotations"]["cert-manager.io/inject-ca-from"] == (
        "label-rbac/label-rbac-serving"
    )
    pod = objects[("Deployment", "label-rbac")]["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "tls"]
    assert volume["secret"]["secretName"] == cert["secretName"]
    assert pod["serviceAccountName"] == "label-rbac"


def test_webhook_service_account_may_only_read() -> None:
    objects = deploy_objects()
    role = objects[("ClusterRole", "label-rbac")]
    verbs = {verb for rule in role["rules"] for verb in rule["verbs"]}
    assert verbs <= {"get", "list", "watch"}, verbs
    binding = objects[("ClusterRoleBinding", "label-rbac")]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "label-rbac", "namespace": "label-rbac"}
    ]
