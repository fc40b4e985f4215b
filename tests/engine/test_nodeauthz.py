"""The node authorizer's rule: every verb and resource a kubelet asks for, against a small graph."""

from __future__ import annotations

from typing import Any

import pytest

from app.engine.context import Context
from app.engine.model import Access, AccessDecision, Resource, UserInfo, Verdict
from app.engine.nodeauthz import check_node_read
from app.engine.nodegraph import NodeGraph
from app.engine.selectors import IN, NOT_IN, Requirement
from tests.support import persistent_volume, pod, snapshot

NODE1 = UserInfo("system:node:node1", ("system:nodes", "system:authenticated"))
GRAPH = NodeGraph.from_objects(
    (obj["kind"], obj)
    for obj in (
        pod(
            "web-a",
            serviceAccountName="web",
            volumes=[
                {"name": "s", "secret": {"secretName": "s-ref"}},
                {"name": "d", "persistentVolumeClaim": {"claimName": "data"}},
            ],
            containers=[{"name": "c", "envFrom": [{"configMapRef": {"name": "cm-a"}}]}],
        ),
        pod("web-b", node="node2", volumes=[{"name": "s", "secret": {"secretName": "s-other"}}]),
        persistent_volume("pv-data", claim="data"),
        persistent_volume("pv-other", claim="elsewhere"),
        {"kind": "VolumeAttachment", "metadata": {"name": "va-1"}, "spec": {"nodeName": "node1"}},
        {"kind": "VolumeAttachment", "metadata": {"name": "va-2"}, "spec": {"nodeName": "node2"}},
    )
)
CTX = Context(snapshot(), nodes=GRAPH)

NO_RELATIONSHIP = "no relationship found between node 'node1' and this object"
ALLOW, DENY = Verdict.ALLOW, Verdict.DENY


def access(
    verb: str,
    resource: str,
    name: str = "",
    namespace: str = "t1",
    user: UserInfo = NODE1,
    fields: tuple[Requirement, ...] | None = None,
) -> Access:
    return Access(user, verb, Resource.parse(resource), "v1", namespace, name, fields=fields)


def field(key: str, *values: str, operator: str = IN) -> tuple[Requirement, ...]:
    return (Requirement(key, operator, values),)


def decide(req: Access, ctx: Context = CTX) -> AccessDecision | None:
    return check_node_read(req, ctx)


