"""The node authorizer's graph: which objects a node reaches through the pods bound to it.

As in the API server's node authorizer, a node may read an object when a path leads from it to
the node: ``secret/configmap/pvc/serviceaccount/resourceclaim -> pod -> node``, ``pv -> pvc``
(the PV's ``spec.claimRef``) and ``secret -> pv`` (the secrets a PV hands to the kubelet). Pods
and PVs are reduced on arrival to small frozen bindings (``compile_pod``, ``compile_volume``):
names only, never bodies. The graph keeps, per referenced object, the set of nodes that reach it
(with a writer-side count per node, since many pods share a configmap), so a question costs a
couple of dictionary lookups.

Concurrency: one writer at a time (a lock taken by the pods and volumes informers), any number
of lock-free readers. Readers only ever do single dictionary lookups and read frozensets that
are replaced, never mutated, so a reader sees each object's node set either before or after an
update. An update adds the new references before it drops the old ones, so a reference that a
pod keeps is never absent in between.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

from app.engine.model import annotations_of, mapping_items
from app.engine.node import MIRROR_ANNOTATION
from app.engine.podrefs import (
    CONFIGMAPS,
    EPHEMERAL_VOLUMES,
    PERSISTENT_VOLUME_CLAIMS,
    RESOURCE_CLAIMS,
    SECRETS,
    SERVICE_ACCOUNTS,
    PodRef,
    pod_references,
)

PODS = "pods"
# The kinds of reference the walker reports that name an object a node may then read.
GRAPH_REFERENCE_KINDS = frozenset(
    {SERVICE_ACCOUNTS, SECRETS, CONFIGMAPS, PERSISTENT_VOLUME_CLAIMS, RESOURCE_CLAIMS}
)
PERSISTENT_VOLUMES = "persistentvolumes"
VOLUME_ATTACHMENTS = "volumeattachments"

# (resource, namespace, name) of a referenced object.
ObjectKey = tuple[str, str, str]
_NONE: frozenset[str] = frozenset()

# PV volume sources whose secret reference the kubelet reads, and the field holding it. CSI's
# controller secrets are for the controller, not the kubelet, so they grant nothing.
PV_SECRET_FIELDS: tuple[tuple[str, str], ...] = (
    ("azureFile", "secretName"),
    ("cephfs", "secretRef"),
    ("cinder", "secretRef"),
    ("flexVolume", "secretRef"),
    ("iscsi", "secretRef"),
    ("rbd", "secretRef"),
    ("scaleIO", "secretRef"),
    ("storageos", "secretRef"),
    ("csi", "nodePublishSecretRef"),
    ("csi", "nodeStageSecretRef"),
)
# Plugins whose secret, when it names no namespace, lives in the namespace of the bound claim.
_CLAIM_NAMESPACE_DEFAULT = frozenset(
    {"azureFile", "cephfs", "flexVolume", "iscsi", "rbd", "scaleIO"}
)


@dataclass(frozen=True, slots=True)
class PodBinding:
    """A pod bound to a node, and what it references (nothing for a mirror pod)."""

    namespace: str
    name: str
    node: str
    refs: frozenset[PodRef] = frozenset()

    def objects(self) -> Iterable[ObjectKey]:
        yield PODS, self.namespace, self.name
        for ref in self.refs:
            yield ref.kind, self.namespace, ref.name


@dataclass(frozen=True, slots=True)
class VolumeBinding:
    """A PersistentVolume bound to a claim, and the secrets it hands to the kubelet."""

    name: str
    claim: tuple[str, str]  # (namespace, name) of spec.claimRef
    secrets: frozenset[tuple[str, str]] = frozenset()  # (namespace, name)


def compile_pod(pod: Mapping[str, Any]) -> PodBinding | None:
    """A pod's binding; None while it is not scheduled (no node can reach it yet)."""
    meta = pod.get("metadata")
    spec = pod.get("spec")
    if not isinstance(meta, Mapping) or not isinstance(spec, Mapping):
        return None
    node, namespace, name = spec.get("nodeName"), meta.get("namespace"), meta.get("name")
    if not (_text(node) and _text(namespace) and _text(name)):
        return None
    # A node creates its mirror pods itself: they must never grant it anything (the admission
    # rule refuses mirror pods with references; this is the second line).
    mirror = MIRROR_ANNOTATION in annotations_of(pod)
    refs = frozenset() if mirror else graph_references(pod, name)
    return PodBinding(sys.intern(namespace), name, sys.intern(node), refs)


