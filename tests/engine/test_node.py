"""Node-scoped rules: each NodeRestriction rule, the mirror-pod extensions, API validation."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from app.engine.context import Context, ParentUnavailable
from app.engine.decide import evaluate
from app.engine.model import Decision, Request, Resource, UserInfo
from app.engine.node import (
    ALLOWED_LABEL_KEYS_ANNOTATION,
    KUBELET_LABELS,
    MIRROR_ANNOTATION,
    allowed_label_keys,
    check_node,
    is_protected_node_label,
)
from app.engine.rbac import KnownNode, Snapshot
from app.webhook.wire import parse_review
from tests.support import V135_REVIEWS

NODE1_UID = "8aefcc65-67a5-4183-8f8a-9a9f69d9145e"
NODE2_UID = "6154ff63-585d-4cfa-823a-370c3222b4f0"

NODE1 = UserInfo("system:node:node1", ("system:nodes", "system:authenticated"), "node1")
ADMIN = UserInfo("admin", ("system:masters", "system:authenticated"), "admin")

SNAPSHOT = Snapshot.build(
    (),
    (),
    namespaces={
        "kube-system": {ALLOWED_LABEL_KEYS_ANNOTATION: "component,tier"},
        "spaced": {ALLOWED_LABEL_KEYS_ANNOTATION: " component , tier ,"},
        "empty": {ALLOWED_LABEL_KEYS_ANNOTATION: ""},
        "default": {},
    },
    nodes={"node1": KnownNode(NODE1_UID), "node2": KnownNode(NODE2_UID)},
)

Lookup = Callable[[Request], Mapping[str, Any]]


# --- builders -------------------------------------------------------------------------------------


def request(
    operation: str,
    resource: str,
    obj: Mapping[str, Any] | None = None,
    old: Mapping[str, Any] | None = None,
    *,
    user: UserInfo = NODE1,
    name: str | None = None,
    namespace: str | None = None,
    kind: str | None = None,
    group: str = "",
) -> Request:
    """A request as the API server would send it; name, namespace and kind default from objects."""
    base, _, sub = resource.partition("/")
    source = obj if obj is not None else old or {}
    meta = source.get("metadata") or {}
    return Request(
        uid="uid-1",
        operation=operation,
        user=user,
        resource=Resource(group, base, sub),
        kind=kind if kind is not None else source.get("kind", ""),
        namespace=namespace if namespace is not None else meta.get("namespace", ""),
        name=name if name is not None else meta.get("name", ""),
        object=obj,
        old_object=old,
    )


def node(
    name: str = "node1",
    labels: dict[str, str] | None = None,
    taints: list[dict[str, Any]] | None = None,
    config_source: dict[str, Any] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if taints is not None:
        spec["taints"] = taints
    if config_source is not None:
        spec["configSource"] = config_source
    metadata: dict[str, Any] = {"name": name, "uid": NODE1_UID if name == "node1" else NODE2_UID}
    if labels is not None:
        metadata["labels"] = labels
    return {"apiVersion": "v1", "kind": "Node", "metadata": metadata, "spec": spec}


NOT_READY = [{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]
CONFIG_SOURCE = {"configMap": {"name": "kubelet", "namespace": "kube-system"}}


def node_owner(**overrides: Any) -> dict[str, Any]:
    """The owner reference the kubelet puts on its mirror pods."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "name": "node1",
        "uid": NODE1_UID,
        "controller": True,
        **overrides,
    }