CASES = [
    # Objects reached through the graph.
    pytest.param(access("get", "secrets", "s-ref"), ALLOW, "", id="get-referenced-secret"),
    pytest.param(
        access("get", "secrets", "s-other"), DENY, NO_RELATIONSHIP, id="get-other-nodes-secret"
    ),
    pytest.param(
        access("get", "secrets", "s-ref", "t2"),
        DENY,
        NO_RELATIONSHIP,
        id="get-secret-other-namespace",
    ),
    pytest.param(access("list", "secrets", "s-ref"), ALLOW, "", id="list-one-referenced-secret"),
    pytest.param(access("watch", "secrets", "s-ref"), ALLOW, "", id="watch-one-referenced-secret"),
    pytest.param(access("list", "secrets"), DENY, "No Object name found", id="list-all-secrets"),
    pytest.param(
        access("list", "secrets", namespace=""),
        DENY,
        "can only read namespaced object of this type",
        id="list-secrets-cluster-wide",
    ),
    pytest.param(
        access("update", "secrets", "s-ref"),
        DENY,
        "can only read resources of this type",
        id="update-referenced-secret",
    ),
    pytest.param(
        access("create", "secrets"),
        DENY,
        "can only read resources of this type",
        id="create-secret",
    ),
    pytest.param(
        access("get", "secrets/status", "s-ref"),
        DENY,
        "cannot read subresource",
        id="secret-subresource",
    ),
    pytest.param(access("get", "configmaps", "cm-a"), ALLOW, "", id="get-envfrom-configmap"),
    pytest.param(
        access("get", "configmaps", "cm-b"), DENY, NO_RELATIONSHIP, id="get-unreferenced-configmap"
    ),
    pytest.param(access("get", "persistentvolumeclaims", "data"), ALLOW, "", id="get-mounted-pvc"),
    pytest.param(
        access("get", "persistentvolumeclaims", "elsewhere"),
        DENY,
        NO_RELATIONSHIP,
        id="get-unmounted-pvc",
    ),
    pytest.param(
        access("list", "persistentvolumeclaims", "data"),
        DENY,
        "can only get individual resources of this type",
        id="list-pvc",
    ),
    pytest.param(
        access("patch", "persistentvolumeclaims/status", "data"),
        ALLOW,
        "",
        id="patch-mounted-pvc-status",
    ),
    pytest.param(
        access("patch", "persistentvolumeclaims/status", "elsewhere"),
        DENY,
        NO_RELATIONSHIP,
        id="patch-other-pvc-status",
    ),
    pytest.param(
        access("get", "persistentvolumeclaims/status", "data"),
        DENY,
        "can only get/update/patch this type",
        id="get-pvc-status",
    ),
    pytest.param(
        access("get", "persistentvolumes", "pv-data", ""), ALLOW, "", id="get-pv-of-mounted-claim"
    ),
    pytest.param(
        access("get", "persistentvolumes", "pv-other", ""),
        DENY,
        NO_RELATIONSHIP,
        id="get-pv-of-other-claim",
    ),
    pytest.param(
        access("get", "persistentvolumes", "pv-unknown", ""),
        DENY,
        NO_RELATIONSHIP,
        id="get-unknown-pv",
    ),
    pytest.param(
        access("create", "serviceaccounts/token", "web"),
        ALLOW,
        "",
        id="token-for-pod-service-account",
    ),
    pytest.param(
        access("create", "serviceaccounts/token", "default"),
        DENY,
        NO_RELATIONSHIP,
        id="token-for-other-service-account",
    ),
    pytest.param(
        access("create", "serviceaccounts/token"),
        DENY,
        "can only create tokens for individual service accounts",
        id="token-without-name",
    ),
    pytest.param(
        access("get", "serviceaccounts", "web"),
        DENY,
        "can only create tokens for individual service accounts",
        id="get-service-account",
    ),
    pytest.param(
        access("create", "serviceaccounts/other", "web"),
        DENY,
        "can only create token subresource of serviceaccount",
        id="other-sa-subresource",
    ),
    pytest.param(
        access("get", "resourceclaims.resource.k8s.io", "gpu"),
        DENY,
        NO_RELATIONSHIP,
        id="get-unreferenced-resource-claim",
    ),
    # Its own Node.
    pytest.param(access("get", "nodes", "node1", ""), ALLOW, "", id="get-own-node"),
    pytest.param(
        access("get", "nodes", "node2", ""),
        DENY,
        "node 'node1' cannot read 'node2', only its own Node object",
        id="get-other-node",
    ),
    pytest.param(
        access("list", "nodes", "node1", "", fields=field("metadata.name", "node1")),
        ALLOW,
        "",
        id="list-own-node-by-name",
    ),
    pytest.param(
        access("watch", "nodes", namespace=""),
        DENY,
        "node 'node1' cannot read all nodes, only its own Node object",
        id="watch-all-nodes",
    ),
    pytest.param(access("create", "nodes", namespace=""), ALLOW, "", id="create-node"),
    pytest.param(access("patch", "nodes/status", "node1", ""), ALLOW, "", id="patch-node-status"),
    pytest.param(
        access("delete", "nodes", "node1", ""),
        DENY,
        "node 'node1' cannot delete nodes",
        id="delete-node",
    ),
    pytest.param(
        access("get", "nodes/proxy", "node1", ""), DENY, "cannot get nodes/proxy", id="node-proxy"
    ),
    # Pods.
    pytest.param(
        access("list", "pods", namespace="", fields=field("spec.nodeName", "node1")),
        ALLOW,
        "",
        id="list-own-pods",
    ),
    pytest.param(
        access("watch", "pods", namespace="", fields=field("spec.nodeName", "node1")),
        ALLOW,
        "",
        id="watch-own-pods",
    ),
    pytest.param(
        access("list", "pods", namespace=""),
        DENY,
        "can only list/watch pods with spec.nodeName field selector",
        id="list-all-pods",
    ),
    pytest.param(
        access("list", "pods", namespace="", fields=field("spec.nodeName", "node2")),
        DENY,
        "spec.nodeName field selector",
        id="list-other-nodes-pods",
    ),
    pytest.param(
        access("list", "pods", namespace="", fields=field("spec.nodeName", "node1", "node2")),
        DENY,
        "spec.nodeName field selector",
        id="list-pods-of-two-nodes",
    ),
    pytest.param(
        access(
            "list", "pods", namespace="", fields=field("spec.nodeName", "node2", operator=NOT_IN)
        ),
        DENY,
        "spec.nodeName field selector",
        id="list-pods-not-on-node2",
    ),
    pytest.param(access("list", "pods", "web-a"), ALLOW, "", id="list-own-pod-by-name"),
    pytest.param(
        access("watch", "pods", "web-b"), DENY, NO_RELATIONSHIP, id="watch-other-nodes-pod-by-name"
    ),
    pytest.param(access("get", "pods", "web-a"), ALLOW, "", id="get-own-pod"),
    pytest.param(access("get", "pods", "web-b"), DENY, NO_RELATIONSHIP, id="get-other-nodes-pod"),
    pytest.param(access("create", "pods"), ALLOW, "", id="create-mirror-pod"),
    pytest.param(access("delete", "pods", "web-a"), ALLOW, "", id="delete-pod"),
    pytest.param(access("patch", "pods/status", "web-a"), ALLOW, "", id="patch-pod-status"),
    pytest.param(access("create", "pods/eviction", "web-a"), ALLOW, "", id="evict-pod"),
    pytest.param(
        access("update", "pods", "web-a"), DENY, "node 'node1' cannot update pods", id="update-pod"
    ),
    pytest.param(
        access("create", "pods/exec", "web-a"), DENY, "cannot create pods/exec", id="exec-into-pod"
    ),
    pytest.param(
        access("get", "pods/log", "web-a"), DENY, "cannot get pods/log", id="read-pod-log"
    ),
    # Leases and CSINodes: its own only.
    pytest.param(
        access("update", "leases.coordination.k8s.io", "node1", "kube-node-lease"),
        ALLOW,
        "",
        id="renew-own-lease",
    ),
    pytest.param(
        access("create", "leases.coordination.k8s.io", "", "kube-node-lease"),
        ALLOW,
        "",
        id="create-lease",
    ),
    pytest.param(
        access("update", "leases.coordination.k8s.io", "node2", "kube-node-lease"),
        DENY,
        "same name as the requesting node",
        id="renew-other-lease",
    ),
    pytest.param(
        access("get", "leases.coordination.k8s.io", "node1", "kube-system"),
        DENY,
        'can only access leases in the "kube-node-lease" system namespace',
        id="lease-elsewhere",
    ),
    pytest.param(
        access("list", "leases.coordination.k8s.io", "", "kube-node-lease"),
        DENY,
        "can only get, create, update, patch, or delete a node lease",
        id="list-leases",
    ),
    pytest.param(
        access("patch", "csinodes.storage.k8s.io", "node1", ""), ALLOW, "", id="patch-own-csinode"
    ),
    pytest.param(
        access("get", "csinodes.storage.k8s.io", "node2", ""),
        DENY,
        "same name as the requesting node",
        id="get-other-csinode",
    ),
    pytest.param(
        access("watch", "csinodes.storage.k8s.io", "", ""),
        DENY,
        "can only get, create, update, patch, or delete a CSINode",
        id="watch-csinodes",
    ),
    pytest.param(
        access("get", "volumeattachments.storage.k8s.io", "va-1", ""),
        ALLOW,
        "",
        id="get-own-volume-attachment",
    ),
    pytest.param(
        access("get", "volumeattachments.storage.k8s.io", "va-2", ""),
        DENY,
        NO_RELATIONSHIP,
        id="get-other-nodes-volume-attachment",
    ),
    pytest.param(
        access("list", "volumeattachments.storage.k8s.io", "", ""),
        DENY,
        "can only get individual resources of this type",
        id="list-volume-attachments",
    ),
]


