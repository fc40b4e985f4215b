"""End to end: ``python -m app serve --kubeconfig ... --node-authorizer`` against the loopback API
server. A pod scheduled to node1 makes its secret readable by node1 over ``POST /authorize`` as
soon as the watch delivers it, and unreadable once it is deleted.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kubeapi import FakeKubeAPI, tls_cluster, wait_until
from tests.process import Server, serve
from tests.support import make_access_review, pod

TOKEN = "node-e2e-token"
NODES = ("system:nodes",)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FakeKubeAPI, Path]]:
    with tls_cluster(tmp_path_factory.mktemp("cluster"), TOKEN) as found:
        yield found


@pytest.fixture(scope="module")
def webhook(
    cluster: tuple[FakeKubeAPI, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("webhook")
    scratch = tmp / "tmp"
    scratch.mkdir()
    env = {"TMPDIR": str(scratch), "KUBECONFIG": "", "PROMETHEUS_MULTIPROC_DIR": ""}
    args = ("--kubeconfig", str(cluster[1]), "--workers", "1", "--node-authorizer")
    with serve(tmp, *args, env=env) as server:
        yield server


def authorize(server: Server, user: str, verb: str, resource: str, **attrs: Any) -> dict[str, Any]:
    groups = NODES if user.startswith("system:node:") else ()
    review = make_access_review(user, verb, resource, groups=groups, **attrs)
    status, body = server.request("POST", "/authorize", json.dumps(review).encode())
    assert status == 200, body
    return body["status"]


def node1_gets_secret(server: Server, name: str) -> dict[str, Any]:
    return authorize(server, "system:node:node1", "get", "secrets", namespace="t1", name=name)


def test_a_scheduled_pod_opens_its_secret_to_its_node_until_deleted(
    cluster: tuple[FakeKubeAPI, Path], webhook: Server
) -> None:
    api = cluster[0]
    status, body = webhook.request("GET", "/readyz")
    assert status == 200 and "0 pods, 0 persistentvolumes" in body["detail"], body
    denied = node1_gets_secret(webhook, "s-ref")
    assert denied == {
        "allowed": False,
        "denied": True,
        "reason": "no relationship found between node 'node1' and this object",
    }

    api.apply(
        "pods", pod("web-a", node="", volumes=[{"name": "s", "secret": {"secretName": "s-ref"}}])
    )
    api.apply("pods", pod("web-a", volumes=[{"name": "s", "secret": {"secretName": "s-ref"}}]))
    wait_until(lambda: node1_gets_secret(webhook, "s-ref")["allowed"], what="pod bound to node1")
    node2 = authorize(webhook, "system:node:node2", "get", "secrets", namespace="t1", name="s-ref")
    assert node2["denied"] is True

    api.delete("pods", "web-a", "t1")
    wait_until(lambda: node1_gets_secret(webhook, "s-ref").get("denied"), what="pod deleted")


def test_a_node_reads_only_its_own_node_and_pods(webhook: Server) -> None:
    assert authorize(webhook, "system:node:node1", "get", "nodes", name="node1") == {
        "allowed": True
    }
    other = authorize(webhook, "system:node:node1", "get", "nodes", name="node2")
    assert other["reason"] == "node 'node1' cannot read 'node2', only its own Node object"
    listed = authorize(webhook, "system:node:node1", "list", "pods")
    assert listed["denied"] is True and "spec.nodeName field selector" in listed["reason"]
    # Requests that are not a node's go on to the label rule, which leaves them to RBAC here.
    assert authorize(webhook, "bob", "get", "secrets", namespace="t1", name="s-ref") == {
        "allowed": False
    }