def pod(
    name: str = "static-web-node1",
    namespace: str = "kube-system",
    node_name: str | None = "node1",
    *,
    mirror: bool = True,
    labels: dict[str, str] | None = None,
    owners: list[dict[str, Any]] | None = None,
    container: dict[str, Any] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """A pod; by default node1's mirror pod with its node owner reference and no references."""
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if mirror:
        metadata["annotations"] = {MIRROR_ANNOTATION: "abc123", "kubernetes.io/config.hash": "abc"}
        metadata["ownerReferences"] = [node_owner()] if owners is None else owners
    elif owners is not None:
        metadata["ownerReferences"] = owners
    if labels is not None:
        metadata["labels"] = labels
    body: dict[str, Any] = {"containers": [{"name": "web", "image": "nginx", **(container or {})}]}
    if node_name is not None:
        body["nodeName"] = node_name
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": {**body, **spec}}


def relabel(obj: dict[str, Any], labels: dict[str, str]) -> dict[str, Any]:
    return {**obj, "metadata": {**obj["metadata"], "labels": labels}}


def annotate(obj: dict[str, Any], annotations: dict[str, str]) -> dict[str, Any]:
    return {**obj, "metadata": {**obj["metadata"], "annotations": annotations}}


def returning(found: Mapping[str, Any]) -> Lookup:
    return lambda _request: found


def unavailable(request: Request) -> Mapping[str, Any]:
    raise ParentUnavailable(f'pod "{request.name}" is not in the cache')


def untouched(req: Request) -> Mapping[str, Any]:
    raise AssertionError("this request must be decided without a lookup")


def decide(req: Request, lookup: Lookup = untouched) -> Decision | None:
    return check_node(req, Context(SNAPSHOT, lookup=lookup))


def assert_outcome(decision: Decision | None, refused: str | None, reason: str) -> None:
    """``refused`` None: no objection; else a 403 whose message contains it."""
    if refused is None:
        assert decision is None, decision
        return
    assert decision is not None, f"expected a denial containing {refused!r}"
    assert (decision.allowed, decision.code, decision.reason) == (False, 403, reason)
    assert refused in decision.message


def case(req: Request, refused: str | None, test_id: str, lookup: Lookup = untouched) -> Any:
    return pytest.param(req, lookup, refused, id=test_id)


def run_cases(req: Request, lookup: Lookup, refused: str | None, reason: str) -> None:
    assert_outcome(decide(req, lookup), refused, reason)


# --- identity -------------------------------------------------------------------------------------

OTHER_NODE = 'is not allowed to modify node "node2"'


def label_node2(user: UserInfo) -> Request:
    return request("UPDATE", "nodes", node("node2", {"team": "b"}), node("node2"), user=user)


IDENTITY = [
    case(label_node2(NODE1), OTHER_NODE, "node-is-node"),
    case(label_node2(ADMIN), None, "admin"),
    case(
        label_node2(UserInfo("system:node:node1", ("system:authenticated",))),
        None,
        "node-name-without-nodes-group",
    ),
    case(label_node2(UserInfo("kubelet-node1", ("system:nodes",))), None, "group-without-name"),
    case(
        label_node2(UserInfo("system:node:", ("system:nodes",))),
        'could not determine node from user "system:node:"',
        "empty-node-name",
    ),
    case(
        request("CONNECT", "pods/exec", {"kind": "PodExecOptions"}, name="app", namespace="x"),
        None,
        "connect-is-not-restricted",
    ),
    case(
        request("UPDATE", "deployments", {"kind": "Deployment"}, {}, name="d", group="apps"),
        None,
        "other-resources-are-not-restricted",
    ),
    case(
        request("CREATE", "pods", {"kind": "Pod", "metadata": {"name": "p"}}, group="example.com"),
        None,
        "pods-of-another-group",
    ),
]


@pytest.mark.parametrize(("req", "lookup", "refused"), IDENTITY)
def test_identity(req: Request, lookup: Lookup, refused: str | None) -> None:
    run_cases(req, lookup, refused, "NodeRestriction")


def test_evaluate_reports_the_node_denial() -> None:
    req = request("DELETE", "nodes", None, node("node2"))
    decision = evaluate(req, Context(SNAPSHOT))
    assert (decision.allowed, decision.reason) == (False, "NodeRestriction")
    assert decision.message == 'node "node1" is not allowed to modify node "node2"'


# --- nodes ----------------------------------------------------------------------------------------


def node_update(old: dict[str, Any], new: dict[str, Any], sub: str = "") -> Request:
    return request("UPDATE", f"nodes/{sub}" if sub else "nodes", new, old)


OWN = node(labels={"kubernetes.io/hostname": "node1"}, taints=NOT_READY)

NODES = [
    case(request("CREATE", "nodes", OWN), None, "create-own"),
    case(request("CREATE", "nodes", node("node2")), OTHER_NODE, "create-other"),
    case(node_update(node("node2"), node("node2", {"team": "b"})), OTHER_NODE, "update-other"),
    case(node_update(OWN, relabel(OWN, {"team": "a"})), None, "update-own-unreserved-label"),
    case(node_update(OWN, OWN, "status"), None, "status-own"),
    case(node_update(node("node2"), node("node2"), "status"), OTHER_NODE, "status-other"),
    case(request("DELETE", "nodes", None, OWN), None, "delete-own"),
    case(request("DELETE", "nodes", None, node("node2")), OTHER_NODE, "delete-other"),
    case(
        node_update(OWN, node(labels={"kubernetes.io/hostname": "node1"}, taints=[])),
        'node "node1" is not allowed to modify taints',
        "taint-removed",
    ),
    case(
        node_update(OWN, node(taints=[{**NOT_READY[0], "effect": "PreferNoSchedule"}])),
        "is not allowed to modify taints",
        "taint-changed",
    ),
    case(
        node_update(node(), node(taints=[{"key": "dedicated", "effect": "NoSchedule"}])),
        "is not allowed to modify taints",
        "taint-added",
    ),
    case(node_update(node(taints=[]), node()), None, "taints-empty-equals-absent"),
    case(
        node_update(OWN, node(taints=NOT_READY, config_source=CONFIG_SOURCE)),
        'node "node1" is not allowed to update configSource to a new non-nil configSource',
        "config-source-set",
    ),
    case(
        node_update(
            node(config_source=CONFIG_SOURCE),
            node(config_source={"configMap": {**CONFIG_SOURCE["configMap"], "name": "other"}}),
        ),
        "to a new non-nil configSource",
        "config-source-changed",
    ),
    case(
        node_update(node(config_source=CONFIG_SOURCE), node(config_source=CONFIG_SOURCE)),
        None,
        "config-source-unchanged",
    ),
    case(node_update(node(config_source=CONFIG_SOURCE), node()), None, "config-source-dropped"),
    case(
        request("CREATE", "nodes", node(config_source=CONFIG_SOURCE)),
        'node "node1" is not allowed to create a Node with a non-nil configSource',
        "create-with-config-source",
    ),
]


@pytest.mark.parametrize(("req", "lookup", "refused"), NODES)
def test_nodes(req: Request, lookup: Lookup, refused: str | None) -> None:
    run_cases(req, lookup, refused, "NodeRestriction")


RESERVED = [
    "node-restriction.kubernetes.io/isolated",
    "example.node-restriction.kubernetes.io/isolated",
    "node-role.kubernetes.io/worker",
    "kubernetes.io/role",
    "beta.kubernetes.io/fluentd-ds-ready",
    "k8s.io/anything",
    "team.k8s.io/anything",
]
UNRESERVED = [
    *sorted(KUBELET_LABELS),
    "kubelet.kubernetes.io/managed",
    "node.kubernetes.io/exclude-from-external-load-balancers",
    "pool.node.kubernetes.io/name",
    "team",
    "example.com/team",
    "notkubernetes.io/x",
    "kubernetes.io.example.com/x",
]


@pytest.mark.parametrize("key", RESERVED)
def test_reserved_label_refused_on_create_add_change_and_remove(key: str) -> None:
    base = {"kubernetes.io/hostname": "node1"}
    with_key = {**base, key: "a"}
    attempts = {
        "create": request("CREATE", "nodes", node(labels=with_key)),
        "add": node_update(node(labels=base), node(labels=with_key)),
        "change": node_update(node(labels=with_key), node(labels={**base, key: "b"})),
        "remove": node_update(node(labels=with_key), node(labels=base)),
    }
    for attempt, req in attempts.items():
        decision = decide(req)
        assert decision is not None and decision.reason == "NodeRestriction", attempt
        verb = "set the following labels" if attempt == "create" else "modify labels"
        assert decision.message == f'node "node1" is not allowed to {verb}: {key}', attempt
    # A reserved label the node leaves alone is not its doing (b006: status of a labeled node).
    assert decide(node_update(node(labels=with_key), node(labels=with_key), "status")) is None


@pytest.mark.parametrize("key", UNRESERVED)
def test_kubelet_and_unreserved_labels_allowed(key: str) -> None:
    assert not is_protected_node_label(key)
    assert decide(request("CREATE", "nodes", node(labels={key: "v"}))) is None
    assert decide(node_update(node(labels={key: "v"}), node(labels={key: "w"}))) is None


def test_every_forbidden_label_is_listed_sorted() -> None:
    req = request(
        "CREATE",
        "nodes",
        node(labels={"team": "a", "node-role.kubernetes.io/b": "", "k8s.io/a": "1"}),
    )
    decision = decide(req)
    assert decision is not None
    assert decision.message.endswith("labels: k8s.io/a, node-role.kubernetes.io/b")


# --- mirror pod creation --------------------------------------------------------------------------


def create(obj: dict[str, Any], user: UserInfo = NODE1) -> Request:
    return request("CREATE", "pods", obj, user=user)


def with_env(**env: Any) -> Request:
    """node1 creating its mirror pod whose container has ``env``/``envFrom`` entries."""
    return create(pod(container={key: [value] for key, value in env.items()}))


def with_volume(**source: Any) -> Request:
    """node1 creating its mirror pod with one volume of the given source."""
    return create(pod(volumes=[{"name": "v", **source}]))


def with_projection(**source: Any) -> Request:
    return with_volume(projected={"sources": [source]})


def refs(kind: str) -> str:
    return f'node "node1" can not create pods that reference {kind}'


SECRET_KEY = {"secretKeyRef": {"name": "s", "key": "k"}}
CM_KEY = {"configMapKeyRef": {"name": "c", "key": "k"}}

MIRROR_CREATE = [
    case(create(pod()), None, "mirror-pod"),
    case(
        create(pod(mirror=False)),
        'pod does not have "kubernetes.io/config.mirror" annotation, node "node1" can only '
        "create mirror pods",
        "not-a-mirror-pod",
    ),
    case(
        create(pod(node_name="node2")),
        'node "node1" can only create pods with spec.nodeName set to itself',
        "bound-to-other-node",
    ),
    # owner references
    case(
        create(pod(owners=[])),
        'node "node1" can only create pods with an owner reference set to itself',
        "no-owner-reference",
    ),
    case(
        create(pod(owners=[node_owner(), node_owner()])),
        'node "node1" can only create pods with a single owner reference set to itself',
        "two-owner-references",
    ),
    case(
        create(pod(owners=[node_owner(kind="ReplicaSet", apiVersion="apps/v1")])),
        'node "node1" can only create pods with an owner reference set to itself',
        "owner-wrong-kind",
    ),
    case(
        create(pod(owners=[node_owner(apiVersion="v2")])),
        "can only create pods with an owner reference set to itself",
        "owner-wrong-api-version",
    ),
    case(
        create(pod(owners=[node_owner(name="node2", uid=NODE2_UID)])),
        "can only create pods with an owner reference set to itself",
        "owner-other-node",
    ),
    case(
        create(pod(owners=[node_owner(controller=False)])),
        'node "node1" can only create pods with a controller owner reference set to itself',
        "owner-controller-false",
    ),
    case(
        create(pod(owners=[{k: v for k, v in node_owner().items() if k != "controller"}])),
        "with a controller owner reference set to itself",
        "owner-controller-absent",
    ),
    case(
        create(pod(owners=[node_owner(blockOwnerDeletion=True)])),
        'node "node1" must not set blockOwnerDeletion on an owner reference',
        "owner-block-owner-deletion",
    ),
    case(
        create(pod(owners=[node_owner(blockOwnerDeletion=False)])),
        None,
        "owner-block-owner-deletion-false",
    ),
    case(
        create(pod(owners=[node_owner(uid=NODE2_UID)])),
        f'node "node1" UID mismatch: the owner reference has uid "{NODE2_UID}", the Node has '
        f'uid "{NODE1_UID}"',
        "owner-wrong-uid",
    ),
    case(
        request(
            "CREATE",
            "pods",
            pod("static-node3", node_name="node3", owners=[node_owner(name="node3", uid="x")]),
            user=UserInfo("system:node:node3", ("system:nodes",)),
        ),
        None,
        "owner-uid-of-unknown-node-not-checked",
    ),
    # references to API objects
    case(create(pod(serviceAccountName="default")), refs("a service account"), "sa-name"),
    case(create(pod(serviceAccount="default")), refs("a service account"), "sa-deprecated"),
    case(create(pod(imagePullSecrets=[{"name": "r"}])), refs("secrets"), "image-pull-secret"),
    case(with_env(env={"name": "A", "valueFrom": SECRET_KEY}), refs("secrets"), "env-secret"),
    case(with_env(env={"name": "A", "valueFrom": CM_KEY}), refs("configmaps"), "env-configmap"),
    case(with_env(envFrom={"secretRef": {"name": "s"}}), refs("secrets"), "env-from-secret"),
    case(with_env(envFrom={"configMapRef": {"name": "c"}}), refs("configmaps"), "env-from-cm"),
    case(
        create(pod(initContainers=[{"name": "i", "envFrom": [{"secretRef": {"name": "s"}}]}])),
        refs("secrets"),
        "init-container-secret",
    ),
    case(
        create(
            pod(ephemeralContainers=[{"name": "e", "env": [{"name": "A", "valueFrom": CM_KEY}]}])
        ),
        refs("configmaps"),
        "ephemeral-container-configmap",
    ),
    case(with_volume(secret={"secretName": "s"}), refs("secrets"), "volume-secret"),
    case(with_volume(configMap={"name": "c"}), refs("configmaps"), "volume-configmap"),
    case(
        with_volume(rbd={"image": "i", "secretRef": {"name": "s"}}),
        refs("secrets"),
        "volume-plugin-secret-ref",
    ),
    case(with_volume(rbd={"image": "i"}), None, "volume-plugin-without-secret-ref"),
    case(with_projection(secret={"name": "s"}), refs("secrets"), "projected-secret"),
    case(
        with_projection(configMap={"name": "kube-root-ca.crt"}),
        refs("configmaps"),
        "projected-configmap",
    ),
    case(
        with_projection(serviceAccountToken={"path": "token"}),
        refs("a service account"),
        "projected-service-account-token",
    ),
    case(
        with_projection(clusterTrustBundle={"name": "b"}),
        refs("clustertrustbundles"),
        "projected-cluster-trust-bundle",
    ),
    case(
        with_volume(persistentVolumeClaim={"claimName": "data"}),
        refs("persistentvolumeclaims"),
        "volume-pvc",
    ),
    case(
        with_volume(ephemeral={"volumeClaimTemplate": {"spec": {}}}),
        refs("ephemeral volumes"),
        "volume-ephemeral",
    ),
    case(with_volume(csi={"driver": "d.example.com"}), refs("csi volumes"), "volume-csi"),
    case(
        with_volume(csi={"driver": "d", "nodePublishSecretRef": {"name": "s"}}),
        refs("secrets"),
        "volume-csi-with-secret",
    ),
    case(
        create(pod(resourceClaims=[{"name": "gpu", "resourceClaimName": "gpu-claim"}])),
        refs("resourceclaims"),
        "resource-claims",
    ),
    case(
        create(
            pod(
                volumes=[
                    {"name": "h", "hostPath": {"path": "/etc/kubernetes"}},
                    {"name": "e", "emptyDir": {}},
                    {"name": "d", "projected": {"sources": [{"downwardAPI": {"items": []}}]}},
                ]
            )
        ),
        None,
        "local-volumes-only",
    ),
    # labels allowed by the namespace annotation
    case(create(pod(labels={"component": "web", "tier": "control-plane"})), None, "labels-allowed"),
    case(
        create(pod(labels={"component": "web", "k8s-app": "web"})),
        'node "node1" can not create mirror pods with labels k8s-app in namespace "kube-system": '
        'its "node.kubernetes.io/mirror.allowed-label-keys" annotation allows only component, tier',
        "labels-partly-allowed",
    ),
    case(create(pod(namespace="spaced", labels={"tier": "x"})), None, "annotation-spaces-trimmed"),
    case(
        create(pod(namespace="empty", labels={"tier": "x"})),
        "annotation allows only no keys",
        "annotation-empty",
    ),
    case(
        create(pod(namespace="default", labels={"component": "web"})),
        'labels (component) in namespace "default": the namespace has no '
        '"node.kubernetes.io/mirror.allowed-label-keys" annotation',
        "annotation-absent",
    ),
    case(
        create(pod(namespace="unknown", labels={"component": "web"})),
        'namespace "unknown": the namespace is not known',
        "namespace-unknown",
    ),
    case(create(pod(namespace="unknown")), None, "unlabeled-needs-no-annotation"),
]


@pytest.mark.parametrize(("req", "lookup", "refused"), MIRROR_CREATE)
def test_mirror_pod_create(req: Request, lookup: Lookup, refused: str | None) -> None:
    run_cases(req, lookup, refused, "NodeRestriction")


def test_allowed_label_keys_parsing() -> None:
    assert allowed_label_keys(" component , tier ,,") == {"component", "tier"}
    assert allowed_label_keys("") == frozenset()


def test_non_node_user_may_create_any_pod() -> None:
    app = pod("app", "default", mirror=False, serviceAccountName="default", labels={"a": "b"})
    assert decide(create(app, user=ADMIN)) is None


# --- other pod writes -----------------------------------------------------------------------------

APP = pod("app", "default", mirror=False, labels={"app": "web"})
APP_ON_NODE2 = pod("app", "default", "node2", mirror=False, labels={"app": "web"})
EVICTION = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "app"}}


