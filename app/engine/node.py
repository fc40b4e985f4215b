"""Node-scoped rules: what a kubelet may write, decided as the NodeRestriction plugin does.

A kubelet authenticates as ``system:node:<name>`` in the group ``system:nodes``. Those requests are
limited to the node's own Node object and to mirror pods bound to it (design "Scoped Kubelet API
Access"), with the "Extended NodeRestrictions for Pods" on top: mirror-pod labels must be allowed
by the pod's namespace, pods/status may not relabel a pod, and a mirror pod's only owner is its
node. Two mirror-pod API validation rules apply to every user, so they run before the node test.

Running this as a webhook covers clusters where the in-tree plugin is off, and is a second line
where it is on. Everything here is pure: the stored pod behind an eviction comes from
``Context.lookup``, Node uids and namespace annotations from the ``Snapshot``.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from cryptography import x509
from cryptography.x509.oid import NameOID

from app.engine import podrefs
from app.engine.context import Context, ParentUnavailable
from app.engine.model import (
    Decision,
    Request,
    Resource,
    annotations_of,
    labels_of,
    mapping_items,
)
from app.engine.podrefs import pod_references

NODE_USER_PREFIX = "system:node:"
NODES_GROUP = "system:nodes"
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
ALLOWED_LABEL_KEYS_ANNOTATION = "node.kubernetes.io/mirror.allowed-label-keys"

REASON = "NodeRestriction"
INVALID_MIRROR_POD = "MirrorPodInvalid"
UNAVAILABLE = "ParentUnavailable"

# Labels the kubelet sets on its own Node. Any other label in the kubernetes.io or k8s.io domains
# is reserved for the cluster: letting a node set it would let it steer workloads to itself.
KUBELET_LABELS = frozenset(
    {
        "kubernetes.io/hostname",
        "kubernetes.io/os",
        "kubernetes.io/arch",
        "beta.kubernetes.io/os",
        "beta.kubernetes.io/arch",
        "beta.kubernetes.io/instance-type",
        "node.kubernetes.io/instance-type",
        "topology.kubernetes.io/zone",
        "topology.kubernetes.io/region",
        "failure-domain.beta.kubernetes.io/zone",
        "failure-domain.beta.kubernetes.io/region",
    }
)
KUBELET_LABEL_DOMAINS = ("kubelet.kubernetes.io", "node.kubernetes.io")
RESERVED_LABEL_DOMAINS = ("kubernetes.io", "k8s.io")
# Labels in this domain exist precisely so that a node cannot claim them (for isolating nodes).
NODE_RESTRICTION_DOMAIN = "node-restriction.kubernetes.io"

# API objects a node may not make a mirror pod reference, in the order they are reported. The
# node authorizer grants a node read access to whatever its pods reference, so a mirror pod that
# referenced them would be a way around it.
SERVICE_ACCOUNT = "a service account"
SECRETS = "secrets"
CONFIGMAPS = "configmaps"
CLUSTER_TRUST_BUNDLES = "clustertrustbundles"
PVCS = "persistentvolumeclaims"
EPHEMERAL_VOLUMES = "ephemeral volumes"
CSI_VOLUMES = "csi volumes"
RESOURCE_CLAIMS = "resourceclaims"
REFERENCE_ORDER = (
    SERVICE_ACCOUNT,
    SECRETS,
    CONFIGMAPS,
    CLUSTER_TRUST_BUNDLES,
    PVCS,
    EPHEMERAL_VOLUMES,
    CSI_VOLUMES,
    RESOURCE_CLAIMS,
)
# Each kind of pod reference (``app.engine.podrefs``) as the denial names it. A token projection
# mints a token for the pod's service account, so it counts as using one.
REFERENCE_NAMES: Mapping[str, str] = {
    podrefs.SERVICE_ACCOUNTS: SERVICE_ACCOUNT,
    podrefs.SERVICE_ACCOUNT_TOKEN: SERVICE_ACCOUNT,
    podrefs.SECRETS: SECRETS,
    podrefs.CONFIGMAPS: CONFIGMAPS,
    podrefs.CLUSTER_TRUST_BUNDLES: CLUSTER_TRUST_BUNDLES,
    podrefs.PERSISTENT_VOLUME_CLAIMS: PVCS,
    podrefs.EPHEMERAL_VOLUMES: EPHEMERAL_VOLUMES,
    podrefs.CSI_VOLUMES: CSI_VOLUMES,
    podrefs.RESOURCE_CLAIMS: RESOURCE_CLAIMS,
    podrefs.RESOURCE_CLAIM_TEMPLATES: RESOURCE_CLAIMS,
}


def check_node(request: Request, ctx: Context) -> Decision | None:
    """Refuse what a node may not do, and mirror-pod annotation misuse by anyone; else None."""
    res = request.resource
    if not res.group and res.resource == "pods" and request.kind == "Pod":
        invalid = check_mirror_annotation(request)
        if invalid is not None:
            return invalid

    # Most requests do not come from a kubelet: one prefix test and they are done.
    username = request.user.username
    if not username.startswith(NODE_USER_PREFIX) or NODES_GROUP not in request.user.groups:
        return None
    # NodeRestriction sees CREATE, UPDATE and DELETE only (CONNECT such as exec is left to
    # authorization).
    if request.operation == "CONNECT":
        return None
    node = username[len(NODE_USER_PREFIX) :]
    if not node:
        return _deny(f'could not determine node from user "{username}"')
    admit = _RULES.get((res.group, res.resource))
    return admit(node, request, ctx) if admit is not None else None


def check_mirror_annotation(request: Request) -> Decision | None:
    """API validation of the mirror-pod annotation, for every user.

    A mirror pod must be bound to a node, and an existing pod can neither gain, lose nor change
    the annotation: otherwise a pod could be turned into a mirror pod (or back) after creation,
    escaping the checks made when it was created.
    """
    new = annotations_of(request.object)
    if request.operation == "CREATE":
        if (
            request.object is not None
            and MIRROR_ANNOTATION in new
            and not _bound_to(request.object)
        ):
            return _invalid(request, "must set spec.nodeName if mirror pod annotation is set")
    elif request.operation == "UPDATE" and request.object is not None:
        old = annotations_of(request.old_object)
        if MIRROR_ANNOTATION in old:
            if MIRROR_ANNOTATION not in new or new[MIRROR_ANNOTATION] != old[MIRROR_ANNOTATION]:
                return _invalid(request, "may not remove or update mirror pod annotation")
        elif MIRROR_ANNOTATION in new and request.old_object is not None:
            return _invalid(request, "may not add mirror pod annotation")
    return None


def _invalid(request: Request, problem: str) -> Decision:
    # Worded as the API server's own validation error for the field.
    return Decision.deny(
        INVALID_MIRROR_POD,
        f"{request.describe()}: metadata.annotations[{MIRROR_ANNOTATION}]: {problem}",
    )


# --- nodes ---------------------------------------------------------------------------------------


def _admit_node(node: str, request: Request, ctx: Context) -> Decision | None:
    """A node may write only its own Node (and nodes/status), not its taints or reserved labels."""
    requested = request.name or _name(request.object)
    if requested != node:
        return _deny(f'node "{node}" is not allowed to modify node "{requested}"')

    if request.operation == "CREATE":
        if request.object is None:
            return _deny(f'node "{node}": the request carries no Node object')
        if _spec(request.object).get("configSource") is not None:
            return _deny(
                f'node "{node}" is not allowed to create a Node with a non-nil configSource'
            )
        forbidden = forbidden_node_labels(modified_label_keys(labels_of(request.object), {}))
        if forbidden:
            return _deny(
                f'node "{node}" is not allowed to set the following labels: {", ".join(forbidden)}'
            )

    elif request.operation == "UPDATE":
        if request.object is None or request.old_object is None:
            return _deny(f'node "{node}": the request carries no Node object to compare with')
        spec, old_spec = _spec(request.object), _spec(request.old_object)
        # Only a new non-nil value counts: an old kubelet may drop the field on a status update.
        config_source = spec.get("configSource")
        if config_source is not None and config_source != old_spec.get("configSource"):
            return _deny(
                f'node "{node}" is not allowed to update configSource to a new non-nil configSource'
            )
        # Removing a taint would let a node attract workloads that are meant to stay away.
        if (spec.get("taints") or []) != (old_spec.get("taints") or []):
            return _deny(f'node "{node}" is not allowed to modify taints')
        modified = modified_label_keys(labels_of(request.object), labels_of(request.old_object))
        forbidden = forbidden_node_labels(modified)
        if forbidden:
            return _deny(f'node "{node}" is not allowed to modify labels: {", ".join(forbidden)}')
    return None


def modified_label_keys(new: Mapping[str, str], old: Mapping[str, str]) -> set[str]:
    """Keys added, removed or given another value between ``old`` and ``new``."""
    return {k for k in new.keys() | old.keys() if k not in new or k not in old or new[k] != old[k]}


def forbidden_node_labels(keys: Iterable[str]) -> list[str]:
    """The sorted keys a node may not add, change or remove on its own Node."""
    return sorted(k for k in keys if is_protected_node_label(k))


def is_protected_node_label(key: str) -> bool:
    """Whether ``key`` is reserved: node-restriction, or kubernetes.io/k8s.io but not kubelet's."""
    domain = _label_domain(key)
    if not domain:
        return False
    if _in_domain(domain, NODE_RESTRICTION_DOMAIN):
        return True
    if not any(_in_domain(domain, parent) for parent in RESERVED_LABEL_DOMAINS):
        return False
    if key in KUBELET_LABELS:
        return False
    return not any(_in_domain(domain, parent) for parent in KUBELET_LABEL_DOMAINS)


