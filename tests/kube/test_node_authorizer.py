"""label-rbac as the node authorizer (README "Node authorizer"), through a real API server.

This control plane runs manifests/node-authorizer: no in-tree Node authorizer, label-rbac
(``serve --node-authorizer``) then RBAC with its fixed system:node policy. A kubelet may read a
Secret only while a pod bound to it uses it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.kube.cluster import LabelRbacCluster
from tests.kube.controlplane import ADMIN
from tests.kube.support import eventually, fresh_namespace, install_tenants, obj

NODE_1 = "system:node:node-1"
NODE_2 = "system:node:node-2"


@pytest.fixture
def ns(kube_node_authorizer: LabelRbacCluster) -> Iterator[str]:
    name = fresh_namespace(kube_node_authorizer)
    yield name
    kube_node_authorizer.kubectl(ADMIN, "delete", "namespace", name, "--wait=false")


def pod_using(ns: str, name: str, node: str, secret: str) -> dict[str, object]:
    return obj(
        "Pod",
        name,
        ns,
        spec={
            "nodeName": node,
            "automountServiceAccountToken": False,
            "containers": [{"name": "c", "image": "busybox"}],
            "volumes": [{"name": "s", "secret": {"secretName": secret}}],
        },
    )


def get_secret(cluster: LabelRbacCluster, user: str, ns: str, name: str) -> tuple[int, str]:
    done = cluster.kubectl(user, "-n", ns, "get", "secret", name, "-o", "name")
    return done.returncode, done.stdout + done.stderr


def test_a_node_reads_the_secrets_of_its_pods_only(
    kube_node_authorizer: LabelRbacCluster, ns: str
) -> None:
    cluster = kube_node_authorizer
    cluster.apply(ADMIN, [obj("Secret", s, ns, stringData={"k": "v"}) for s in ("used", "unused")])
    cluster.apply(ADMIN, [pod_using(ns, "p", "node-1", "used")])

    def readable() -> None:
        status, output = get_secret(cluster, NODE_1, ns, "used")
        assert status == 0, output

    eventually(readable)
    for user, secret in ((NODE_1, "unused"), (NODE_2, "used")):
        status, output = get_secret(cluster, user, ns, secret)
        assert status != 0
        assert f'secrets "{secret}" is forbidden: User "{user}" cannot get resource' in output
        node = user.removeprefix("system:node:")
        assert f"no relationship found between node '{node}' and this object" in output

    cluster.kubectl(ADMIN, "-n", ns, "delete", "pod", "p", "--grace-period=0", "--force")

    def revoked() -> None:
        status, output = get_secret(cluster, NODE_1, ns, "used")
        assert status != 0, output
        assert "no relationship found between node 'node-1' and this object" in output

    eventually(revoked)


def test_a_tenants_reads_are_still_label_scoped(
    kube_node_authorizer: LabelRbacCluster, ns: str
) -> None:
    install_tenants(kube_node_authorizer, ns)
    done = kube_node_authorizer.kubectl("alice", "-n", ns, "get", "secrets")
    assert done.returncode != 0
    assert "only with a label selector within team in [a] (add -l team=a)" in done.stderr
