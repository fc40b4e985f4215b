"""The resources a Kubernetes API server serves built in, as ``kubectl api-resources`` lists them:
group, plural name, kind, scope and short names; and the close matches of a name it does not
serve (``configmap`` → configmaps, ``cm`` → configmaps, ``deployments`` → deployments.apps).

Offline (``--rbac-dir``) the command line knows a resource from this table, the identities RBAC
names (``users``, ``groups``...) and the CustomResourceDefinitions in the directory; against a
cluster, from API discovery. Matching is a linear pass over a few hundred short names.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from app.engine.model import IDENTITY_RESOURCES, Resource


@dataclass(frozen=True, slots=True)
class ApiKind:
    """One served resource: where it lives and what it is called."""

    group: str
    resource: str
    kind: str
    namespaced: bool
    short_names: tuple[str, ...] = ()

    @property
    def as_resource(self) -> Resource:
        return Resource(self.group, self.resource)


# group (``core`` for ""), scope, resource, kind, short names: ``kubectl api-resources`` of 1.34.
_TABLE = """
core namespaced bindings Binding
core namespaced configmaps ConfigMap cm
core namespaced endpoints Endpoints ep
core namespaced events Event ev
core namespaced limitranges LimitRange limits
core namespaced persistentvolumeclaims PersistentVolumeClaim pvc
core namespaced pods Pod po
core namespaced podtemplates PodTemplate
core namespaced replicationcontrollers ReplicationController rc
core namespaced resourcequotas ResourceQuota quota
core namespaced secrets Secret
core namespaced serviceaccounts ServiceAccount sa
core namespaced services Service svc
core cluster componentstatuses ComponentStatus cs
core cluster namespaces Namespace ns
core cluster nodes Node no
core cluster persistentvolumes PersistentVolume pv
admissionregistration.k8s.io cluster mutatingwebhookconfigurations MutatingWebhookConfiguration
admissionregistration.k8s.io cluster validatingwebhookconfigurations ValidatingWebhookConfiguration
admissionregistration.k8s.io cluster validatingadmissionpolicies ValidatingAdmissionPolicy
admissionregistration.k8s.io cluster validatingadmissionpolicybindings \
    ValidatingAdmissionPolicyBinding