def _label_domain(key: str) -> str:
    prefix, slash, _ = key.partition("/")
    return prefix if slash else ""


def _in_domain(domain: str, parent: str) -> bool:
    return domain == parent or domain.endswith("." + parent)


# --- pods ----------------------------------------------------------------------------------------


def _admit_pod(node: str, request: Request, ctx: Context) -> Decision | None:
    sub = request.resource.subresource
    operation = request.operation
    if not sub:
        if operation == "CREATE":
            return _admit_mirror_pod_create(node, request, ctx)
        if operation == "DELETE":
            # The API server sends the stored pod as oldObject; look it up only if it is absent.
            return _bound_pod_only(node, request, ctx, "delete", request.old_object)
        return _deny(
            f'unexpected operation "{operation}", node "{node}" can only create and delete '
            "mirror pods"
        )
    if sub == "status":
        return _admit_pod_status(node, request)
    if sub == "eviction":
        return _admit_pod_eviction(node, request, ctx)
    # A kubelet has no business with binding, ephemeralcontainers, resize and the like.
    return _deny(f"unexpected pod subresource \"{sub}\", only 'status' and 'eviction' are allowed")


def _admit_mirror_pod_create(node: str, request: Request, ctx: Context) -> Decision | None:
    pod = request.object or {}
    if MIRROR_ANNOTATION not in annotations_of(pod):
        return _deny(
            f'pod does not have "{MIRROR_ANNOTATION}" annotation, node "{node}" can only create '
            "mirror pods"
        )
    if _bound_to(pod) != node:
        return _deny(f'node "{node}" can only create pods with spec.nodeName set to itself')
    denial = _check_owner_references(node, pod, ctx)
    if denial is not None:
        return denial
    references = pod_api_references(pod)
    for kind in REFERENCE_ORDER:
        if kind in references:
            return _deny(f'node "{node}" can not create pods that reference {kind}')
    return _check_mirror_pod_labels(node, request, ctx)


