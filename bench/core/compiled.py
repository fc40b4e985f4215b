"""The scale benchmarks' layout (``bench.core.layout``) as the compiler sees it: its objects
compiled per kind, as the cluster source compiles watch events, and the resources a v1.36 API
server serves, which the parameters are rendered for."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from app.engine.kinds import BY_KIND
from app.engine.model import Resource
from app.engine.params import Target
from app.settings import Settings
from bench.core.layout import cluster_objects, layout, namespace_objects

# The namespaced resources kube-apiserver v1.36 serves with "create" (built-in groups only).
SERVED = (
    ("", "bindings"), ("", "configmaps"), ("", "endpoints"), ("", "events"),
    ("", "limitranges"), ("", "persistentvolumeclaims"), ("", "pods"), ("", "podtemplates"),
    ("", "replicationcontrollers"), ("", "resourcequotas"), ("", "secrets"),
    ("", "serviceaccounts"), ("", "services"), ("apps", "controllerrevisions"),
    ("apps", "daemonsets"), ("apps", "deployments"), ("apps", "replicasets"),
    ("apps", "statefulsets"), ("authorization.k8s.io", "localsubjectaccessreviews"),
    ("autoscaling", "horizontalpodautoscalers"), ("batch", "cronjobs"), ("batch", "jobs"),
    ("coordination.k8s.io", "leases"), ("discovery.k8s.io", "endpointslices"),
    ("events.k8s.io", "events"), ("networking.k8s.io", "ingresses"),
    ("networking.k8s.io", "networkpolicies"), ("policy", "poddisruptionbudgets"),
    ("rbac.authorization.k8s.io", "rolebindings"), ("rbac.authorization.k8s.io", "roles"),
    ("resource.k8s.io", "resourceclaims"), ("resource.k8s.io", "resourceclaimtemplates"),
    ("storage.k8s.io", "csistoragecapacities"),
)  # fmt: skip


def target() -> Target:
    return Target.of([Resource(group, name) for group, name in SERVED])


def compiled_objects(objects: int) -> tuple[dict[str, list[Any]], int]:
    """The layout's objects compiled per kind, as the cluster source compiles watch events."""
    namespaces, cluster_roles = layout(objects)
    compiler = Settings().compiler
    found: dict[str, list[Any]] = {}
    count = 0
    docs: Iterable[dict[str, Any]] = cluster_objects(cluster_roles)
    for i in range(-1, namespaces):
        for obj in docs if i < 0 else namespace_objects(i, cluster_roles):
            found.setdefault(obj["kind"], []).append(BY_KIND[obj["kind"]].compile(compiler, obj))
            count += 1
    return found, count