def status(old: dict[str, Any], new: dict[str, Any]) -> Request:
    return request("UPDATE", "pods/status", new, old)


def evict(name: str = "app") -> Request:
    return request("CREATE", "pods/eviction", EVICTION, name=name, namespace="default")


UNREADABLE = (
    'node "node1" can only {} pods with spec.nodeName set to itself, and pod "app" in namespace '
    '"default" could not be read to check it: pod "app" is not in the cache'
)

POD_WRITES = [
    case(
        request("UPDATE", "pods", APP, APP),
        'unexpected operation "UPDATE", node "node1" can only create and delete mirror pods',
        "update-refused",
    ),
    case(request("DELETE", "pods", None, pod()), None, "delete-own-mirror-pod"),
    case(request("DELETE", "pods", None, APP), None, "delete-pod-bound-to-self"),
    case(
        request("DELETE", "pods", None, APP_ON_NODE2),
        'node "node1" can only delete pods with spec.nodeName set to itself',
        "delete-other-nodes-pod",
    ),
    case(
        request("DELETE", "pods", None, name="app", namespace="default"),
        None,
        "delete-without-old-object-looked-up",
        returning(APP),
    ),
    case(status(APP, APP), None, "status-own"),
    case(
        status(APP_ON_NODE2, APP_ON_NODE2),
        'node "node1" can only update pod status for pods with spec.nodeName set to itself',
        "status-other-nodes-pod",
    ),
    case(
        status(APP, relabel(APP, {"app": "evil"})),
        'node "node1" cannot update labels through pod status',
        "status-label-changed",
    ),
    case(
        status(APP, relabel(APP, {"app": "web", "extra": "x"})),
        "cannot update labels through pod status",
        "status-label-added",
    ),
    case(
        status(APP, relabel(APP, {})),
        "cannot update labels through pod status",
        "status-label-removed",
    ),
    case(
        status(APP, {**APP, "metadata": {**APP["metadata"], "ownerReferences": [node_owner()]}}),
        'node "node1" cannot update owner references through pod status',
        "status-owner-added",
    ),
    case(evict(), None, "evict-own", returning(APP)),
    case(
        evict(),
        'node "node1" can only evict pods with spec.nodeName set to itself',
        "evict-other-nodes-pod",
        returning(APP_ON_NODE2),
    ),
    case(evict(name=""), None, "evict-name-from-eviction-body", returning(APP)),
    case(
        request("CREATE", "pods/binding", {"kind": "Binding", "metadata": {"name": "app"}}),
        "unexpected pod subresource \"binding\", only 'status' and 'eviction' are allowed",
        "binding-refused",
    ),
    case(
        request("UPDATE", "pods/ephemeralcontainers", APP, APP),
        'unexpected pod subresource "ephemeralcontainers"',
        "ephemeral-containers-refused",
    ),
]


