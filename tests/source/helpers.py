"""Shared by the cluster-source tests: timings, object builders, requests, snapshot probes."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from app.engine.model import Request, UserInfo
from app.source.cluster import ClusterSource
from app.source.informer import Informer, Tuning
from app.webhook.wire import parse_review
from tests.kubeapi import FakeKubeAPI
from tests.support import load_review, make_review

TOKEN = "test-token"

# Production timings scaled down: quick reconnects, no periodic re-list unless a test asks.
FAST = Tuning(
    connect_timeout=2.0,
    list_timeout=5.0,
    read_grace=5.0,
    backoff_initial=0.02,
    backoff_max=0.2,
    resync_interval=0,
    parent_timeout=0.5,
    parent_ttl=2.0,
)

MakeSource = Callable[..., ClusterSource]

# The metric names docs/monitoring.md documents.
METRIC_NAMES = (
    "label_rbac_decisions_total",
    "label_rbac_decision_seconds_bucket",
    "label_rbac_cache_objects",
    "label_rbac_watch_restarts_total",
    "label_rbac_last_event_timestamp_seconds",
    "label_rbac_last_event_age_seconds",
    "label_rbac_cache_synced",
    "label_rbac_parent_lookups_total",
)

POD = "/api/v1/namespaces/default/pods/app"


def request(user: str, labels: dict[str, str]) -> Request:
    review = make_review(user, "CREATE", "configmaps", namespace="default", labels=labels)
    return parse_review(review).request


def exec_request(user: str = "alice", name: str = "app") -> Request:
    review = load_review("a019-connect-pods-exec")
    review["request"]["userInfo"] = {"username": user, "groups": ["system:authenticated"]}
    review["request"]["name"] = name
    return parse_review(review).request


def pod(name: str, labels: dict[str, str]) -> dict[str, Any]:
    meta = {"name": name, "namespace": "default", "labels": labels}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"nodeName": "node1"}}


def bindings_of(source: ClusterSource, user: str, namespace: str = "default") -> set[str]:
    snapshot = source.snapshot()
    assert snapshot is not None
    return {b.name for b, _ in snapshot.roles_for(UserInfo(user), namespace)}


def informer(source: ClusterSource, kind: str) -> Informer:
    return next(i for i in source.informers if i.kind == kind)


def rolebinding(name: str, user: str, role: str = "tenant-a") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "default"},
        "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": user}],
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
    }


def role_with(kubeapi: FakeKubeAPI, name: str, annotation: str) -> dict[str, Any]:
    obj = json.loads(json.dumps(kubeapi.collections["roles"].items[("default", name)]))
    obj["metadata"].setdefault("annotations", {})["labelrbac.io/permissions"] = annotation
    return obj
