"""The API kinds the engine reads, in one table: kind, group/resource, and how each compiles.

The static source, the watch cache, the escalation check and ``lint`` all read this table, so a
kind is added in one place.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from app.engine.context import registered_unjudged
from app.engine.nodegraph import compile_attachment, compile_pod, compile_volume
from app.engine.rbac import RBAC_GROUP, Binding, CompiledRole, Compiler, Snapshot

CompileFn = Callable[[Compiler, Mapping[str, Any]], Any]


@dataclass(frozen=True, slots=True)
class KindSpec:
    """One kind: where its collection lives and what an object of it is reduced to."""

    kind: str
    group: str
    resource: str
    compile: CompileFn
    version: str = "v1"


ROLE = KindSpec("Role", RBAC_GROUP, "roles", lambda c, o: c.role(o, "Role"))
CLUSTER_ROLE = KindSpec(
    "ClusterRole", RBAC_GROUP, "clusterroles", lambda c, o: c.role(o, "ClusterRole")
)
ROLE_BINDING = KindSpec(
    "RoleBinding", RBAC_GROUP, "rolebindings", lambda c, o: c.binding(o, "RoleBinding")
)
CLUSTER_ROLE_BINDING = KindSpec(
    "ClusterRoleBinding",
    RBAC_GROUP,
    "clusterrolebindings",
    lambda c, o: c.binding(o, "ClusterRoleBinding"),
)
NAMESPACE = KindSpec("Namespace", "", "namespaces", lambda c, o: c.namespace(o))
NODE = KindSpec("Node", "", "nodes", lambda c, o: c.node(o))

# What the node authorizer's graph is built from (watched only when it is on).
POD = KindSpec("Pod", "", "pods", lambda c, o: compile_pod(o))
PERSISTENT_VOLUME = KindSpec(
    "PersistentVolume", "", "persistentvolumes", lambda c, o: compile_volume(o)
)
VOLUME_ATTACHMENT = KindSpec(
    "VolumeAttachment", "storage.k8s.io", "volumeattachments", lambda c, o: compile_attachment(o)
)
GRAPH_KINDS: tuple[KindSpec, ...] = (POD, PERSISTENT_VOLUME, VOLUME_ATTACHMENT)

# The webhook's own registration, watched by name: what its label-rule entries leave out.
WEBHOOK_CONFIGURATION = KindSpec(
    "ValidatingWebhookConfiguration",
    "admissionregistration.k8s.io",
    "validatingwebhookconfigurations",
    lambda c, o: registered_unjudged(o),
)

ROLE_KINDS: tuple[KindSpec, ...] = (ROLE, CLUSTER_ROLE)
BINDING_KINDS: tuple[KindSpec, ...] = (ROLE_BINDING, CLUSTER_ROLE_BINDING)
# Every kind a snapshot is built from, in the order sources load them.
KINDS: tuple[KindSpec, ...] = (*ROLE_KINDS, *BINDING_KINDS, NAMESPACE, NODE)
BY_KIND: Mapping[str, KindSpec] = {spec.kind: spec for spec in KINDS}
# RBAC resources (``roles``, ``clusterrolebindings``...) → their kind.
RBAC_RESOURCES: Mapping[str, KindSpec] = {
    spec.resource: spec for spec in (*ROLE_KINDS, *BINDING_KINDS)
}


def build_snapshot(compiled: Mapping[str, Iterable[Any]]) -> Snapshot:
    """Index compiled objects given per kind (what ``KindSpec.compile`` returned)."""
    roles: list[CompiledRole] = [r for spec in ROLE_KINDS for r in compiled.get(spec.kind, ())]
    bindings: list[Binding] = [
        b for spec in BINDING_KINDS for b in compiled.get(spec.kind, ()) if b is not None
    ]
    return Snapshot.build(
        roles,
        bindings,
        dict(compiled.get(NAMESPACE.kind, ())),
        dict(compiled.get(NODE.kind, ())),
    )


def snapshot_from_objects(
    objects: Iterable[tuple[str, Mapping[str, Any]]], compiler: Compiler
) -> Snapshot:
    """Compile and index ``(kind, object)`` pairs; kinds not in ``KINDS`` are ignored."""
    compiled: dict[str, list[Any]] = defaultdict(list)
    for kind, obj in objects:
        spec = BY_KIND.get(kind)
        if spec is not None:
            compiled[kind].append(spec.compile(compiler, obj))
    return build_snapshot(compiled)
