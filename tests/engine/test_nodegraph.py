"""The node graph: what pods reference, and which node reaches what as pods come, go and move."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from app.engine.nodegraph import (
    NodeGraph,
    compile_attachment,
    compile_pod,
    compile_volume,
    graph_references,
)
from app.engine.podrefs import PodRef
from tests.support import persistent_volume, pod


def graph_of(*objects: dict[str, Any]) -> NodeGraph:
    return NodeGraph.from_objects((obj["kind"], obj) for obj in objects)


def secret_volume(secret: str, name: str = "s") -> dict[str, Any]:
    return {"name": name, "secret": {"secretName": secret}}


def container(**fields: Any) -> dict[str, Any]:
    return {"name": "c", "image": "nginx", **fields}


# --- what a pod references -------------------------------------------------------------------

REFERENCES = [
    pytest.param({"serviceAccountName": "builder"}, "serviceaccounts", "builder", id="sa"),
    pytest.param({"imagePullSecrets": [{"name": "pull"}]}, "secrets", "pull", id="pull-secret"),
    pytest.param({"volumes": [secret_volume("vol")]}, "secrets", "vol", id="secret-volume"),
    pytest.param(
        {"volumes": [{"name": "v", "configMap": {"name": "cfg"}}]},
        "configmaps",
        "cfg",
        id="configmap-volume",
    ),
    pytest.param(
        {"volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "data"}}]},
        "persistentvolumeclaims",
        "data",
        id="pvc-volume",
    ),
    pytest.param(
        {"volumes": [{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {}}}]},
        "persistentvolumeclaims",
        "web-scratch",
        id="ephemeral-volume-claim",
    ),
    pytest.param(
        {"volumes": [{"name": "v", "csi": {"driver": "d", "nodePublishSecretRef": {"name": "c"}}}]},
        "secrets",
        "c",
        id="csi-node-publish-secret",
    ),
    pytest.param(
        {"volumes": [{"name": "v", "rbd": {"secretRef": {"name": "ceph"}}}]},
        "secrets",
        "ceph",
        id="rbd-secret",
    ),
    pytest.param(
        {"volumes": [{"name": "v", "azureFile": {"secretName": "az", "shareName": "s"}}]},
        "secrets",
        "az",
        id="azurefile-secret",
    ),
    pytest.param(
        {"volumes": [{"name": "v", "projected": {"sources": [{"secret": {"name": "ps"}}]}}]},
        "secrets",
        "ps",
        id="projected-secret",
    ),
    pytest.param(
        {"volumes": [{"name": "v", "projected": {"sources": [{"configMap": {"name": "pc"}}]}}]},
        "configmaps",
        "pc",
        id="projected-configmap",
    ),
    pytest.param(
        {
            "containers": [
                container(
                    env=[{"name": "E", "valueFrom": {"secretKeyRef": {"name": "es", "key": "k"}}}]
                )
            ]
        },
        "secrets",
        "es",
        id="env-secret",
    ),
    pytest.param(
        {
            "containers": [
                container(
                    env=[
                        {"name": "E", "valueFrom": {"configMapKeyRef": {"name": "ec", "key": "k"}}}
                    ]
                )
            ]
        },
        "configmaps",
        "ec",
        id="env-configmap",
    ),
    pytest.param(
        {"initContainers": [container(envFrom=[{"secretRef": {"name": "init-s"}}])]},
        "secrets",
        "init-s",
        id="init-container-envfrom-secret",
    ),
    pytest.param(
        {"ephemeralContainers": [container(envFrom=[{"configMapRef": {"name": "dbg"}}])]},
        "configmaps",
        "dbg",
        id="ephemeral-container-envfrom-configmap",
    ),
    pytest.param(
        {"resourceClaims": [{"name": "gpu", "resourceClaimName": "gpu-claim"}]},
        "resourceclaims",
        "gpu-claim",
        id="resource-claim",
    ),
]


@pytest.mark.parametrize(("spec", "resource", "name"), REFERENCES)
def test_each_reference_reaches_the_pods_node_only(
    spec: dict[str, Any], resource: str, name: str
) -> None:
    binding = compile_pod(pod("web", **spec))
    assert binding is not None and binding.refs == {PodRef(resource, name)}
    graph = graph_of(pod("web", **spec))
    assert graph.related("node1", resource, "t1", name)
    assert not graph.related("node2", resource, "t1", name)
    # The same name in another namespace is another object.
    assert not graph.related("node1", resource, "t2", name)


def test_a_generated_resource_claim_is_reached_once_the_status_names_it() -> None:
    spec = {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "gpu-template"}]}
    pending = pod("web", **spec)
    assert graph_references(pending, "web") == frozenset()
    generated = {
        **pending,
        "status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "web-gpu-x1"}]},
    }
    assert graph_of(generated).related("node1", "resourceclaims", "t1", "web-gpu-x1")
    assert not graph_of(generated).related("node1", "resourceclaims", "t1", "gpu-template")


def test_controller_secrets_and_unrelated_fields_reference_nothing() -> None:
    spec = {
        "volumes": [
            {"name": "e", "emptyDir": {}},
            {"name": "h", "hostPath": {"path": "/x"}},
            {"name": "v", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}},
        ],
        "containers": [container(env=[{"name": "A", "value": "literal"}])],
    }
    assert graph_references(pod("web", **spec), "web") == frozenset()


MALFORMED = [
    pytest.param({"volumes": "not-a-list"}, id="volumes-not-a-list"),
    pytest.param({"volumes": [None, 3, "x"]}, id="volume-items-not-objects"),
    pytest.param({"volumes": [{"name": "v", "secret": "s"}]}, id="secret-source-not-object"),
    pytest.param(
        {"volumes": [{"name": "v", "secret": {"secretName": ["a"]}}]}, id="name-not-string"
    ),
    pytest.param({"containers": [{"env": [{"valueFrom": []}]}]}, id="valuefrom-not-object"),
    pytest.param({"imagePullSecrets": [{"name": None}]}, id="pull-secret-null"),
    pytest.param(
        {"resourceClaims": [{"name": ["x"], "resourceClaimTemplateName": "t"}]},
        id="claim-name-list",
    ),
    pytest.param({"serviceAccountName": {"x": 1}}, id="sa-not-string"),
]


@pytest.mark.parametrize("spec", MALFORMED)
def test_malformed_specs_reference_nothing_and_never_raise(spec: dict[str, Any]) -> None:
    obj = pod("web")
    obj["spec"] = {"nodeName": "node1", **spec}
    obj["status"] = {"resourceClaimStatuses": [{"name": ["x"]}]}
    binding = compile_pod(obj)
    assert binding is not None and binding.refs == frozenset()


@pytest.mark.parametrize(
    "obj",
    [
        pytest.param(pod("web", node=""), id="unscheduled"),
        pytest.param(
            {"kind": "Pod", "metadata": None, "spec": {"nodeName": "n"}}, id="no-metadata"
        ),
        pytest.param(
            {"kind": "Pod", "metadata": {"name": "p", "namespace": "t1"}, "spec": []},
            id="spec-list",
        ),
        pytest.param({**pod("web"), "spec": {"nodeName": 7}}, id="node-not-string"),
    ],
)
def test_unscheduled_or_malformed_pods_are_not_in_the_graph(obj: dict[str, Any]) -> None:
    assert compile_pod(obj) is None


def test_a_mirror_pod_reaches_its_node_but_grants_no_references() -> None:
    mirror = pod(
        "static-web",
        annotations={"kubernetes.io/config.mirror": "hash"},
        volumes=[secret_volume("creds")],
    )
    graph = graph_of(mirror)
    assert graph.related("node1", "pods", "t1", "static-web")
    assert not graph.related("node1", "secrets", "t1", "creds")


# --- the graph as pods come and go -----------------------------------------------------------


def test_pod_added_then_deleted() -> None:
    graph = NodeGraph()
    web = compile_pod(pod("web", volumes=[secret_volume("s-ref")]))
    assert not graph.related("node1", "secrets", "t1", "s-ref")
    graph.update_pod(None, web)
    assert graph.related("node1", "secrets", "t1", "s-ref")
    assert graph.related("node1", "pods", "t1", "web")
    assert graph.pods == 1
    graph.update_pod(web, None)
    assert not graph.related("node1", "secrets", "t1", "s-ref")
    assert not graph.related("node1", "pods", "t1", "web")
    assert graph.pods == 0 and len(graph) == 0


def test_pod_moved_to_another_node() -> None:
    graph = NodeGraph()
    on_node1 = compile_pod(pod("web", volumes=[secret_volume("s-ref")]))
    on_node2 = compile_pod(pod("web", node="node2", volumes=[secret_volume("s-ref")]))
    graph.update_pod(None, on_node1)
    graph.update_pod(on_node1, on_node2)
    assert graph.nodes_reaching("secrets", "t1", "s-ref") == {"node2"}
    assert not graph.related("node1", "pods", "t1", "web")
    assert graph.related("node2", "pods", "t1", "web")


def test_an_object_stays_reachable_while_another_pod_on_the_node_references_it() -> None:
    graph = NodeGraph()
    shared = {"volumes": [{"name": "v", "configMap": {"name": "kube-root-ca.crt"}}]}
    a, b = compile_pod(pod("a", **shared)), compile_pod(pod("b", **shared))
    c = compile_pod(pod("c", node="node2", **shared))
    for binding in (a, b, c):
        graph.update_pod(None, binding)
    assert graph.nodes_reaching("configmaps", "t1", "kube-root-ca.crt") == {"node1", "node2"}
    graph.update_pod(a, None)
    assert graph.related("node1", "configmaps", "t1", "kube-root-ca.crt")
    graph.update_pod(b, None)
    assert graph.nodes_reaching("configmaps", "t1", "kube-root-ca.crt") == {"node2"}


def test_a_changed_reference_list_moves_access() -> None:
    graph = NodeGraph()
    before = compile_pod(pod("web", volumes=[secret_volume("old")]))
    after = compile_pod(pod("web", volumes=[secret_volume("new")]))
    graph.update_pod(None, before)
    graph.update_pod(before, after)
    assert not graph.related("node1", "secrets", "t1", "old")
    assert graph.related("node1", "secrets", "t1", "new")
    assert graph.pods == 1


# --- PVC → PV ------------------------------------------------------------------------------------

CLAIMING_POD = pod("db", volumes=[{"name": "v", "persistentVolumeClaim": {"claimName": "data"}}])


def test_a_pv_is_reached_through_its_bound_claim() -> None:
    graph = graph_of(CLAIMING_POD, persistent_volume("pv-1", claim="data"))
    assert graph.related("node1", "persistentvolumes", "", "pv-1")
    assert not graph.related("node2", "persistentvolumes", "", "pv-1")


@pytest.mark.parametrize(
    "pv",
    [
        pytest.param(persistent_volume("pv-1"), id="unbound"),
        pytest.param(persistent_volume("pv-1", claim="other"), id="bound-to-another-claim"),
        pytest.param(
            persistent_volume("pv-1", claim="data", namespace="t2"), id="claim-in-other-namespace"
        ),
    ],
)
def test_a_pv_not_bound_to_a_claim_of_the_node_is_not_reached(pv: dict[str, Any]) -> None:
    assert not graph_of(CLAIMING_POD, pv).related("node1", "persistentvolumes", "", "pv-1")


def test_pv_rebound_and_deleted() -> None:
    graph = graph_of(CLAIMING_POD)
    bound = compile_volume(persistent_volume("pv-1", claim="data"))
    elsewhere = compile_volume(persistent_volume("pv-1", claim="other"))
    graph.update_volume(None, bound)
    assert graph.related("node1", "persistentvolumes", "", "pv-1")
    graph.update_volume(bound, elsewhere)
    assert not graph.related("node1", "persistentvolumes", "", "pv-1")
    graph.update_volume(elsewhere, bound)
    graph.update_volume(bound, None)
    assert not graph.related("node1", "persistentvolumes", "", "pv-1")
    assert graph.volumes == 0


def test_pv_secrets_the_kubelet_uses_are_reached_controller_secrets_are_not() -> None:
    csi = {
        "driver": "d",
        "volumeHandle": "h",
        "nodePublishSecretRef": {"name": "publish", "namespace": "storage"},
        "nodeStageSecretRef": {"name": "stage", "namespace": "storage"},
        "controllerPublishSecretRef": {"name": "controller", "namespace": "storage"},
    }
    graph = graph_of(CLAIMING_POD, persistent_volume("pv-1", claim="data", csi=csi))
    assert graph.related("node1", "secrets", "storage", "publish")
    assert graph.related("node1", "secrets", "storage", "stage")
    assert not graph.related("node1", "secrets", "storage", "controller")
    assert not graph.related("node2", "secrets", "storage", "publish")
    # A plugin secret without a namespace is looked up in the claim's namespace.
    rbd = persistent_volume("pv-2", claim="data", rbd={"secretRef": {"name": "ceph"}})
    assert graph_of(CLAIMING_POD, rbd).related("node1", "secrets", "t1", "ceph")
    # Once the pod is gone, so is everything reached through it.
    graph.update_pod(compile_pod(CLAIMING_POD), None)
    assert not graph.related("node1", "secrets", "storage", "publish")


# --- concurrent readers ------------------------------------------------------------------------


def test_readers_never_see_a_kept_reference_missing_during_updates() -> None:
    """A pod updated again and again keeps one configmap: a reader must never miss it."""
    graph = NodeGraph()
    keep = [{"name": "k", "configMap": {"name": "kept"}}]
    versions = [
        compile_pod(pod("web", volumes=[*keep, secret_volume(f"s{i}", "x")])) for i in range(50)
    ]
    graph.update_pod(None, versions[0])
    stop = threading.Event()
    misses: list[int] = []

    def read() -> None:
        while not stop.is_set():
            if not graph.related("node1", "configmaps", "t1", "kept"):
                misses.append(1)

    readers = [threading.Thread(target=read) for _ in range(2)]
    for thread in readers:
        thread.start()
    for _ in range(40):
        for old, new in zip(versions, versions[1:] + versions[:1], strict=True):
            graph.update_pod(old, new)
    stop.set()
    for thread in readers:
        thread.join()
    assert misses == []
    assert graph.pods == 1


# --- VolumeAttachments ---------------------------------------------------------------------------


def attachment(name: str, node: str) -> dict[str, Any]:
    spec = {"attacher": "csi.example.com", "source": {}, **({"nodeName": node} if node else {})}
    return {"kind": "VolumeAttachment", "metadata": {"name": name}, "spec": spec}


def test_a_volume_attachment_is_reached_by_its_node_only() -> None:
    graph = graph_of(attachment("csi-1", "node1"), attachment("csi-2", ""))
    assert graph.related("node1", "volumeattachments", "", "csi-1")
    assert not graph.related("node2", "volumeattachments", "", "csi-1")
    assert not graph.related("node1", "volumeattachments", "", "csi-2")
    assert compile_attachment(attachment("csi-2", "")) is None
    old, new = (
        compile_attachment(attachment("csi-1", "node1")),
        compile_attachment(attachment("csi-1", "node2")),
    )
    graph.update_attachment(old, new)
    assert graph.related("node2", "volumeattachments", "", "csi-1")
    assert not graph.related("node1", "volumeattachments", "", "csi-1")
    graph.update_attachment(new, None)
    assert not graph.related("node2", "volumeattachments", "", "csi-1")