@pytest.mark.parametrize(("req", "verdict", "message"), CASES)
def test_node_requests(req: Access, verdict: Verdict, message: str) -> None:
    decision = decide(req)
    assert decision is not None
    assert decision.verdict is verdict, decision
    assert message in decision.message
    if verdict is DENY:
        assert decision.message and decision.reason == "NodeAuthorizer"


NO_OPINION = [
    pytest.param(access("get", "services", "kubernetes", "default"), id="services-left-to-rbac"),
    pytest.param(access("create", "events", "", "t1"), id="events-left-to-rbac"),
    pytest.param(
        access("get", "resourceslices.resource.k8s.io", "slice", ""),
        id="resourceslices-left-to-rbac",
    ),
    pytest.param(
        access("create", "certificatesigningrequests.certificates.k8s.io", "", ""),
        id="csr-left-to-rbac",
    ),
    pytest.param(
        access("get", "secrets", "s-ref", user=UserInfo("alice", ("tenants",))), id="not-a-node"
    ),
    pytest.param(
        access("get", "secrets", "s-ref", user=UserInfo("system:node:node1", ())),
        id="node-name-without-group",
    ),
    pytest.param(
        access("get", "secrets", "s-ref", user=UserInfo("node1", ("system:nodes",))),
        id="group-without-node-name",
    ),
]


@pytest.mark.parametrize("req", NO_OPINION)
def test_everything_else_is_left_to_the_next_check(req: Access) -> None:
    assert decide(req) is None


def test_a_node_user_without_a_name_is_denied() -> None:
    user = UserInfo("system:node:", ("system:nodes",))
    decision = decide(access("get", "configmaps", "cm-a", user=user))
    assert decision is not None and decision.verdict is DENY
    assert decision.message == 'unknown node for user "system:node:"'


def test_without_a_graph_nothing_is_related() -> None:
    decision = decide(access("get", "secrets", "s-ref"), Context(snapshot()))
    assert decision is not None and decision.verdict is DENY
    assert decision.message == NO_RELATIONSHIP


@pytest.mark.parametrize(
    "fields",
    [
        pytest.param(None, id="unparsable-selector"),
        pytest.param(
            (
                Requirement("spec.nodeName", IN, ("node1",)),
                Requirement("metadata.name", NOT_IN, ("x",)),
            ),
            id="with-other-terms",
        ),
    ],
)
def test_pod_lists_need_the_node_field_selector(fields: Any) -> None:
    decision = decide(access("list", "pods", namespace="", fields=fields))
    assert decision is not None
    expected = DENY if fields is None else ALLOW
    assert decision.verdict is expected