@pytest.mark.parametrize(("req", "lookup", "refused"), POD_WRITES)
def test_pod_writes(req: Request, lookup: Lookup, refused: str | None) -> None:
    run_cases(req, lookup, refused, "NodeRestriction")


@pytest.mark.parametrize(
    ("req", "verb"),
    [
        pytest.param(evict(), "evict", id="evict"),
        pytest.param(
            request("DELETE", "pods", None, name="app", namespace="default"), "delete", id="delete"
        ),
    ],
)
def test_unreadable_pod_is_refused(req: Request, verb: str) -> None:
    assert_outcome(decide(req, unavailable), UNREADABLE.format(verb), "ParentUnavailable")


def test_eviction_looks_up_the_named_pod() -> None:
    seen: list[tuple[str, str]] = []

    def lookup(req: Request) -> Mapping[str, Any]:
        seen.append((req.namespace, req.name))
        return APP

    assert decide(evict(name=""), lookup) is None
    assert seen == [("default", "app")]


# --- pods/status fields the node authorizer derives access from --------------------------------


def with_status(obj: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {**obj, "status": {**obj.get("status", {}), **fields}}


CLAIMED = with_status(
    APP,
    phase="Running",
    resourceClaimStatuses=[{"name": "gpu", "resourceClaimName": "app-gpu-x7k2p"}],
    extendedResourceClaimStatus={
        "resourceClaimName": "app-extended-resources-abcde",
        "requestMappings": [
            {"containerName": "web", "resourceName": "example.com/gpu", "requestName": "c0"}
        ],
    },
)
CLAIM_STATUSES = 'node "node1" cannot update resource claim statues'
EXTENDED = 'node "node1" cannot update extended resource claim status'

POD_STATUS_CLAIMS = [
    case(status(CLAIMED, with_status(CLAIMED, phase="Succeeded")), None, "claims-unchanged"),
    case(status(APP, with_status(APP, resourceClaimStatuses=[])), None, "empty-list-is-no-claims"),
    case(
        status(APP, with_status(APP, resourceClaimStatuses=[{"name": "gpu"}])),
        CLAIM_STATUSES,
        "claim-status-added",
    ),
    case(
        status(
            CLAIMED,
            with_status(
                CLAIMED, resourceClaimStatuses=[{"name": "gpu", "resourceClaimName": "other"}]
            ),
        ),
        CLAIM_STATUSES,
        "claim-name-changed",
    ),
    case(
        status(CLAIMED, with_status(CLAIMED, resourceClaimStatuses=[{"name": "gpu"}])),
        CLAIM_STATUSES,
        "claim-name-cleared",
    ),
    case(
        status(CLAIMED, with_status(CLAIMED, resourceClaimStatuses=None)),
        CLAIM_STATUSES,
        "claim-statuses-removed",
    ),
    case(
        status(APP, with_status(APP, extendedResourceClaimStatus={"resourceClaimName": "x"})),
        EXTENDED,
        "extended-claim-added",
    ),
    case(
        status(
            CLAIMED,
            with_status(CLAIMED, extendedResourceClaimStatus={"resourceClaimName": "other"}),
        ),
        EXTENDED,
        "extended-claim-changed",
    ),
    case(
        status(CLAIMED, with_status(CLAIMED, extendedResourceClaimStatus=None)),
        EXTENDED,
        "extended-claim-removed",
    ),
]


@pytest.mark.parametrize(("req", "lookup", "refused"), POD_STATUS_CLAIMS)
def test_pod_status_resource_claims(req: Request, lookup: Lookup, refused: str | None) -> None:
    run_cases(req, lookup, refused, "NodeRestriction")


def recorded_status_update() -> Request:
    """c048: node1 patches pods/status of its pod web-a (kube-apiserver v1.35)."""
    review = json.loads((V135_REVIEWS / "c048-node-update-pods-status.json").read_text())
    return parse_review(review).request


def test_recorded_status_update_passes_and_claim_changes_do_not() -> None:
    recorded = recorded_status_update()
    assert decide(recorded) is None
    assert recorded.object is not None and recorded.old_object is not None
    for field, value in (
        ("resourceClaimStatuses", [{"name": "gpu", "resourceClaimName": "stolen"}]),
        ("extendedResourceClaimStatus", {"resourceClaimName": "stolen"}),
    ):
        changed = replace(recorded, object=with_status(dict(recorded.object), **{field: value}))
        denial = decide(changed)
        assert denial is not None and "cannot update" in denial.message


# --- persistentvolumeclaims ----------------------------------------------------------------------


def pvc(**status: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": "data",
            "namespace": "default",
            "resourceVersion": "10",
            "labels": {"app": "web"},
        },
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
        "status": {"phase": "Bound", "capacity": {"storage": "1Gi"}, **status},
    }


