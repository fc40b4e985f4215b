"""Which API objects a pod spec references: service account, Secrets, ConfigMaps, claims, ...

One walker for every rule that asks "what does this pod use": the node rules (a mirror pod may
reference nothing), the workload rules (a tenant's pod may only use objects in their bucket) and
a node authorizer (a node may read what its pods reference). It follows the fields the
Kubernetes node authorizer's graph follows (``podutil.VisitPodSecretNames``,
``VisitPodConfigmapNames``, volumes and claims), in every container, init container and
ephemeral container.

``pod_references(spec)`` takes a pod's ``spec`` (also a pod template's) and returns a frozen set
of ``PodRef``. A reference whose object is not named (a ``secret`` volume without
``secretName``, a token projection, an inline CSI volume) has ``name == ""``: it still says the
pod uses that kind of object. Malformed fields are skipped or yield ``name == ""``; nothing here
raises.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from app.engine.model import mapping_items

# Reference kinds. Those naming an API resource are spelled as that (core) resource.
SERVICE_ACCOUNTS = "serviceaccounts"  # spec.serviceAccountName (or deprecated serviceAccount)
SECRETS = "secrets"
CONFIGMAPS = "configmaps"
PERSISTENT_VOLUME_CLAIMS = "persistentvolumeclaims"
CLUSTER_TRUST_BUNDLES = "clustertrustbundles"  # name "" when selected by signerName
RESOURCE_CLAIMS = "resourceclaims"
RESOURCE_CLAIM_TEMPLATES = "resourceclaimtemplates"
# Not named objects but things a pod gets from the API: a token for its own service account
# (name ""), a generic ephemeral volume (name: the volume's; the API server creates the claim
# ``<pod name>-<volume name>``), an inline CSI volume (name: the driver).
SERVICE_ACCOUNT_TOKEN = "serviceaccounts/token"
EPHEMERAL_VOLUMES = "ephemeral"
CSI_VOLUMES = "csi"

# Volume sources naming a Secret: plugin → the field holding the reference. A ``secretName`` is
# the name itself, a ``...Ref`` a ``LocalObjectReference``; only a ``secret`` volume references a
# Secret even when the field is unset.
SECRET_VOLUME_FIELDS: Mapping[str, str] = {
    "secret": "secretName",
    "azureFile": "secretName",
    "cephfs": "secretRef",
    "cinder": "secretRef",
    "flexVolume": "secretRef",
    "iscsi": "secretRef",
    "rbd": "secretRef",
    "scaleIO": "secretRef",
    "storageos": "secretRef",
    "csi": "nodePublishSecretRef",
}
# Projected-volume sources: source → (kind, the field holding the object's name).
PROJECTED_SOURCES: Mapping[str, tuple[str, str]] = {
    "secret": (SECRETS, "name"),
    "configMap": (CONFIGMAPS, "name"),
    "clusterTrustBundle": (CLUSTER_TRUST_BUNDLES, "name"),
    "serviceAccountToken": (SERVICE_ACCOUNT_TOKEN, ""),
}
CONTAINER_FIELDS = ("containers", "initContainers", "ephemeralContainers")


@dataclass(frozen=True, slots=True, order=True)
class PodRef:
    """One referenced object: its kind (the constants above) and name ("" when unnamed)."""

    kind: str
    name: str = ""

    def __str__(self) -> str:
        return f'{self.kind} "{self.name}"' if self.name else self.kind


def pod_references(spec: Mapping[str, Any] | None) -> frozenset[PodRef]:
    """Every object ``spec`` (a PodSpec) references; see the module docstring."""
    if not isinstance(spec, Mapping):
        return frozenset()
    return frozenset(_walk(spec))


def _walk(spec: Mapping[str, Any]) -> Iterator[PodRef]:
    account = spec.get("serviceAccountName") or spec.get("serviceAccount")
    if account:
        yield PodRef(SERVICE_ACCOUNTS, _text(account))
    pull = spec.get("imagePullSecrets")
    if isinstance(pull, list):
        for item in pull:
            yield PodRef(SECRETS, _name(item, "name"))
    for claim in mapping_items(spec.get("resourceClaims")):
        if claim.get("resourceClaimTemplateName"):
            yield PodRef(RESOURCE_CLAIM_TEMPLATES, _name(claim, "resourceClaimTemplateName"))
        else:
            yield PodRef(RESOURCE_CLAIMS, _name(claim, "resourceClaimName"))
    for field in CONTAINER_FIELDS:
        for container in mapping_items(spec.get(field)):
            yield from _container(container)
    for volume in mapping_items(spec.get("volumes")):
        yield from _volume(volume)


def _container(container: Mapping[str, Any]) -> Iterator[PodRef]:
    for env in mapping_items(container.get("env")):
        value_from = env.get("valueFrom")
        if isinstance(value_from, Mapping):
            if value_from.get("secretKeyRef"):
                yield PodRef(SECRETS, _name(value_from["secretKeyRef"], "name"))
            if value_from.get("configMapKeyRef"):
                yield PodRef(CONFIGMAPS, _name(value_from["configMapKeyRef"], "name"))
    for env_from in mapping_items(container.get("envFrom")):
        if env_from.get("secretRef"):
            yield PodRef(SECRETS, _name(env_from["secretRef"], "name"))
        if env_from.get("configMapRef"):
            yield PodRef(CONFIGMAPS, _name(env_from["configMapRef"], "name"))


def _volume(volume: Mapping[str, Any]) -> Iterator[PodRef]:
    for plugin, field in SECRET_VOLUME_FIELDS.items():
        source = volume.get(plugin)
        if not isinstance(source, Mapping):
            continue
        if plugin == "secret" or (field == "secretName" and source.get(field)):
            yield PodRef(SECRETS, _name(source, field))
        elif source.get(field):
            yield PodRef(SECRETS, _name(source[field], "name"))
    if volume.get("configMap") is not None:
        yield PodRef(CONFIGMAPS, _name(volume["configMap"], "name"))
    if volume.get("persistentVolumeClaim") is not None:
        yield PodRef(PERSISTENT_VOLUME_CLAIMS, _name(volume["persistentVolumeClaim"], "claimName"))
    if volume.get("ephemeral") is not None:
        yield PodRef(EPHEMERAL_VOLUMES, _name(volume, "name"))
    if volume.get("csi") is not None:
        yield PodRef(CSI_VOLUMES, _name(volume["csi"], "driver"))
    projected = volume.get("projected")
    sources = projected.get("sources") if isinstance(projected, Mapping) else None
    for source in mapping_items(sources):
        for key, (kind, field) in PROJECTED_SOURCES.items():
            if source.get(key) is not None:
                yield PodRef(kind, _name(source[key], field) if field else "")


def _name(obj: Any, field: str) -> str:
    return _text(obj.get(field)) if isinstance(obj, Mapping) else ""


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""
