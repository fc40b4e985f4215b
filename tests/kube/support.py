"""Helpers for the real-API-server tier: the example tenants in a namespace, waiting, objects."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import yaml

from tests.kube.cluster import MANIFESTS, LabelRbacCluster
from tests.kube.controlplane import ADMIN

T = TypeVar("T")


def example_tenants(namespace: str) -> list[dict[str, Any]]:
    """manifests/examples/tenants.yaml (two teams sharing t1, a tenant admin, a CI robot), moved
    into ``namespace``."""
    docs = [
        d for d in yaml.safe_load_all((MANIFESTS / "examples" / "tenants.yaml").read_text()) if d
    ]
    for doc in docs:
        doc["metadata"]["namespace"] = namespace
        for subject in doc.get("subjects", []):
            if subject["kind"] == "ServiceAccount":
                subject["namespace"] = namespace
    return docs


def eventually(check: Callable[[], T], timeout: float = 10, interval: float = 0.2) -> T:
    """``check()`` until it returns without AssertionError (a watch delivering a change takes
    milliseconds, an authorization answer is cached for a second); its last error otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return check()
        except AssertionError:
            if time.monotonic() >= deadline:
                raise
        time.sleep(interval)


def obj(
    kind: str,
    name: str,
    namespace: str,
    labels: Mapping[str, str] | None = None,
    api_version: str = "v1",
    **body: Any,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if labels:
        metadata["labels"] = dict(labels)
    return {"apiVersion": api_version, "kind": kind, "metadata": metadata, **body}


def install_tenants(cluster: LabelRbacCluster, namespace: str) -> None:
    """The example tenants in ``namespace``, returned once the webhook judges by them: alice's
    unlabeled ConfigMap is refused for want of team=a (a server-side dry run, nothing kept)."""
    cluster.apply(ADMIN, example_tenants(namespace))

    def alice_judged_by_team_a() -> None:
        done = cluster.kubectl(
            "alice", "-n", namespace, "create", "configmap", "probe", "--dry-run=server",
            "-o", "name",
        )  # fmt: skip
        assert done.returncode != 0 and "team in [a]" in done.stderr, done.stderr

    eventually(alice_judged_by_team_a)


def fresh_namespace(cluster: LabelRbacCluster, labels: dict[str, str] | None = None) -> str:
    """A new namespace with its ``default`` ServiceAccount (no controller manager makes it
    here, and pods cannot be created without it)."""
    name = f"t-{secrets.token_hex(4)}"
    namespace = {"apiVersion": "v1", "kind": "Namespace",
                 "metadata": {"name": name, "labels": labels or {}}}  # fmt: skip
    account = {"apiVersion": "v1", "kind": "ServiceAccount",
               "metadata": {"name": "default", "namespace": name}}  # fmt: skip
    cluster.apply(ADMIN, [namespace])
    cluster.apply(ADMIN, [account])
    return name