def _check_owner_references(node: str, pod: Mapping[str, Any], ctx: Context) -> Decision | None:
    """At most one owner, and it is this node as controller: no other controller can adopt it."""
    owners = _metadata(pod).get("ownerReferences") or []
    if len(owners) > 1:
        return _deny(
            f'node "{node}" can only create pods with a single owner reference set to itself'
        )
    if not owners:
        # The kubelet always names its Node as the owner, so that deleting the Node collects
        # the mirror pod; a mirror pod without one would outlive it.
        return _deny(f'node "{node}" can only create pods with an owner reference set to itself')
    owner = owners[0] if isinstance(owners[0], Mapping) else {}
    if owner.get("apiVersion") != "v1" or owner.get("kind") != "Node" or owner.get("name") != node:
        return _deny(f'node "{node}" can only create pods with an owner reference set to itself')
    if owner.get("controller") is not True:
        return _deny(
            f'node "{node}" can only create pods with a controller owner reference set to itself'
        )
    # blockOwnerDeletion would make deleting the Node wait on the pod: not the node's call.
    if owner.get("blockOwnerDeletion") is True:
        return _deny(f'node "{node}" must not set blockOwnerDeletion on an owner reference')
    # The uid proves the reference is to this Node and not a deleted namesake. Without a known
    # Node (no cluster access) the name check above is all that can be done.
    known = ctx.snapshot.nodes.get(node)
    if known is not None and known.uid and owner.get("uid") != known.uid:
        return _deny(
            f'node "{node}" UID mismatch: the owner reference has uid "{owner.get("uid") or ""}", '
            f'the Node has uid "{known.uid}"'
        )
    return None


