"""Node-scoped rules: each NodeRestriction rule, the mirror-pod extensions, API validation."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest

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
from app.engine.rbac import Snapshot

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
    nodes={"node1": NODE1_UID, "node2": NODE2_UID},
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
    case(create(pod(owners=[])), None, "no-owner-reference"),
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
