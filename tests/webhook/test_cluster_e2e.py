"""End to end against a cluster: ``python -m app serve --kubeconfig`` watching a fake API server.

The webhook runs as a real gunicorn process; the API server is the loopback fake from
tests/kubeapi.py, over TLS with a bearer token, fed from the recorded fixtures. Decisions must
follow RBAC changes pushed through its watch streams.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kubeapi import FakeKubeAPI, tls_cluster, wait_until
from tests.process import Server, serve
from tests.source.helpers import METRIC_NAMES
from tests.support import make_access_review, make_review

TOKEN = "e2e-token"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FakeKubeAPI, Path]]:
    with tls_cluster(tmp_path_factory.mktemp("cluster"), TOKEN) as found:
        yield found


@pytest.fixture(scope="module")
def webhook(
    cluster: tuple[FakeKubeAPI, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Server, Path]]:
    tmp = tmp_path_factory.mktemp("webhook")
    scratch = tmp / "tmp"  # the process's TMPDIR: where its metrics directory goes
    scratch.mkdir()
    env = {"TMPDIR": str(scratch), "KUBECONFIG": "", "PROMETHEUS_MULTIPROC_DIR": ""}
    args = ("--kubeconfig", str(cluster[1]), "--workers", "1")
    with serve(tmp, *args, env=env) as server:
        yield server, scratch
    # The arbiter removes the metrics directory it made when it exits.
    assert list(scratch.iterdir()) == []


def decide(server: Server, user: str, labels: dict[str, str]) -> dict[str, Any]:
    review = make_review(user, "CREATE", "configmaps", namespace="default", labels=labels)
    return server.review(review)["response"]


def test_decisions_follow_rbac_changes_pushed_through_the_watch(
    cluster: tuple[FakeKubeAPI, Path], webhook: tuple[Server, Path]
) -> None:
    api, server = cluster[0], webhook[0]
    status, body = server.request("GET", "/readyz")
    assert status == 200 and body["detail"].startswith("synced: 8 roles, 62 clusterroles")

    # The recorded state: alice is limited to team=a by Role default/tenant-a; bob is unbound.
    assert decide(server, "alice", {"team": "a"})["allowed"] is True
    denied = decide(server, "alice", {"team": "b"})
    assert denied["allowed"] is False
    assert "role default/tenant-a allows team in [a]" in denied["status"]["message"]
    assert decide(server, "bob", {"team": "b"})["allowed"] is True

    rbac = "rbac.authorization.k8s.io"
    started = time.monotonic()
    api.apply(
        "rolebindings",
        {
            "metadata": {"name": "bob-tenant-a", "namespace": "default"},
            "subjects": [{"kind": "User", "apiGroup": rbac, "name": "bob"}],
            "roleRef": {"apiGroup": rbac, "kind": "Role", "name": "tenant-a"},
        },
    )
    wait_until(lambda: not decide(server, "bob", {"team": "b"})["allowed"], 10, 0.005)
    binding_latency = time.monotonic() - started

    role = json.loads(json.dumps(api.collections["roles"].items[("default", "tenant-a")]))
    role["metadata"]["annotations"]["labelrbac.io/permissions"] = json.dumps(
        {"configmaps": {"team": ["a", "b"]}}
    )
    started = time.monotonic()
    api.apply("roles", role)
    wait_until(lambda: decide(server, "alice", {"team": "b"})["allowed"], 10, 0.005)
    role_latency = time.monotonic() - started
    assert decide(server, "bob", {"team": "b"})["allowed"] is True
    assert decide(server, "bob", {"team": "c"})["allowed"] is False
    print(f"over HTTPS: binding {binding_latency * 1000:.0f} ms, role {role_latency * 1000:.0f} ms")

    # The webhook only ever read, and always authenticated.
    assert {(r.method, r.authorization) for r in api.recorded()} == {("GET", f"Bearer {TOKEN}")}


def test_metrics_are_served(
    cluster: tuple[FakeKubeAPI, Path], webhook: tuple[Server, Path]
) -> None:
    api, server = cluster[0], webhook[0]
    decide(server, "alice", {"team": "a"})
    api.expire_watches("namespaces")  # one watch restart, so the counter has a series
    wait_until(lambda: len(api.recorded("namespaces", watch=False)) >= 2, what="re-list")

    def scrape() -> str:
        status, text = server.request("GET", "/metrics")
        assert status == 200
        return str(text)

    text = wait_until(lambda: "label_rbac_watch_restarts_total{" in (t := scrape()) and t)
    for name in METRIC_NAMES[:-1]:  # no parent lookup happened here
        assert name in text, name
    assert 'label_rbac_cache_objects{kind="ClusterRole"} 62.0' in text
    assert "label_rbac_cache_synced 1.0" in text
    assert 'label_rbac_watch_restarts_total{cause="expired",kind="Namespace"} 1.0' in text


def authorize(server: Server, review: dict[str, Any]) -> dict[str, Any]:
    status, body = server.request("POST", "/authorize", json.dumps(review).encode())
    assert status == 200, body
    assert body["kind"] == "SubjectAccessReview"
    return dict(body["status"])


def test_label_scoped_reads_over_https(
    cluster: tuple[FakeKubeAPI, Path], webhook: tuple[Server, Path]
) -> None:
    """alice (Role default/tenant-a: configmaps team=a, widened to b above) reads her own
    configmaps only; gets are judged by labels read through a metadata-only watch."""
    api, server = cluster[0], webhook[0]
    if "configmaps" not in api.collections:
        api.add_collection("configmaps", "/api/v1", "ConfigMap", "v1")
    for name, team in (("cm-a", "a"), ("cm-c", "c")):
        meta = {"name": name, "namespace": "default", "labels": {"team": team}}
        api.apply("configmaps", {"metadata": meta, "data": {"secret": "never read"}})

    def get(name: str) -> dict[str, Any]:
        return authorize(
            server, make_access_review("alice", "get", "configmaps", namespace="default", name=name)
        )

    assert get("cm-a") == {"allowed": False}  # no opinion: RBAC allows it
    denied = get("cm-c")
    assert denied["denied"] is True
    assert 'label team="c" is not permitted' in denied["reason"]

    listing = make_access_review("alice", "list", "configmaps", namespace="default")
    assert "only with a label selector within team in [" in authorize(server, listing)["reason"]
    listing["spec"]["resourceAttributes"]["labelSelector"] = {
        "requirements": [{"key": "team", "operator": "In", "values": ["a"]}]
    }
    assert authorize(server, listing) == {"allowed": False}

    # The metadata informer lists and watches metadata only; a relabel reaches it by watch.
    wait_until(lambda: api.recorded("configmaps", watch=True), what="a configmaps watch")
    assert all("as=PartialObjectMetadata" in r.accept for r in api.recorded("configmaps"))
    meta = {"name": "cm-a", "namespace": "default", "labels": {"team": "c"}}
    api.apply("configmaps", {"metadata": meta})
    assert wait_until(lambda: get("cm-a").get("denied"), timeout=2, what="the relabel")
