"""The pod-references walker: every field that names an API object, in every kind of container."""

from __future__ import annotations

from typing import Any

import pytest

from app.engine.podrefs import (
    CLUSTER_TRUST_BUNDLES,
    CONFIGMAPS,
    CSI_VOLUMES,
    EPHEMERAL_VOLUMES,
    PERSISTENT_VOLUME_CLAIMS,
    RESOURCE_CLAIM_TEMPLATES,
    RESOURCE_CLAIMS,
    SECRETS,
    SERVICE_ACCOUNT_TOKEN,
    SERVICE_ACCOUNTS,
    PodRef,
    pod_references,
)
from tests.support import load_review


def volume(**source: Any) -> dict[str, Any]:
    return {"spec": {"volumes": [{"name": "v", **source}]}}


def projected(**source: Any) -> dict[str, Any]:
    return volume(projected={"sources": [source]})


def container(field: str = "containers", **fields: Any) -> dict[str, Any]:
    return {"spec": {field: [{"name": "c", "image": "nginx", **fields}]}}


def env_from(ref: str, name: str) -> list[dict[str, Any]]:
    return [{"name": "X", "valueFrom": {ref: {"name": name, "key": "k"}}}]


CASES = [
    pytest.param({"spec": {}}, set(), id="nothing"),
    pytest.param({"spec": {"serviceAccountName": "bot"}}, {(SERVICE_ACCOUNTS, "bot")}, id="sa"),
    pytest.param(
        {"spec": {"serviceAccount": "old"}}, {(SERVICE_ACCOUNTS, "old")}, id="sa-deprecated"
    ),
    pytest.param(
        {"spec": {"imagePullSecrets": [{"name": "reg"}, {}]}},
        {(SECRETS, "reg"), (SECRETS, "")},
        id="image-pull-secrets",
    ),
    pytest.param(volume(secret={"secretName": "s"}), {(SECRETS, "s")}, id="secret-volume"),
    pytest.param(volume(secret={}), {(SECRETS, "")}, id="secret-volume-unnamed"),
    pytest.param(
        volume(azureFile={"secretName": "az", "shareName": "x"}), {(SECRETS, "az")}, id="azure"
    ),
    *(
        pytest.param(
            volume(**{plugin: {"secretRef": {"name": "sr"}}}), {(SECRETS, "sr")}, id=plugin
        )
        for plugin in ("cephfs", "cinder", "flexVolume", "iscsi", "rbd", "scaleIO", "storageos")
    ),
    pytest.param(volume(rbd={"image": "i"}), set(), id="rbd-without-secret"),
    pytest.param(
        volume(csi={"driver": "d", "nodePublishSecretRef": {"name": "np"}}),
        {(SECRETS, "np"), (CSI_VOLUMES, "d")},
        id="csi-with-secret",
    ),
    pytest.param(volume(configMap={"name": "cm"}), {(CONFIGMAPS, "cm")}, id="configmap-volume"),
    pytest.param(
        volume(persistentVolumeClaim={"claimName": "data"}),
        {(PERSISTENT_VOLUME_CLAIMS, "data")},
        id="pvc",
    ),
    pytest.param(
        volume(ephemeral={"volumeClaimTemplate": {}}), {(EPHEMERAL_VOLUMES, "v")}, id="ephemeral"
    ),
    pytest.param(projected(secret={"name": "ps"}), {(SECRETS, "ps")}, id="projected-secret"),
    pytest.param(
        projected(configMap={"name": "pc"}), {(CONFIGMAPS, "pc")}, id="projected-configmap"
    ),
    pytest.param(
        projected(clusterTrustBundle={"signerName": "x/y"}),
        {(CLUSTER_TRUST_BUNDLES, "")},
        id="projected-trust-bundle-by-signer",
    ),
    pytest.param(
        projected(serviceAccountToken={"path": "token"}),
        {(SERVICE_ACCOUNT_TOKEN, "")},
        id="projected-token",
    ),
    pytest.param(projected(downwardAPI={"items": []}), set(), id="projected-downward-api"),
    pytest.param(volume(emptyDir={}), set(), id="empty-dir"),
    pytest.param(container(env=env_from("secretKeyRef", "es")), {(SECRETS, "es")}, id="env-secret"),
    pytest.param(
        container(env=env_from("configMapKeyRef", "ec")), {(CONFIGMAPS, "ec")}, id="env-configmap"
    ),
    pytest.param(
        container(env=[{"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}]),
        set(),
        id="env-field-ref",
    ),
    pytest.param(
        container(envFrom=[{"secretRef": {"name": "fs"}}, {"configMapRef": {"name": "fc"}}]),
        {(SECRETS, "fs"), (CONFIGMAPS, "fc")},
        id="env-from",
    ),
    pytest.param(
        container("initContainers", envFrom=[{"secretRef": {"name": "init"}}]),
        {(SECRETS, "init")},
        id="init-container",
    ),
    pytest.param(
        container("ephemeralContainers", env=env_from("secretKeyRef", "debug")),
        {(SECRETS, "debug")},
        id="ephemeral-container",
    ),
    pytest.param(
        {"spec": {"resourceClaims": [{"name": "a", "resourceClaimName": "gpu"}]}},
        {(RESOURCE_CLAIMS, "gpu")},
        id="resource-claim",
    ),
    pytest.param(
        {"spec": {"resourceClaims": [{"name": "a", "resourceClaimTemplateName": "t"}]}},
        {(RESOURCE_CLAIM_TEMPLATES, "t")},
        id="resource-claim-template",
    ),
    # Malformed input never raises: wrong types are skipped or leave the name empty.
    pytest.param({"spec": {"volumes": "x", "containers": [1, None]}}, set(), id="wrong-types"),
    pytest.param(volume(secret={"secretName": 7}), {(SECRETS, "")}, id="name-not-a-string"),
    pytest.param(
        container(env=[{"valueFrom": {"secretKeyRef": "s"}}]), {(SECRETS, "")}, id="ref-string"
    ),
]


@pytest.mark.parametrize(("pod", "expected"), CASES)
def test_references(pod: dict[str, Any], expected: set[tuple[str, str]]) -> None:
    found = pod_references(pod["spec"])
    assert isinstance(found, frozenset)
    assert {(ref.kind, ref.name) for ref in found} == expected


@pytest.mark.parametrize("spec", [None, [], "spec", 3], ids=["null", "list", "string", "int"])
def test_not_a_spec(spec: Any) -> None:
    assert pod_references(spec) == frozenset()


def test_recorded_pod_with_injected_service_account_volume() -> None:
    """What the API server injects: the service account, its token and the root CA ConfigMap."""
    pod = load_review("b008-create-pods")["request"]["object"]
    assert pod_references(pod["spec"]) == {
        PodRef(SERVICE_ACCOUNTS, "default"),
        PodRef(SERVICE_ACCOUNT_TOKEN),
        PodRef(CONFIGMAPS, "kube-root-ca.crt"),
    }


def test_references_print_as_denials_name_them() -> None:
    assert str(PodRef(SECRETS, "db")) == 'secrets "db"'
    assert str(PodRef(SERVICE_ACCOUNT_TOKEN)) == "serviceaccounts/token"
