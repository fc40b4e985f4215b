"""``check --node-authorizer`` explains kubelets' requests as ``serve --node-authorizer`` answers
them, with the node graph of the directory's pods: the v1.35 recording's RBAC, and its pod
``web-a`` as stored (node1, secret volume ``s-ref``, envFrom ``cm-a``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from app.cli import main
from tests.kubeapi import FakeKubeAPI, discovery
from tests.support import ACCESS_REVIEWS, V135_RBAC, V135_REVIEWS, pod

NODE1 = ["--as", "system:node:node1", "--as-group", "system:nodes"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("cluster")
    shutil.copy(V135_RBAC, directory / "rbac.yaml")
    stored = json.loads((V135_REVIEWS / "c048-node-update-pods-status.json").read_text())
    pods = {"kind": "List", "items": [stored["request"]["oldObject"], pod("web-b", node="node2")]}
    (directory / "pods.json").write_text(json.dumps(pods))
    return directory


@pytest.mark.parametrize(
    ("args", "code", "expected"),
    [
        pytest.param(
            ["--review", str(ACCESS_REVIEWS / "c039-node-get-secrets.json")], 0,
            "allowed (NodeAuthorizer)\n  - secrets t1/s-ref is referenced by a pod bound to node "
            "'node1'", id="review-referenced-secret",
        ),
        pytest.param(
            ["--review", str(ACCESS_REVIEWS / "c040-node-get-secrets.json")], 1,
            "denied (403 NodeAuthorizer): no relationship found between node 'node1' and this "
            "object",
            id="review-unreferenced-secret",
        ),
        pytest.param(
            [*NODE1, "--verb", "get", "--resource", "configmaps", "-n", "t1", "--name", "cm-a"],
            0, "allowed (NodeAuthorizer)", id="flags-referenced-configmap",
        ),
        pytest.param(
            [*NODE1, "--verb", "list", "--resource", "pods"], 1,
            "denied (403 NodeAuthorizer): can only list/watch pods with spec.nodeName field "
            "selector",
            id="flags-list-all-pods",
        ),
    ],
)  # fmt: skip
def test_check_explains_node_requests(
    cluster: Path, capsys: pytest.CaptureFixture[str], args: list[str], code: int, expected: str
) -> None:
    assert main(["check", "--rbac-dir", str(cluster), "--node-authorizer", *args]) == code
    assert capsys.readouterr().out.startswith(expected)


def test_without_the_flag_rbac_decides(cluster: Path, capsys: pytest.CaptureFixture[str]) -> None:
    review = str(ACCESS_REVIEWS / "c040-node-get-secrets.json")
    assert main(["check", "--rbac-dir", str(cluster), "--review", review]) == 0
    # No node authorizer: RBAC decides, and the examples' system:node role grants the read.
    assert capsys.readouterr().out.startswith("allowed (Unrestricted)")


def test_against_a_cluster_the_graph_is_listed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    api = FakeKubeAPI().start()
    try:
        discovery(api)
        api.apply("pods", pod("web-a", volumes=[{"name": "s", "secret": {"secretName": "s-ref"}}]))
        kubeconfig = str(api.write_kubeconfig(tmp_path / "kubeconfig"))
        get = [*NODE1, "--verb", "get", "--resource", "secrets", "-n", "t1", "--name"]
        check = ["check", "--kubeconfig", kubeconfig, "--node-authorizer", *get]
        assert main([*check, "s-ref"]) == 0
        assert capsys.readouterr().out.startswith("allowed (NodeAuthorizer)")
        assert main([*check, "s-other"]) == 1
        assert "no relationship found" in capsys.readouterr().out
        listed = {r.path for r in api.recorded(watch=False)}
        assert {"/api/v1/pods", "/api/v1/persistentvolumes"} <= listed
    finally:
        api.stop()
