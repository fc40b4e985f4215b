"""The node graph fed by pods and PV watches from the loopback API server."""

from __future__ import annotations

from app.engine.context import Context
from app.engine.kinds import GRAPH_KINDS
from app.engine.model import Access, Resource, UserInfo, Verdict
from app.engine.nodeauthz import check_node_read
from app.engine.nodegraph import NodeGraph
from app.source.cluster import ClusterSource
from app.source.static import read_manifests
from tests.kubeapi import FakeKubeAPI, wait_until
from tests.source.helpers import MakeSource
from tests.support import ROOT, persistent_volume, pod

NODE1 = UserInfo("system:node:node1", ("system:nodes",))


def get_secret(source: ClusterSource, name: str, namespace: str = "t1") -> Verdict:
    """node1's ``get secret`` as the node authorizer decides it against the live graph."""
    snapshot = source.snapshot()
    assert snapshot is not None
    access = Access(NODE1, "get", Resource("", "secrets"), "v1", namespace, name)
    decision = check_node_read(access, Context(snapshot, nodes=source.node_graph()))
    assert decision is not None
    return decision.verdict


def secret_pod(name: str, secret: str, node: str = "node1") -> dict[str, object]:
    return pod(name, node=node, volumes=[{"name": "s", "secret": {"secretName": secret}}])


def test_without_the_node_authorizer_pods_are_not_watched(
    kubeapi: FakeKubeAPI, make_source: MakeSource
) -> None:
    source = make_source()
    assert source.node_graph() is None
    assert kubeapi.recorded("pods") == [] and kubeapi.recorded("persistentvolumes") == []


def test_a_pod_makes_its_secret_readable_by_its_node_until_deleted(
    kubeapi: FakeKubeAPI, make_source: MakeSource
) -> None:
    kubeapi.apply("pods", secret_pod("listed", "s-listed"))
    graph = NodeGraph()
    source = make_source(node_graph=graph)
    assert get_secret(source, "s-listed") is Verdict.ALLOW  # from the initial list
    assert "pods" in source.status().detail
    assert get_secret(source, "s-ref") is Verdict.DENY

    kubeapi.apply("pods", secret_pod("web-a", "s-ref"))
    wait_until(lambda: get_secret(source, "s-ref") is Verdict.ALLOW, what="pod added")
    kubeapi.apply("pods", secret_pod("web-b", "s-other", node="node2"))
    wait_until(lambda: graph.related("node2", "pods", "t1", "web-b"), what="pod on node2")
    assert get_secret(source, "s-other") is Verdict.DENY

    kubeapi.delete("pods", "web-a", "t1")
    wait_until(lambda: get_secret(source, "s-ref") is Verdict.DENY, what="pod deleted")
    assert get_secret(source, "s-listed") is Verdict.ALLOW


def test_a_pv_is_readable_through_the_claim_of_a_pod_on_the_node(
    kubeapi: FakeKubeAPI, make_source: MakeSource
) -> None:
    source = make_source(node_graph=NodeGraph())
    graph = source.node_graph()
    assert graph is not None
    kubeapi.apply(
        "pods", pod("db", volumes=[{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}])
    )
    kubeapi.apply("persistentvolumes", persistent_volume("pv-1", claim="data"))
    wait_until(lambda: graph.related("node1", "persistentvolumes", "", "pv-1"), what="pv bound")
    kubeapi.apply("persistentvolumes", persistent_volume("pv-1"))  # released
    wait_until(lambda: not graph.related("node1", "persistentvolumes", "", "pv-1"))


def test_a_relist_catches_a_deletion_the_watch_missed(
    kubeapi: FakeKubeAPI, make_source: MakeSource
) -> None:
    kubeapi.apply("pods", secret_pod("web-a", "s-ref"))
    source = make_source(node_graph=NodeGraph())
    assert get_secret(source, "s-ref") is Verdict.ALLOW
    kubeapi.remove_silently("pods", "web-a", "t1")
    kubeapi.expire_watches("pods")
    wait_until(lambda: get_secret(source, "s-ref") is Verdict.DENY, what="re-list")
    graph = source.node_graph()
    assert graph is not None and graph.pods == 0


def test_pod_churn_does_not_rebuild_the_rbac_snapshot(
    kubeapi: FakeKubeAPI, make_source: MakeSource
) -> None:
    source = make_source(node_graph=NodeGraph())
    before = source.snapshot()
    for i in range(5):
        kubeapi.apply("pods", secret_pod(f"p{i}", f"s{i}"))
    wait_until(lambda: get_secret(source, "s4") is Verdict.ALLOW)
    assert source.snapshot() is before


def test_the_shipped_role_grants_the_graph_watches_and_nothing_more() -> None:
    objects = {
        kind: obj
        for kind, obj in read_manifests(ROOT / "manifests" / "node-authorizer" / "rbac.yaml")
    }
    rules = objects["ClusterRole"]["rules"]
    assert all(rule["verbs"] == ["list", "watch"] for rule in rules)
    granted = {
        (group, resource)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    assert granted == {(spec.group, spec.resource) for spec in GRAPH_KINDS}
    binding = objects["ClusterRoleBinding"]
    assert binding["roleRef"]["name"] == objects["ClusterRole"]["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "label-rbac", "namespace": "label-rbac"}
    ]


def test_a_volume_attachment_is_readable_by_the_node_it_is_attached_to(
    kubeapi: FakeKubeAPI, make_source: MakeSource
) -> None:
    graph = NodeGraph()
    make_source(node_graph=graph)
    attachment = {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "VolumeAttachment",
        "metadata": {"name": "csi-123"},
        "spec": {"attacher": "csi.example.com", "nodeName": "node1", "source": {}},
    }
    kubeapi.apply("volumeattachments", attachment)
    wait_until(lambda: graph.related("node1", "volumeattachments", "", "csi-123"), what="added")
    assert not graph.related("node2", "volumeattachments", "", "csi-123")
    kubeapi.delete("volumeattachments", "csi-123")
    wait_until(lambda: not graph.related("node1", "volumeattachments", "", "csi-123"))