admissionregistration.k8s.io cluster mutatingadmissionpolicies MutatingAdmissionPolicy
admissionregistration.k8s.io cluster mutatingadmissionpolicybindings MutatingAdmissionPolicyBinding
apiextensions.k8s.io cluster customresourcedefinitions CustomResourceDefinition crd crds
apiregistration.k8s.io cluster apiservices APIService
apps namespaced controllerrevisions ControllerRevision
apps namespaced daemonsets DaemonSet ds
apps namespaced deployments Deployment deploy
apps namespaced replicasets ReplicaSet rs
apps namespaced statefulsets StatefulSet sts
authentication.k8s.io cluster selfsubjectreviews SelfSubjectReview
authentication.k8s.io cluster tokenreviews TokenReview
authorization.k8s.io namespaced localsubjectaccessreviews LocalSubjectAccessReview
authorization.k8s.io cluster selfsubjectaccessreviews SelfSubjectAccessReview
authorization.k8s.io cluster selfsubjectrulesreviews SelfSubjectRulesReview
authorization.k8s.io cluster subjectaccessreviews SubjectAccessReview
autoscaling namespaced horizontalpodautoscalers HorizontalPodAutoscaler hpa
batch namespaced cronjobs CronJob cj
batch namespaced jobs Job
certificates.k8s.io cluster certificatesigningrequests CertificateSigningRequest csr
certificates.k8s.io cluster clustertrustbundles ClusterTrustBundle
coordination.k8s.io namespaced leases Lease
coordination.k8s.io namespaced leasecandidates LeaseCandidate
discovery.k8s.io namespaced endpointslices EndpointSlice
events.k8s.io namespaced events Event ev
flowcontrol.apiserver.k8s.io cluster flowschemas FlowSchema
flowcontrol.apiserver.k8s.io cluster prioritylevelconfigurations PriorityLevelConfiguration
networking.k8s.io namespaced ingresses Ingress ing
networking.k8s.io namespaced networkpolicies NetworkPolicy netpol
networking.k8s.io cluster ingressclasses IngressClass
networking.k8s.io cluster ipaddresses IPAddress ip
networking.k8s.io cluster servicecidrs ServiceCIDR
node.k8s.io cluster runtimeclasses RuntimeClass
policy namespaced poddisruptionbudgets PodDisruptionBudget pdb
rbac.authorization.k8s.io namespaced roles Role
rbac.authorization.k8s.io namespaced rolebindings RoleBinding
rbac.authorization.k8s.io cluster clusterroles ClusterRole
rbac.authorization.k8s.io cluster clusterrolebindings ClusterRoleBinding
resource.k8s.io namespaced resourceclaims ResourceClaim
resource.k8s.io namespaced resourceclaimtemplates ResourceClaimTemplate
resource.k8s.io cluster deviceclasses DeviceClass
resource.k8s.io cluster resourceslices ResourceSlice
scheduling.k8s.io cluster priorityclasses PriorityClass pc
storage.k8s.io namespaced csistoragecapacities CSIStorageCapacity
storage.k8s.io cluster csidrivers CSIDriver
storage.k8s.io cluster csinodes CSINode
storage.k8s.io cluster storageclasses StorageClass sc
storage.k8s.io cluster volumeattachments VolumeAttachment
storage.k8s.io cluster volumeattributesclasses VolumeAttributesClass vac
"""


def _row(line: str) -> ApiKind:
    group, scope, resource, kind, *short = line.split()
    return ApiKind("" if group == "core" else group, resource, kind, scope == "namespaced",
                   tuple(short))  # fmt: skip


BUILTIN: tuple[ApiKind, ...] = (
    *(_row(line) for line in _TABLE.strip().splitlines()),
    # The identities RBAC grants impersonation and signing of: authorized, never stored.
    *(ApiKind(r.group, r.resource, "", False) for r in IDENTITY_RESOURCES),
)


def crd_kinds(objects: Iterable[tuple[str, Mapping[str, Any]]]) -> list[ApiKind]:
    """The resources the CustomResourceDefinitions among ``objects`` define."""
    found = []
    for kind, obj in objects:
        spec = obj.get("spec") if kind == "CustomResourceDefinition" else None
        names = spec.get("names") if isinstance(spec, Mapping) else None
        if not isinstance(spec, Mapping) or not isinstance(names, Mapping):
            continue
        group, plural = spec.get("group"), names.get("plural")
        if not isinstance(group, str) or not isinstance(plural, str):
            continue
        short = names.get("shortNames")
        found.append(
            ApiKind(
                group,
                plural,
                str(names.get("kind") or ""),
                spec.get("scope") != "Cluster",
                tuple(s for s in short if isinstance(s, str)) if isinstance(short, list) else (),
            )
        )
    return found


class Catalog:
    """The resources one source serves, by resource and by kind."""

    def __init__(self, kinds: Iterable[ApiKind]) -> None:
        self.kinds = tuple(kinds)
        self._by_resource = {(k.group, k.resource): k for k in self.kinds}
        self._by_kind = {(k.group, k.kind): k for k in self.kinds if k.kind}

    def find(self, resource: Resource) -> ApiKind | None:
        """The served resource ``resource`` names (its subresource is not looked up)."""
        return self._by_resource.get((resource.group, resource.resource))

    def of_kind(self, group: str, kind: str) -> ApiKind | None:
        return self._by_kind.get((group, kind))

    def resolve(self, resource: Resource) -> list[ApiKind]:
        """What ``kubectl auth can-i`` makes of a typed resource (lower-cased): the resource
        itself, else the resources it is the kind, singular or short name of; in the group it
        names, or in any group when it names none. The core group's match goes first, as in
        kubectl's priority; several others are left for the caller to refuse as ambiguous."""
        name, group = resource.resource.lower(), resource.group.lower()
        exact = self._by_resource.get((group, name))
        if exact is not None:
            return [exact]
        found = [
            k
            for k in self.kinds
            if (not group or k.group == group)
            and name in (k.resource, k.kind.lower(), k.resource.removesuffix("s"), *k.short_names)
        ]
        core = [k for k in found if not k.group]
        return core[:1] or list(dict.fromkeys(found))

    def close_matches(self, resource: Resource) -> list[str]:
        """What the user probably meant, best first: the plural of a kind or singular, the
        resource of a short name, the same name in another group, then near spellings."""
        name, group = resource.resource, resource.group
        exact: list[str] = []
        for k in self.kinds:
            same_group = not group or k.group == group
            spelled_else = name in (k.kind.lower(), *k.short_names, k.resource.rstrip("s"))
            if (same_group and spelled_else) or (k.resource == name and k.group != group):
                exact.append(_spell(k))
        spelled = [_spell(k) for k in self.kinds]
        near = difflib.get_close_matches(str(Resource(group, name)), spelled, n=3, cutoff=0.75)
        return list(dict.fromkeys([*exact, *near]))[:5]


def _spell(kind: ApiKind) -> str:
    return str(kind.as_resource)
