"""Node-scoped rules through a real API server (README "Node-scoped rules").

The in-tree NodeRestriction admission plugin is off in this control plane, so what stops a
kubelet below is the webhook's nodes.labelrbac.io entry. Kubelets are node-1 and node-2
(``system:node:<name>`` in ``system:nodes``), writing as a kubelet does.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.kube.cluster import LabelRbacCluster
from tests.kube.controlplane import ADMIN
from tests.kube.support import eventually, obj

NODE_1 = "system:node:node-1"
NODE_2 = "system:node:node-2"
WEBHOOK_DENIED = 'admission webhook "nodes.labelrbac.io" denied the request: '


@pytest.fixture(scope="module")
def nodes(kube: LabelRbacCluster) -> dict[str, str]:
    """node-1 and node-2 registered by their kubelets: name → uid."""
    uids = {}
    for user in (NODE_1, NODE_2):
        name = user.removeprefix("system:node:")
        kube.apply(user, [{"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}])
        done = kube.kubectl(ADMIN, "get", "node", name, "-o", "jsonpath={.metadata.uid}")
        uids[name] = done.stdout
    return uids


def mirror_pod(
    ns: str, name: str, node: str, uid: str, labels: dict[str, str] | None = None, **spec: Any
) -> dict[str, Any]:
    """A static pod's mirror as the kubelet writes it: annotation, nodeName, owned by the Node."""
    pod = obj(
        "Pod",
        name,
        ns,
        labels,
        spec={"nodeName": node, "containers": [{"name": "c", "image": "busybox"}], **spec},
    )
    pod["metadata"]["annotations"] = {"kubernetes.io/config.mirror": "hash"}
    pod["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid, "controller": True}
    ]
    return pod


def create(kube: LabelRbacCluster, user: str, document: dict[str, Any]) -> tuple[int, str]:
    done = kube.kubectl(user, "create", "-f", "-", input=yaml.safe_dump(document))
    return done.returncode, done.stdout + done.stderr


def test_a_node_creates_its_own_mirror_pod(
    kube: LabelRbacCluster, nodes: dict[str, str], namespace: str
) -> None:
    status, output = create(kube, NODE_1, mirror_pod(namespace, "m", "node-1", nodes["node-1"]))
    assert status == 0, output
    done = kube.kubectl(NODE_1, "-n", namespace, "delete", "pod", "m", "--wait=false")
    assert done.returncode == 0, done.stderr


def _without_annotation(pod: dict[str, Any]) -> None:
    del pod["metadata"]["annotations"]


def _on_node_2(pod: dict[str, Any]) -> None:
    pod["spec"]["nodeName"] = "node-2"


def _with_configmap(pod: dict[str, Any]) -> None:
    # (A secret is refused before the webhook: the API server's ServiceAccount admission
    # plugin turns away mirror pods that reference secrets or service accounts.)
    pod["spec"]["volumes"] = [{"name": "c", "configMap": {"name": "settings"}}]


def _with_claim(pod: dict[str, Any]) -> None:
    pod["spec"]["volumes"] = [{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]


def _owned_by_node_2(pod: dict[str, Any]) -> None:
    pod["metadata"]["ownerReferences"][0]["name"] = "node-2"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        pytest.param(_without_annotation, 'pod does not have "kubernetes.io/config.mirror" '
                     'annotation, node "node-1" can only create mirror pods', id="not-a-mirror"),
        pytest.param(_on_node_2, 'node "node-1" can only create pods with spec.nodeName set to '
                     "itself", id="other-node"),
        pytest.param(_with_configmap, 'node "node-1" can not create pods that reference '
                     "configmaps", id="references-a-configmap"),
        pytest.param(_with_claim, 'node "node-1" can not create pods that reference '
                     "persistentvolumeclaims", id="references-a-claim"),
        pytest.param(_owned_by_node_2, 'node "node-1" can only create pods with an owner '
                     "reference set to itself", id="owned-by-another-node"),
    ],
)  # fmt: skip
def test_a_node_creates_nothing_but_its_mirror_pods(
    kube: LabelRbacCluster, nodes: dict[str, str], namespace: str, change: Any, message: str
) -> None:
    pod = mirror_pod(namespace, "m", "node-1", nodes["node-1"])
    change(pod)
    status, output = create(kube, NODE_1, pod)
    assert status != 0
    assert WEBHOOK_DENIED + message in output


def test_mirror_pod_labels_need_the_namespaces_consent(
    kube: LabelRbacCluster, nodes: dict[str, str], namespace: str
) -> None:
    """A node may not label a mirror pod into a Service's or a controller's selector, unless
    the namespace lists the key in node.kubernetes.io/mirror.allowed-label-keys."""
    pod = mirror_pod(namespace, "m", "node-1", nodes["node-1"], {"component": "etcd"})
    status, output = create(kube, NODE_1, pod)
    assert status != 0
    assert (
        f'node "node-1" can not create mirror pods with labels (component) in namespace '
        f'"{namespace}": the namespace has no "node.kubernetes.io/mirror.allowed-label-keys" '
        "annotation"
    ) in output
    consent = "node.kubernetes.io/mirror.allowed-label-keys=component, tier"
    allow = kube.kubectl(ADMIN, "annotate", "namespace", namespace, consent)
    assert allow.returncode == 0, allow.stderr

    def consented() -> None:
        status, output = create(kube, NODE_1, pod)
        assert status == 0, output

    eventually(consented)