def edit(obj: dict[str, Any], section: str, **fields: Any) -> dict[str, Any]:
    return {**obj, section: {**obj[section], **fields}}


OTHER_FIELDS = (
    'node "node1" is not allowed to update fields other than status.capacity and '
    "status.conditions: "
)
EXPANDED = pvc(
    capacity={"storage": "2Gi"},
    conditions=[{"type": "FileSystemResizePending", "status": "True"}],
    allocatedResources={"storage": "2Gi"},
    allocatedResourceStatuses={"storage": "NodeResizeInProgress"},
)

PVCS = [
    case(request("UPDATE", "persistentvolumeclaims/status", EXPANDED, pvc()), None, "expand"),
    case(
        request(
            "UPDATE",
            "persistentvolumeclaims/status",
            edit(pvc(), "metadata", resourceVersion="", managedFields=[{"manager": "kubelet"}]),
            pvc(),
        ),
        None,
        "resource-version-and-managed-fields-ignored",
    ),
    case(
        request(
            "UPDATE",
            "persistentvolumeclaims/status",
            edit(pvc(), "metadata", labels={}),
            edit(pvc(), "metadata", labels=None),
        ),
        None,
        "empty-and-absent-labels-equal",
    ),
    case(
        request(
            "UPDATE",
            "persistentvolumeclaims/status",
            edit(pvc(), "metadata", labels={"app": "evil"}),
            pvc(),
        ),
        OTHER_FIELDS + "metadata.labels",
        "relabel",
    ),
    case(
        request(
            "UPDATE",
            "persistentvolumeclaims/status",
            edit(pvc(), "metadata", finalizers=["example.com/keep"]),
            pvc(),
        ),
        OTHER_FIELDS + "metadata.finalizers",
        "finalizer-added",
    ),
    case(
        request("UPDATE", "persistentvolumeclaims/status", pvc(phase="Lost"), pvc()),
        OTHER_FIELDS + "status.phase",
        "phase-changed",
    ),
    case(
        request(
            "UPDATE",
            "persistentvolumeclaims/status",
            edit(pvc(), "spec", volumeName="pv-other"),
            pvc(),
        ),
        OTHER_FIELDS + "spec.volumeName",
        "spec-changed",
    ),
    case(
        request("UPDATE", "persistentvolumeclaims", EXPANDED, pvc()),
        "may only update PVC status",
        "update-claim-itself",
    ),
    case(
        request("CREATE", "persistentvolumeclaims", pvc()),
        "may only update PVC status",
        "create-claim",
    ),
    case(
        request("DELETE", "persistentvolumeclaims/status", None, pvc()),
        'unexpected operation "DELETE"',
        "status-delete",
    ),
    case(
        request(
            "UPDATE",
            "persistentvolumeclaims",
            edit(pvc(), "metadata", labels={"app": "evil"}),
            pvc(),
            user=ADMIN,
        ),
        None,
        "admin-unrestricted",
    ),
]