def graph_references(pod: Mapping[str, Any], name: str) -> frozenset[PodRef]:
    """The named objects a node may read for this pod, as the in-tree graph links them.

    From the shared walker: service account, secrets, configmaps and claims; a generic
    ephemeral volume becomes the claim ``<pod>-<volume>`` the API server creates for it. A claim
    generated from a ResourceClaimTemplate is known by the name the pod's status gives it.
    """
    found: set[PodRef] = set()
    for ref in pod_references(pod.get("spec")):
        if not ref.name:
            continue
        if ref.kind in GRAPH_REFERENCE_KINDS:
            found.add(PodRef(ref.kind, sys.intern(ref.name)))
        elif ref.kind == EPHEMERAL_VOLUMES:
            found.add(PodRef(PERSISTENT_VOLUME_CLAIMS, f"{name}-{ref.name}"))
    status = pod.get("status")
    if isinstance(status, Mapping):
        claims = [*mapping_items(status.get("resourceClaimStatuses"))]
        extended = status.get("extendedResourceClaimStatus")
        if isinstance(extended, Mapping):
            claims.append(extended)
        for claim in claims:
            generated = claim.get("resourceClaimName")
            if isinstance(generated, str) and generated:
                found.add(PodRef(RESOURCE_CLAIMS, generated))
    return frozenset(found)


def compile_volume(pv: Mapping[str, Any]) -> VolumeBinding | None:
    """A PV's binding; None while it has no claimRef (no pod can reach it)."""
    meta, spec = pv.get("metadata"), pv.get("spec")
    if not isinstance(meta, Mapping) or not isinstance(spec, Mapping):
        return None
    name, claim = meta.get("name"), spec.get("claimRef")
    if not isinstance(name, str) or not name or not isinstance(claim, Mapping):
        return None
    claim_ns, claim_name = claim.get("namespace"), claim.get("name")
    if not isinstance(claim_ns, str) or not isinstance(claim_name, str) or not claim_name:
        return None
    secrets: set[tuple[str, str]] = set()
    for plugin, field in PV_SECRET_FIELDS:
        source = spec.get(plugin)
        if not isinstance(source, Mapping):
            continue
        if field == "secretName":
            secret, namespace = source.get(field), source.get("secretNamespace")
        else:
            ref = source.get(field)
            ref = ref if isinstance(ref, Mapping) else {}
            secret, namespace = ref.get("name"), ref.get("namespace")
        if not namespace and plugin in _CLAIM_NAMESPACE_DEFAULT:
            namespace = claim_ns
        if isinstance(secret, str) and secret and isinstance(namespace, str):
            secrets.add((sys.intern(namespace), secret))
    return VolumeBinding(name, (sys.intern(claim_ns), claim_name), frozenset(secrets))


def _text(value: Any) -> TypeGuard[str]:
    return isinstance(value, str) and bool(value)


@dataclass(frozen=True, slots=True)
class AttachmentBinding:
    """A VolumeAttachment and the node it attaches a volume to."""

    name: str
    node: str


def compile_attachment(attachment: Mapping[str, Any]) -> AttachmentBinding | None:
    """A VolumeAttachment's binding; None without a node (no node may read it)."""
    meta, spec = attachment.get("metadata"), attachment.get("spec")
    if not isinstance(meta, Mapping) or not isinstance(spec, Mapping):
        return None
    name, node = meta.get("name"), spec.get("nodeName")
    if not (_text(name) and _text(node)):
        return None
    return AttachmentBinding(name, sys.intern(node))


