"""One-shot reads for the command line: a snapshot of the cluster's RBAC, API discovery, and the
labels of existing objects. Read-only GETs through the same ``KubeClient`` the watch cache uses.

Objects are listed as ``PartialObjectMetadataList``: the API server sends metadata only, so no
Secret's data ever reaches this process.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from app.engine.kinds import KINDS, snapshot_from_objects
from app.engine.model import Resource, labels_of
from app.engine.rbac import Compiler, Snapshot
from app.engine.reverse import BoundPod, Existing
from app.source.api import KubeClient, Malformed, object_path

PAGE = 500
TIMEOUT = (5.0, 60.0)


def cluster_snapshot(client: KubeClient, compiler: Compiler) -> Snapshot:
    """List every kind a snapshot is built from, once, and compile it."""
    objects: list[tuple[str, Mapping[str, Any]]] = []
    for spec in KINDS:
        items, _ = client.list(object_path(spec.group, spec.version, spec.resource), PAGE, TIMEOUT)
        objects.extend((spec.kind, item) for item in items)
    return snapshot_from_objects(objects, compiler)


@dataclass(frozen=True, slots=True)
class ApiResource:
    """A listable top-level resource at its group's preferred version (else one serving it)."""

    group: str
    version: str
    resource: str
    kind: str
    namespaced: bool
    short_names: tuple[str, ...] = ()

    @property
    def as_resource(self) -> Resource:
        return Resource(self.group, self.resource)


def _resources(client: KubeClient, group: str, version: str) -> Iterator[ApiResource]:
    path = f"/apis/{group}/{version}" if group else f"/api/{version}"
    document = client.get(path)
    for item in document.get("resources") or ():
        if not isinstance(item, Mapping):
            raise Malformed(f"GET {path}: resources must be objects")
        name, verbs = item.get("name"), item.get("verbs") or ()
        if not isinstance(name, str) or "/" in name or "list" not in verbs:
            continue  # subresources, and resources that cannot be listed
        kind = item.get("kind")
        kind = kind if isinstance(kind, str) else ""
        short = item.get("shortNames")
        short = short if isinstance(short, list) else None
        short_names = (
            tuple(s for s in short if isinstance(s, str)) if isinstance(short, list) else ()
        )
        yield ApiResource(group, version, name, kind, bool(item.get("namespaced")), short_names)


def discover(client: KubeClient) -> list[ApiResource]:
    """Every listable resource the API server serves, as ``kubectl api-resources`` finds them:
    core v1, and each group's resources at its preferred version, or at the first other version
    serving them (a CRD or a beta built-in may be served only at a version not preferred)."""
    found = list(_resources(client, "", "v1"))
    groups = client.get("/apis").get("groups") or ()
    for group in groups:
        if not isinstance(group, Mapping) or not isinstance(name := group.get("name"), str):
            continue
        preferred = (group.get("preferredVersion") or {}).get("version")
        versions = [v.get("version") for v in group.get("versions") or () if isinstance(v, Mapping)]
        ordered = dict.fromkeys([preferred, *versions])
        seen: set[str] = set()
        for version in ordered:
            if not isinstance(version, str):
                continue
            for res in _resources(client, name, version):
                if res.resource not in seen:
                    seen.add(res.resource)
                    found.append(res)
    return found


def list_labels(client: KubeClient, resource: ApiResource, namespace: str = "") -> list[Existing]:
    """Every object of ``resource`` (in ``namespace``, else in all), reduced to where it is and
    its labels."""
    namespace = namespace if resource.namespaced else ""
    path = object_path(resource.group, resource.version, resource.resource, namespace)
    items, _ = client.list(path, PAGE, TIMEOUT, metadata_only=True)
    found = []
    for item in items:
        meta = item.get("metadata") or {}
        found.append(
            Existing(
                resource.as_resource,
                str(meta.get("namespace") or ""),
                str(meta.get("name") or ""),
                dict(labels_of(item)),
            )
        )
    return found


def bound_pods(client: KubeClient, namespace: str = "") -> list[BoundPod]:
    """Every pod bound to a node (in ``namespace``, else in all): where it is, its labels, its
    node. Pods are listed whole (the node is in the spec), page by page, and only what
    ``bound_pod`` keeps is kept of each."""
    path = object_path("", "v1", "pods", namespace)
    bound = (("fieldSelector", "spec.nodeName!="),)
    found, _ = client.list_each(path, PAGE, TIMEOUT, bound_pod, selector=bound)
    return [pod for pod in found if pod is not None]


def bound_pod(item: Mapping[str, Any]) -> BoundPod | None:
    """A pod as the placement audit reads it (namespace, name, labels, node, uid); None when it
    is bound to no node."""
    meta, spec = item.get("metadata") or {}, item.get("spec") or {}
    node = spec.get("nodeName") if isinstance(spec, Mapping) else None
    if not (isinstance(node, str) and node and isinstance(meta, Mapping)):
        return None
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    uid = meta.get("uid")
    uid = uid if isinstance(uid, str) else ""
    return BoundPod(namespace, name, dict(labels_of(item)), node, uid)