@pytest.mark.parametrize(("req", "lookup", "refused"), PVCS)
def test_persistent_volume_claims(req: Request, lookup: Lookup, refused: str | None) -> None:
    run_cases(req, lookup, refused, "NodeRestriction")


# --- serviceaccounts/token -----------------------------------------------------------------------

APP_UID = "7d3f1c3e-0000-4000-8000-00000000a11c"
APP_WITH_UID = {**APP, "metadata": {**APP["metadata"], "uid": APP_UID}}
APP_ON_NODE2_WITH_UID = {**APP_ON_NODE2, "metadata": {**APP_ON_NODE2["metadata"], "uid": APP_UID}}


def token(bound: dict[str, Any] | None, operation: str = "CREATE", sub: str = "token") -> Request:
    spec: dict[str, Any] = {"audiences": ["https://kubernetes.default.svc"]}
    if bound is not None:
        spec["boundObjectRef"] = bound
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
    resource = f"serviceaccounts/{sub}" if sub else "serviceaccounts"
    return request(operation, resource, body, name="default", namespace="default")


def pod_ref(**overrides: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "name": "app", "uid": APP_UID, **overrides}


NOT_BOUND = "node requested token not bound to a pod"

TOKENS = [
    case(token(pod_ref()), None, "bound-to-own-pod", returning(APP_WITH_UID)),
    case(token(None), NOT_BOUND, "not-bound"),
    case(token(pod_ref(kind="Secret")), NOT_BOUND, "bound-to-a-secret"),
    case(token(pod_ref(apiVersion="v2")), NOT_BOUND, "bound-to-another-version"),
    case(token(pod_ref(name="")), NOT_BOUND, "bound-without-name"),
    case(
        token(pod_ref(uid="")),
        "node requested token with a pod binding without a uid",
        "bound-without-uid",
    ),
    case(
        token(pod_ref(uid="0ld-uid")),
        "the UID in the bound object reference (0ld-uid) does not match the UID in record",
        "uid-of-a-deleted-namesake",
        returning(APP_WITH_UID),
    ),
    case(
        token(pod_ref()),
        "node requested token bound to a pod scheduled on a different node",
        "pod-on-another-node",
        returning(APP_ON_NODE2_WITH_UID),
    ),
    case(token(None, operation="UPDATE", sub=""), None, "not-a-token-request"),
]