def _check_mirror_pod_labels(node: str, request: Request, ctx: Context) -> Decision | None:
    """Mirror-pod labels must be allowed by the namespace, so a node cannot join a selector.

    Otherwise a node could label a mirror pod into a Service (and intercept its traffic) or into
    a controller's selector (and have legitimate replicas deleted).
    """
    labels = labels_of(request.object)
    if not labels:
        return None
    namespace = request.namespace or _metadata(request.object).get("namespace") or ""
    keys = ", ".join(sorted(labels))
    annotations = ctx.snapshot.namespaces.get(namespace)
    if annotations is None:
        return _deny(
            f'node "{node}" can not create mirror pods with labels ({keys}) in namespace '
            f'"{namespace}": the namespace is not known, so its "{ALLOWED_LABEL_KEYS_ANNOTATION}" '
            "annotation cannot be read"
        )
    if ALLOWED_LABEL_KEYS_ANNOTATION not in annotations:
        return _deny(
            f'node "{node}" can not create mirror pods with labels ({keys}) in namespace '
            f'"{namespace}": the namespace has no "{ALLOWED_LABEL_KEYS_ANNOTATION}" annotation'
        )
    allowed = allowed_label_keys(annotations[ALLOWED_LABEL_KEYS_ANNOTATION])
    refused = sorted(set(labels) - allowed)
    if refused:
        return _deny(
            f'node "{node}" can not create mirror pods with labels {", ".join(refused)} in '
            f'namespace "{namespace}": its "{ALLOWED_LABEL_KEYS_ANNOTATION}" annotation allows '
            f"only {', '.join(sorted(allowed)) or 'no keys'}"
        )
    return None


def allowed_label_keys(value: str) -> frozenset[str]:
    """The keys listed in an allowed-label-keys annotation (comma-separated, spaces ignored)."""
    return frozenset(key for part in value.split(",") if (key := part.strip()))


def pod_api_references(pod: Mapping[str, Any]) -> set[str]:
    """Which kinds of API object (``REFERENCE_ORDER`` names) a pod's spec references."""
    return {REFERENCE_NAMES[ref.kind] for ref in pod_references(_spec(pod))}


def _admit_pod_status(node: str, request: Request) -> Decision | None:
    """Status of pods bound to the node only, and no relabelling or re-owning through status."""
    if request.operation != "UPDATE":
        return _deny(f'unexpected operation "{request.operation}"')
    if request.old_object is None or request.object is None:
        return _deny(f'node "{node}": the request carries no pod to compare with')
    if _bound_to(request.old_object) != node:
        return _deny(
            f'node "{node}" can only update pod status for pods with spec.nodeName set to itself'
        )
    if dict(labels_of(request.old_object)) != dict(labels_of(request.object)):
        return _deny(f'node "{node}" cannot update labels through pod status')
    old_owners = _metadata(request.old_object).get("ownerReferences") or []
    if old_owners != (_metadata(request.object).get("ownerReferences") or []):
        return _deny(f'node "{node}" cannot update owner references through pod status')
    # The node authorizer lets a node read the ResourceClaims its pods' status names: changing
    # them would let the node read claims of pods it does not run. ("statues" is upstream's
    # wording, kept so that tooling matching it keeps working.)
    if _claim_statuses(request.old_object) != _claim_statuses(request.object):
        return _deny(f'node "{node}" cannot update resource claim statues')
    old_extended = _status(request.old_object).get("extendedResourceClaimStatus")
    if not _same(old_extended, _status(request.object).get("extendedResourceClaimStatus")):
        return _deny(f'node "{node}" cannot update extended resource claim status')
    return None


def _claim_statuses(pod: Mapping[str, Any]) -> list[tuple[Any, Any]]:
    """``status.resourceClaimStatuses`` as (name, resourceClaimName) pairs, in order."""
    return [
        (item.get("name"), item.get("resourceClaimName"))
        for item in mapping_items(_status(pod).get("resourceClaimStatuses"))
    ]


def _admit_pod_eviction(node: str, request: Request, ctx: Context) -> Decision | None:
    if request.operation != "CREATE":
        return _deny(f'unexpected operation "{request.operation}"')
    # The request names the pod; the Eviction body is only a fallback, as upstream does.
    name = request.name or _name(request.object)
    if not name:
        return _deny("could not determine pod from request data")
    target = request if request.name else replace(request, name=name)
    return _bound_pod_only(node, target, ctx, "evict", None)