def test_a_node_deletes_only_its_own_pods(
    kube: LabelRbacCluster, nodes: dict[str, str], namespace: str
) -> None:
    for node, user in (("node-1", NODE_1), ("node-2", NODE_2)):
        status, output = create(kube, user, mirror_pod(namespace, f"m-{node}", node, nodes[node]))
        assert status == 0, output
    other = kube.kubectl(NODE_1, "-n", namespace, "delete", "pod", "m-node-2", "--wait=false")
    assert other.returncode != 0
    assert (
        WEBHOOK_DENIED + 'node "node-1" can only delete pods with spec.nodeName set to itself'
        in other.stderr
    )
    own = kube.kubectl(NODE_1, "-n", namespace, "delete", "pod", "m-node-1", "--wait=false")
    assert own.returncode == 0, own.stderr


@pytest.mark.parametrize(
    ("user", "target", "patch", "message"),
    [
        pytest.param(NODE_1, "node-2", {"metadata": {"labels": {"team": "x"}}},
                     'node "node-1" is not allowed to modify node "node-2"', id="another-node"),
        pytest.param(NODE_1, "node-1",
                     {"metadata": {"labels": {"node-role.kubernetes.io/worker": ""}}},
                     'node "node-1" is not allowed to modify labels: '
                     "node-role.kubernetes.io/worker",
                     id="reserved-label"),
        pytest.param(NODE_1, "node-1",
                     {"spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}},
                     'node "node-1" is not allowed to modify taints', id="taints"),
    ],
)  # fmt: skip
def test_a_node_edits_only_its_own_node_within_limits(
    kube: LabelRbacCluster,
    nodes: dict[str, str],
    user: str,
    target: str,
    patch: dict[str, Any],
    message: str,
) -> None:
    """PATCHed as a kubelet does, without reading the Node first (kubectl would GET it, and the
    in-tree Node authorizer lets a node read only its own)."""
    status, body = kube.control_plane.request(
        user, "PATCH", f"/api/v1/nodes/{target}", patch,
        content_type="application/merge-patch+json",
    )  # fmt: skip
    assert status == 403, body
    assert body["message"] == WEBHOOK_DENIED + message


def test_a_node_labels_its_own_node_with_its_own_keys(
    kube: LabelRbacCluster, nodes: dict[str, str]
) -> None:
    done = kube.kubectl(NODE_1, "label", "node", "node-1", "example.com/team=x", "--overwrite")
    assert done.returncode == 0, done.stderr


def test_a_node_updates_the_status_of_its_own_pods_only(
    kube: LabelRbacCluster, nodes: dict[str, str], namespace: str
) -> None:
    """pods/status goes to pod-status.labelrbac.io (failing open, but judged while up)."""
    for node, user in (("node-1", NODE_1), ("node-2", NODE_2)):
        status, output = create(kube, user, mirror_pod(namespace, f"m-{node}", node, nodes[node]))
        assert status == 0, output
    patch = {"status": {"phase": "Running"}}
    path = f"/api/v1/namespaces/{namespace}/pods/{{}}/status"
    status, body = kube.control_plane.request(
        NODE_1, "PATCH", path.format("m-node-2"), patch,
        content_type="application/merge-patch+json",
    )  # fmt: skip
    assert status == 403, body
    assert body["message"] == (
        'admission webhook "pod-status.labelrbac.io" denied the request: node "node-1" can only '
        "update pod status for pods with spec.nodeName set to itself"
    )
    status, body = kube.control_plane.request(
        NODE_1, "PATCH", path.format("m-node-1"), patch,
        content_type="application/merge-patch+json",
    )  # fmt: skip
    assert status == 200, body
    assert body["status"]["phase"] == "Running"


def test_a_kubelet_reads_its_pods_secrets_past_label_rbac(
    kube: LabelRbacCluster, namespace: str
) -> None:
    """The shipped matchConditions keep kubelets away from label-rbac's authorizer (the in-tree
    Node authorizer decides), even for label-restricted resources."""
    kube.apply(ADMIN, [obj("Secret", "db", namespace, {"team": "a"}, stringData={"k": "v"})])
    pod = obj("Pod", "p", namespace, {"team": "a"}, spec={
        "nodeName": "node-1", "automountServiceAccountToken": False,
        "containers": [{"name": "c", "image": "busybox"}],
        "volumes": [{"name": "s", "secret": {"secretName": "db"}}],
    })  # fmt: skip
    kube.apply(ADMIN, [pod])

    def readable() -> None:
        done = kube.kubectl(NODE_1, "-n", namespace, "get", "secret", "db", "-o", "name")
        assert done.returncode == 0, done.stderr

    eventually(readable)
    other = kube.kubectl(NODE_2, "-n", namespace, "get", "secret", "db")
    assert other.returncode != 0
    assert "no relationship found between node 'node-2' and this object" in other.stderr