@pytest.mark.parametrize(("req", "lookup", "refused"), TOKENS)
def test_service_account_tokens(req: Request, lookup: Lookup, refused: str | None) -> None:
    run_cases(req, lookup, refused, "NodeRestriction")


def test_token_request_reads_the_bound_pod() -> None:
    seen: list[tuple[Resource, str, str]] = []

    def lookup(req: Request) -> Mapping[str, Any]:
        seen.append((req.resource, req.namespace, req.name))
        return APP_WITH_UID

    assert decide(token(pod_ref()), lookup) is None
    assert seen == [(Resource("", "pods"), "default", "app")]


def test_token_for_an_unreadable_pod_is_refused() -> None:
    decision = decide(token(pod_ref()), unavailable)
    assert_outcome(
        decision,
        'node "node1" requested a token bound to pod "app" in namespace "default", which could '
        'not be read to check it: pod "app" is not in the cache',
        "ParentUnavailable",
    )


# --- leases, CSINodes, ResourceSlices ------------------------------------------------------------


def named(kind: str, name: str, namespace: str = "", **spec: Any) -> dict[str, Any]:
    metadata = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {"kind": kind, "metadata": metadata, "spec": spec}


LEASE_NS = "kube-node-lease"
OWN_LEASE = named("Lease", "node1", LEASE_NS, holderIdentity="node1")
OTHER_LEASE = named("Lease", "node2", LEASE_NS, holderIdentity="node1")
LEASE_NAME = "can only access node lease with the same name as the requesting node"
CSINODE_NAME = "can only access CSINode with the same name as the requesting node"
COORDINATION, STORAGE, RESOURCE = "coordination.k8s.io", "storage.k8s.io", "resource.k8s.io"


def slice_(node_name: str) -> dict[str, Any]:
    return named("ResourceSlice", f"{node_name}-gpu", nodeName=node_name, driver="gpu.example.com")


OWNED_OBJECTS = [
    case(request("CREATE", "leases", OWN_LEASE, group=COORDINATION, name=""), None, "lease-own"),
    case(request("UPDATE", "leases", OWN_LEASE, OWN_LEASE, group=COORDINATION), None, "renew"),
    case(
        request("CREATE", "leases", OTHER_LEASE, group=COORDINATION, name=""),
        LEASE_NAME,
        "lease-create-other",
    ),
    case(
        request("UPDATE", "leases", OTHER_LEASE, OTHER_LEASE, group=COORDINATION),
        LEASE_NAME,
        "lease-update-other",
    ),
    case(
        request("DELETE", "leases", None, OTHER_LEASE, group=COORDINATION),
        LEASE_NAME,
        "lease-delete-other",
    ),
    case(
        request("CREATE", "leases", named("Lease", "node1", "default"), group=COORDINATION),
        'can only access leases in the "kube-node-lease" system namespace',
        "lease-elsewhere",
    ),
    case(
        request("CREATE", "csinodes", named("CSINode", "node1"), group=STORAGE, name=""),
        None,
        "csinode-own",
    ),
    case(
        request("CREATE", "csinodes", named("CSINode", "node2"), group=STORAGE, name=""),
        CSINODE_NAME,
        "csinode-create-other",
    ),
    case(
        request(
            "UPDATE",
            "csinodes",
            named("CSINode", "node2"),
            named("CSINode", "node2"),
            group=STORAGE,
        ),
        CSINODE_NAME,
        "csinode-update-other",
    ),
    case(request("CREATE", "resourceslices", slice_("node1"), group=RESOURCE), None, "slice-own"),
    case(
        request("CREATE", "resourceslices", slice_("node2"), group=RESOURCE),
        "can only create ResourceSlice with the same NodeName as the requesting node",
        "slice-create-other",
    ),
    case(
        request("DELETE", "resourceslices", None, slice_("node1"), group=RESOURCE),
        None,
        "slice-delete-own",
    ),
    case(
        request("DELETE", "resourceslices", None, slice_("node2"), group=RESOURCE),
        "can only delete ResourceSlice with the same NodeName as the requesting node",
        "slice-delete-other",
    ),
    case(
        request("UPDATE", "resourceslices", slice_("node2"), slice_("node2"), group=RESOURCE),
        None,
        "slice-update-left-to-the-authorizer",
    ),
]