def _bound_pod_only(
    node: str, request: Request, ctx: Context, verb: str, pod: Mapping[str, Any] | None
) -> Decision | None:
    """Refuse unless the pod (given, or read through ``ctx.lookup``) is bound to ``node``."""
    rule = f'node "{node}" can only {verb} pods with spec.nodeName set to itself'
    if pod is None:
        try:
            pod = ctx.lookup(request)
        except ParentUnavailable as exc:
            return Decision.deny(
                UNAVAILABLE,
                f'{rule}, and pod "{request.name}" in namespace "{request.namespace}" could not '
                f"be read to check it: {exc}",
            )
    if _bound_to(pod) != node:
        return _deny(rule)
    return None


# --- other objects a kubelet writes --------------------------------------------------------------

NODE_LEASE_NAMESPACE = "kube-node-lease"
# Signers whose certificates name a node; a node may ask for them only in its own name.
KUBELET_SIGNERS = frozenset(
    {"kubernetes.io/kubelet-serving", "kubernetes.io/kube-apiserver-client-kubelet"}
)
# PVC status fields a kubelet maintains while expanding a volume; everything else is left alone.
PVC_STATUS_FIELDS = ("capacity", "conditions", "allocatedResourceStatuses", "allocatedResources")


def _admit_pvc(node: str, request: Request, ctx: Context) -> Decision | None:
    """A node may only update PVC status, and only the fields volume expansion reports."""
    if request.resource.subresource != "status":
        return _deny("may only update PVC status")
    if request.operation != "UPDATE":
        return _deny(f'unexpected operation "{request.operation}"')
    if request.object is None or request.old_object is None:
        return _deny(f'node "{node}": the request carries no PersistentVolumeClaim to compare with')
    changed = _changed_fields(_pvc_view(request.old_object), _pvc_view(request.object))
    if changed:
        return _deny(
            f'node "{node}" is not allowed to update fields other than status.capacity and '
            f"status.conditions: {', '.join(changed)}"
        )
    return None


def _pvc_view(pvc: Mapping[str, Any]) -> dict[str, Any]:
    """The claim without what a status update may change (and what the server bumps itself)."""
    view = {key: value for key, value in pvc.items() if key not in ("metadata", "status")}
    view["metadata"] = {
        key: value
        for key, value in _metadata(pvc).items()
        if key not in ("resourceVersion", "managedFields")
    }
    status = pvc.get("status")
    view["status"] = {
        key: value
        for key, value in (status.items() if isinstance(status, Mapping) else ())
        if key not in PVC_STATUS_FIELDS
    }
    return view


def _changed_fields(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Paths (two levels deep) whose values differ; absent, null, {} and [] count as equal."""
    changed = []
    for key in sorted(old.keys() | new.keys()):
        a, b = old.get(key), new.get(key)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            changed += [
                f"{key}.{sub}"
                for sub in sorted(a.keys() | b.keys())
                if not _same(a.get(sub), b.get(sub))
            ]
        elif not _same(a, b):
            changed.append(key)
    return changed


def _same(a: Any, b: Any) -> bool:
    # As the API server's semantic equality: an empty list or map is the same as none at all.
    return (a in (None, {}, []) and b in (None, {}, [])) or a == b


def _admit_service_account(node: str, request: Request, ctx: Context) -> Decision | None:
    """Tokens only for pods bound to the node, proven by the pod's uid (kubelet's pod tokens)."""
    if request.operation != "CREATE" or request.resource.subresource != "token":
        return None
    spec = _spec(request.object)
    ref = spec.get("boundObjectRef")
    if (
        not isinstance(ref, Mapping)
        or ref.get("apiVersion") != "v1"
        or ref.get("kind") != "Pod"
        or not ref.get("name")
    ):
        return _deny("node requested token not bound to a pod")
    if not ref.get("uid"):
        return _deny("node requested token with a pod binding without a uid")
    pod_name = str(ref["name"])
    target = replace(request, resource=Resource("", "pods"), name=pod_name, kind="Pod")
    try:
        pod = ctx.lookup(target)
    except ParentUnavailable as exc:
        return Decision.deny(
            UNAVAILABLE,
            f'node "{node}" requested a token bound to pod "{pod_name}" in namespace '
            f'"{request.namespace}", which could not be read to check it: {exc}',
        )
    if _metadata(pod).get("uid") != ref.get("uid"):
        return _deny(
            f"the UID in the bound object reference ({ref.get('uid')}) does not match the UID in "
            "record. The object might have been deleted and then recreated"
        )
    if _bound_to(pod) != node:
        return _deny("node requested token bound to a pod scheduled on a different node")
    return None


def _admit_lease(node: str, request: Request, ctx: Context) -> Decision | None:
    """Only the node's own heartbeat Lease, in the node-lease namespace."""
    if request.namespace != NODE_LEASE_NAMESPACE:
        return _deny(f'can only access leases in the "{NODE_LEASE_NAMESPACE}" system namespace')
    if _target_name(request) != node:
        return _deny("can only access node lease with the same name as the requesting node")
    return None