class NodeGraph:
    """Pods by node and what they reference, updated one binding at a time (module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # Read without the lock: object → nodes reaching it; PV → claim; secret → PVs using it.
        self._reach: dict[ObjectKey, frozenset[str]] = {}
        self._volume_claims: dict[str, ObjectKey] = {}
        self._volume_secrets: dict[ObjectKey, frozenset[str]] = {}
        self._attachments: dict[str, str] = {}  # VolumeAttachment → node
        # Writer-only: how many pods on each node reference an object.
        self._counts: dict[ObjectKey, dict[str, int]] = {}
        self.pods = 0
        self.volumes = 0

    @classmethod
    def from_objects(cls, objects: Iterable[tuple[str, Mapping[str, Any]]]) -> NodeGraph:
        """A graph of the ``Pod`` and ``PersistentVolume`` objects among ``(kind, object)``."""
        graph = cls()
        for kind, obj in objects:
            if kind == "Pod":
                graph.update_pod(None, compile_pod(obj))
            elif kind == "PersistentVolume":
                graph.update_volume(None, compile_volume(obj))
            elif kind == "VolumeAttachment":
                graph.update_attachment(None, compile_attachment(obj))
        return graph

    # Readers (lock-free).

    def related(self, node: str, resource: str, namespace: str, name: str) -> bool:
        """Whether a path leads from the object to ``node``."""
        if resource == PERSISTENT_VOLUMES:
            return self._volume_reaches(name, node)
        if resource == VOLUME_ATTACHMENTS:
            return self._attachments.get(name) == node
        key = (resource, namespace, name)
        if node in self._reach.get(key, _NONE):
            return True
        if resource == SECRETS:
            volumes = self._volume_secrets.get(key, _NONE)
            return any(self._volume_reaches(pv, node) for pv in volumes)
        return False

    def nodes_reaching(self, resource: str, namespace: str, name: str) -> frozenset[str]:
        """The nodes whose pods reference the object directly (for tests and ``check``)."""
        return self._reach.get((resource, namespace, name), _NONE)

    def _volume_reaches(self, pv: str, node: str) -> bool:
        claim = self._volume_claims.get(pv)
        return claim is not None and node in self._reach.get(claim, _NONE)

    def __len__(self) -> int:
        """How many objects some node reaches directly (pods included)."""
        return len(self._reach)

    # Writers.

    def update_pod(self, old: PodBinding | None, new: PodBinding | None) -> None:
        """Replace what ``old`` contributed by what ``new`` does (None: absent or unscheduled)."""
        if old == new:
            return
        with self._lock:
            if new is not None:
                for key in new.objects():
                    self._count(key, new.node, 1)
                self.pods += 1
            if old is not None:
                for key in old.objects():
                    self._count(key, old.node, -1)
                self.pods -= 1

    def update_volume(self, old: VolumeBinding | None, new: VolumeBinding | None) -> None:
        """Replace what PV binding ``old`` contributed by what ``new`` does."""
        if old == new:
            return
        same = old is not None and new is not None and old.name == new.name
        with self._lock:
            if new is not None:
                self._volume_claims[new.name] = (PERSISTENT_VOLUME_CLAIMS, *new.claim)
                kept = old.secrets if same and old is not None else frozenset()
                for namespace, secret in new.secrets - kept:
                    key = (SECRETS, namespace, secret)
                    self._volume_secrets[key] = self._volume_secrets.get(key, _NONE) | {new.name}
            if old is not None:
                kept = new.secrets if same and new is not None else frozenset()
                for namespace, secret in old.secrets - kept:
                    key = (SECRETS, namespace, secret)
                    remaining = self._volume_secrets.get(key, _NONE) - {old.name}
                    if remaining:
                        self._volume_secrets[key] = remaining
                    else:
                        self._volume_secrets.pop(key, None)
                if not same:
                    self._volume_claims.pop(old.name, None)
            self.volumes += (new is not None) - (old is not None)

    def update_attachment(
        self, old: AttachmentBinding | None, new: AttachmentBinding | None
    ) -> None:
        """Replace what VolumeAttachment binding ``old`` contributed by what ``new`` does."""
        if old == new:
            return
        with self._lock:
            if new is not None:
                self._attachments[new.name] = new.node
            if old is not None and (new is None or new.name != old.name):
                self._attachments.pop(old.name, None)

    def _count(self, key: ObjectKey, node: str, delta: int) -> None:
        counts = self._counts.setdefault(key, {})
        count = counts.get(node, 0) + delta
        if count > 0:
            counts[node] = count
            if count == delta:  # 0 → 1: the node now reaches the object
                self._reach[key] = self._reach.get(key, _NONE) | {node}
            return
        counts.pop(node, None)
        nodes = self._reach.get(key, _NONE) - {node}
        if nodes:
            self._reach[key] = nodes
        else:
            self._reach.pop(key, None)
        if not counts:
            del self._counts[key]