@pytest.mark.parametrize(("req", "lookup", "refused"), OWNED_OBJECTS)
def test_objects_named_after_the_node(req: Request, lookup: Lookup, refused: str | None) -> None:
    run_cases(req, lookup, refused, "NodeRestriction")


# --- certificatesigningrequests -----------------------------------------------------------------

_KEY = ec.generate_private_key(ec.SECP256R1())


def csr(common_name: str, signer: str = "kubernetes.io/kube-apiserver-client-kubelet") -> Request:
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:nodes"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )
    pem = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(subject)
        .sign(_KEY, hashes.SHA256())
        .public_bytes(serialization.Encoding.PEM)
    )
    return csr_request(base64.b64encode(pem).decode(), signer)


def csr_request(encoded: Any, signer: str, operation: str = "CREATE") -> Request:
    body = {
        "kind": "CertificateSigningRequest",
        "metadata": {"name": "csr-x7k2p"},
        "spec": {"request": encoded, "signerName": signer, "usages": ["client auth"]},
    }
    return request(operation, "certificatesigningrequests", body, group="certificates.k8s.io")


OWN_CN = "can only create a node CSR with CN=system:node:node1"

CSRS = [
    case(csr("system:node:node1"), None, "client-cert-own-name"),
    case(csr("system:node:node1", "kubernetes.io/kubelet-serving"), None, "serving-own-name"),
    case(csr("system:node:node2"), OWN_CN, "client-cert-other-node"),
    case(csr("system:node:node2", "kubernetes.io/kubelet-serving"), OWN_CN, "serving-other"),
    case(csr("system:admin"), OWN_CN, "client-cert-not-a-node"),
    case(csr("system:admin", "example.com/internal"), None, "other-signer-checks-itself"),
    case(
        csr_request("bm90IGEgY3Ny", "kubernetes.io/kubelet-serving"),
        "unable to parse csr",
        "not-a-pem-request",
    ),
    case(
        csr_request("%%%", "kubernetes.io/kubelet-serving"),
        "unable to parse csr",
        "not-base64",
    ),
    case(csr_request(None, "kubernetes.io/kubelet-serving"), "unable to parse csr", "no-request"),
    case(
        csr_request("%%%", "kubernetes.io/kubelet-serving", operation="UPDATE"),
        None,
        "updates-left-to-the-approver",
    ),
]


@pytest.mark.parametrize(("req", "lookup", "refused"), CSRS)
def test_certificate_signing_requests(req: Request, lookup: Lookup, refused: str | None) -> None:
    run_cases(req, lookup, refused, "NodeRestriction")


# --- mirror-pod annotation validation, for every user ---------------------------------------------

MIRROR = pod()
PLAIN = pod(mirror=False)

VALIDATION = [
    case(
        create(pod(node_name=None), user=ADMIN),
        'pods "static-web-node1" in namespace "kube-system": '
        "metadata.annotations[kubernetes.io/config.mirror]: must set spec.nodeName if mirror pod "
        "annotation is set",
        "admin-creates-unbound-mirror-pod",
    ),
    case(
        create(pod(node_name=""), user=NODE1),
        "must set spec.nodeName if mirror pod annotation is set",
        "node-creates-unbound-mirror-pod",
    ),
    case(create(MIRROR, user=ADMIN), None, "admin-creates-bound-mirror-pod"),
    case(
        request("UPDATE", "pods", PLAIN, MIRROR, user=ADMIN),
        "metadata.annotations[kubernetes.io/config.mirror]: may not remove or update mirror pod "
        "annotation",
        "annotation-removed",
    ),
    case(
        request("UPDATE", "pods", annotate(MIRROR, {MIRROR_ANNOTATION: "x"}), MIRROR, user=ADMIN),
        "may not remove or update mirror pod annotation",
        "annotation-changed",
    ),
    case(
        request("UPDATE", "pods", annotate(PLAIN, {MIRROR_ANNOTATION: "x"}), PLAIN, user=ADMIN),
        "may not add mirror pod annotation",
        "annotation-added",
    ),
    case(
        status(MIRROR, annotate(MIRROR, {"kubernetes.io/config.hash": "abc"})),
        "may not remove or update mirror pod annotation",
        "annotation-removed-through-status",
    ),
    case(
        request("UPDATE", "pods", relabel(MIRROR, {"a": "b"}), MIRROR, user=ADMIN),
        None,
        "annotation-unchanged",
    ),
    case(request("DELETE", "pods", None, MIRROR, user=ADMIN), None, "delete-is-not-validated"),
]


@pytest.mark.parametrize(("req", "lookup", "refused"), VALIDATION)
def test_mirror_annotation_validation(req: Request, lookup: Lookup, refused: str | None) -> None:
    run_cases(req, lookup, refused, "MirrorPodInvalid")