def _admit_csinode(node: str, request: Request, ctx: Context) -> Decision | None:
    if _target_name(request) != node:
        return _deny("can only access CSINode with the same name as the requesting node")
    return None


def _target_name(request: Request) -> str:
    # On create the request carries no name yet: the object's is the one that will be stored.
    return _name(request.object) if request.operation == "CREATE" else request.name


def _admit_resource_slice(node: str, request: Request, ctx: Context) -> Decision | None:
    """ResourceSlices a node publishes name it; the node authorizer cannot see a new object's
    content, nor each object of a collection delete, so the node is checked here."""
    if request.operation == "CREATE":
        slice_, verb = request.object, "create"
    elif request.operation == "DELETE":
        slice_, verb = request.old_object, "delete"
    else:
        return None  # updates: the node authorizer reads the stored object itself
    if _spec(slice_).get("nodeName") != node:
        return _deny(f"can only {verb} ResourceSlice with the same NodeName as the requesting node")
    return None


def _admit_csr(node: str, request: Request, ctx: Context) -> Decision | None:
    """A node asks for kubelet certificates in its own name only (CN=system:node:<name>)."""
    if request.operation != "CREATE":
        return None
    spec = _spec(request.object)
    if spec.get("signerName") not in KUBELET_SIGNERS:
        return None  # other signers check the request themselves
    try:
        common_name = csr_common_name(spec.get("request"))
    except ValueError as exc:
        return _deny(f"unable to parse csr: {exc}")
    if common_name != f"{NODE_USER_PREFIX}{node}":
        return _deny(f"can only create a node CSR with CN={NODE_USER_PREFIX}{node}")
    return None


def csr_common_name(encoded: Any) -> str:
    """The subject CN of a CertificateSigningRequest's ``spec.request`` (base64 of a PEM CSR)."""
    if not isinstance(encoded, str):
        raise ValueError("spec.request is not a base64 string")
    try:
        pem = base64.b64decode(encoded, validate=True)
        csr = x509.load_pem_x509_csr(pem)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(str(exc) or "not a PEM certificate request") from None
    names = csr.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    value = names[0].value if names else ""
    return value if isinstance(value, str) else value.decode("utf-8", "replace")


# What a node may write, by (group, resource); other resources are not node-scoped here.
Admission = Callable[[str, Request, Context], "Decision | None"]
_RULES: Mapping[tuple[str, str], Admission] = {
    ("", "pods"): _admit_pod,
    ("", "nodes"): _admit_node,
    ("", "persistentvolumeclaims"): _admit_pvc,
    ("", "serviceaccounts"): _admit_service_account,
    ("coordination.k8s.io", "leases"): _admit_lease,
    ("storage.k8s.io", "csinodes"): _admit_csinode,
    ("resource.k8s.io", "resourceslices"): _admit_resource_slice,
    ("certificates.k8s.io", "certificatesigningrequests"): _admit_csr,
}

# The resources a node rule decides (whatever the subresource).
RESOURCES: frozenset[tuple[str, str]] = frozenset(_RULES)


# --- object access -------------------------------------------------------------------------------


def _deny(message: str) -> Decision:
    return Decision.deny(REASON, message)


def _metadata(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    metadata = obj.get("metadata") if obj else None
    return metadata if isinstance(metadata, Mapping) else {}


def _status(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    status = obj.get("status") if obj else None
    return status if isinstance(status, Mapping) else {}


def _spec(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    spec = obj.get("spec") if obj else None
    return spec if isinstance(spec, Mapping) else {}


def _name(obj: Mapping[str, Any] | None) -> str:
    return _metadata(obj).get("name") or ""


def _bound_to(pod: Mapping[str, Any] | None) -> str:
    return _spec(pod).get("nodeName") or ""
