"""The node authorizer: what a kubelet may read, decided as the API server's Node authorizer does.

A kubelet (``system:node:<name>`` in ``system:nodes``) may get a Secret, ConfigMap, PVC, PV or
ResourceClaim, and create a token for a ServiceAccount, only when a pod bound to it references
the object (``Context.nodes``, the graph of ``app.engine.nodegraph``). It reads its own Node
only, lists and watches pods only with ``fieldSelector spec.nodeName=<itself>``, and reaches its
own Lease and CSINode only. Rules, verbs and messages follow the in-tree authorizer.

The in-tree authorizer answers "no opinion" where it does not allow, relying on RBAC granting
nodes nothing more. This webhook runs before RBAC, in clusters that bind the ``system:node``
ClusterRole to the nodes, so for the resources above it answers **deny** wherever the in-tree
authorizer would not allow: the binding would otherwise hand every node every Secret. For any
other resource it has no opinion and RBAC decides (the ``system:node`` ClusterRole is the same
fixed policy the in-tree authorizer applies there). It never allows what the in-tree authorizer
would not.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from app.engine.context import Context
from app.engine.model import Access, AccessDecision
from app.engine.node import NODE_USER_PREFIX, NODES_GROUP
from app.engine.podrefs import (
    CONFIGMAPS,
    PERSISTENT_VOLUME_CLAIMS,
    RESOURCE_CLAIMS,
    SECRETS,
    SERVICE_ACCOUNTS,
)
from app.engine.selectors import IN

REASON = "NodeAuthorizer"
NODE_LEASE_NAMESPACE = "kube-node-lease"
READ_VERBS = frozenset({"get", "list", "watch"})
WRITE_VERBS = frozenset({"get", "create", "update", "patch", "delete"})

Rule = Callable[[str, Access, Context], AccessDecision]


def node_name(access: Access) -> str | None:
    """The node a request comes from ("" if unnamed), or None when it is not from a node."""
    user = access.user
    if not user.username.startswith(NODE_USER_PREFIX) or NODES_GROUP not in user.groups:
        return None
    return user.username[len(NODE_USER_PREFIX) :]


def check_node_read(access: Access, ctx: Context) -> AccessDecision | None:
    """Allow or deny a node's request for the resources above; None: not this rule's business."""
    node = node_name(access)
    if node is None:
        return None
    if not node:
        return _deny(f'unknown node for user "{access.user.username}"')
    rule = RULES.get((access.resource.group, access.resource.resource))
    return None if rule is None else rule(node, access, ctx)


# --- objects reached through the graph ----------------------------------------------------------


def _read_namespaced(node: str, access: Access, ctx: Context) -> AccessDecision:
    """Secrets and configmaps: get, list and watch of one named object its pods reference."""
    if access.verb not in READ_VERBS:
        return _deny("can only read resources of this type")
    if access.resource.subresource:
        return _deny("cannot read subresource")
    if not access.namespace:
        return _deny("can only read namespaced object of this type")
    return _related(node, access, ctx)


def _get_only(node: str, access: Access, ctx: Context) -> AccessDecision:
    """PVCs, PVs, resource claims, pods: get of one related object."""
    if access.verb != "get":
        return _deny("can only get individual resources of this type")
    if access.resource.subresource:
        return _deny("cannot get subresource")
    return _related(node, access, ctx)


def _claims(node: str, access: Access, ctx: Context) -> AccessDecision:
    if access.resource.subresource == "status":
        # The kubelet reports volume expansion through the status of claims it mounts.
        if access.verb not in ("update", "patch"):
            return _deny("can only get/update/patch this type")
        return _related(node, access, ctx)
    return _get_only(node, access, ctx)


def _service_account_token(node: str, access: Access, ctx: Context) -> AccessDecision:
    if access.verb != "create" or not access.name:
        return _deny("can only create tokens for individual service accounts")
    if access.resource.subresource != "token":
        return _deny("can only create token subresource of serviceaccount")
    return _related(node, access, ctx)


def _related(node: str, access: Access, ctx: Context) -> AccessDecision:
    if not access.name:
        return _deny("No Object name found")
    graph = ctx.nodes
    resource = access.resource.resource
    if graph is None or not graph.related(node, resource, access.namespace, access.name):
        return _deny(f"no relationship found between node '{node}' and this object")
    return AccessDecision.allow(
        REASON, "", f"{resource} {_where(access)} is referenced by a pod bound to node '{node}'"
    )


# --- the node's own objects ---------------------------------------------------------------------


def _nodes(node: str, access: Access, ctx: Context) -> AccessDecision:
    sub, verb = access.resource.subresource, access.verb
    if not sub and verb in ("create", "update", "patch"):
        # Which Node it may write is NodeRestriction's call (the admission path).
        return _allow(f"node '{node}' may {verb} Node objects (admission limits it to its own)")
    if not sub and verb in READ_VERBS:
        # Compared by name, not through the graph: a kubelet reads its Node before creating it.
        if access.name == node:
            return _allow(f"node '{node}' reads its own Node object")
        if not access.name:
            return _deny(
                f"node '{node}' cannot read all nodes, only its own Node object "
                f"(add --field-selector metadata.name={node})"
            )
        return _deny(f"node '{node}' cannot read '{access.name}', only its own Node object")
    if sub == "status" and verb in ("update", "patch"):
        return _allow(f"node '{node}' may update Node status (admission limits it to its own)")
    return _deny(f"node '{node}' cannot {verb} {access.resource}")


def _pods(node: str, access: Access, ctx: Context) -> AccessDecision:
    sub, verb = access.resource.subresource, access.verb
    if not sub:
        if verb == "get":
            return _get_only(node, access, ctx)
        if verb in ("list", "watch"):
            if _selects_field(access, "spec.nodeName", node):
                return _allow(f"node '{node}' lists the pods bound to itself")
            if access.name:
                return _related(node, access, ctx)
            return _deny(
                "can only list/watch pods with spec.nodeName field selector "
                f"(add --field-selector spec.nodeName={node})"
            )
        if verb in ("create", "delete"):
            return _allow(f"node '{node}' may {verb} mirror pods (admission limits which)")
    elif sub == "status" and verb in ("update", "patch"):
        return _allow(f"node '{node}' reports pod status (admission limits it to its own pods)")
    elif sub == "eviction" and verb == "create":
        return _allow(f"node '{node}' may evict pods (admission limits it to its own pods)")
    return _deny(f"node '{node}' cannot {verb} {access.resource}")


def _leases(node: str, access: Access, ctx: Context) -> AccessDecision:
    if access.verb not in WRITE_VERBS:
        return _deny("can only get, create, update, patch, or delete a node lease")
    if access.namespace != NODE_LEASE_NAMESPACE:
        return _deny(f'can only access leases in the "{NODE_LEASE_NAMESPACE}" system namespace')
    # On create the name is not known yet: admission checks it against the object.
    if access.verb != "create" and access.name != node:
        return _deny("can only access node lease with the same name as the requesting node")
    return _allow(f"node '{node}' keeps its own lease")


def _csinodes(node: str, access: Access, ctx: Context) -> AccessDecision:
    if access.verb not in WRITE_VERBS:
        return _deny("can only get, create, update, patch, or delete a CSINode")
    if access.resource.subresource:
        return _deny("cannot authorize CSINode subresources")
    if access.verb != "create" and access.name != node:
        return _deny("can only access CSINode with the same name as the requesting node")
    return _allow(f"node '{node}' keeps its own CSINode")


RULES: Mapping[tuple[str, str], Rule] = {
    ("", SECRETS): _read_namespaced,
    ("", CONFIGMAPS): _read_namespaced,
    ("", PERSISTENT_VOLUME_CLAIMS): _claims,
    ("", "persistentvolumes"): _get_only,
    ("", SERVICE_ACCOUNTS): _service_account_token,
    ("", "nodes"): _nodes,
    ("", "pods"): _pods,
    ("resource.k8s.io", RESOURCE_CLAIMS): _get_only,
    ("coordination.k8s.io", "leases"): _leases,
    ("storage.k8s.io", "csinodes"): _csinodes,
    ("storage.k8s.io", "volumeattachments"): _get_only,
}


# --- helpers ------------------------------------------------------------------------------------


def _selects_field(access: Access, field: str, value: str) -> bool:
    """Whether the field selector pins ``field`` to exactly ``value`` (``field=value``)."""
    return any(
        req.key == field and req.operator == IN and tuple(req.values) == (value,)
        for req in access.fields or ()
    )


def _where(access: Access) -> str:
    return f"{access.namespace}/{access.name}" if access.namespace else access.name


def _allow(explanation: str) -> AccessDecision:
    return AccessDecision.allow(REASON, "", explanation)


def _deny(message: str) -> AccessDecision:
    return AccessDecision.deny(REASON, message)
