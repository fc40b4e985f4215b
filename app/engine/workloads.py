"""What a write makes controllers do: pod templates, selectors, scale targets, pod references.

RBAC treats "create deployments" as "create pods", because a controller will create them. The
label rule judges the labels of the object written; this rule set judges what controllers will
do with it, so that a tenant cannot use a controller as a deputy to act in another bucket:

- a workload's pod template (a CronJob's job template, a StatefulSet's claim templates) must
  carry labels the user may give the objects the controller creates from it — their grant on
  ``create`` of that resource, or the workload's own entry when they hold no such grant;
- a workload's selector must not match objects outside those labels (the controller adopts and
  deletes what it matches);
- a HorizontalPodAutoscaler's ``scaleTargetRef`` must be an object the user may scale;
- a pod (or pod template) may use only service accounts, Secrets, ConfigMaps and claims whose
  labels the user's own ``get`` grant permits, where that grant is label-restricted; and it runs
  only as a service account the roles granting the write lend (an identity loan, as
  impersonation is: ``Permissions.loan_entries``);
- the legacy ``bindings`` resource is judged by the bound pod's labels, as ``pods/binding`` is;
- a ServiceAccount's labels decide its identity loans, so relabelling or deleting one is judged
  as lending it, before and after.

The rules run after the label rule let the write through (``decide.POST_CHECKS``) and only deny.
Requests of other resources cost one dictionary lookup; for users whose grants are unrestricted
nothing is looked up.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from app.engine.context import Context, ObjectRef, ParentUnavailable
from app.engine.labels import Grants, classify, find_grants, grant_decision, request_grants, who
from app.engine.model import Decision, Request, Resource, labels_of, mapping_items
from app.engine.podrefs import (
    CONFIGMAPS,
    PERSISTENT_VOLUME_CLAIMS,
    SECRETS,
    SERVICE_ACCOUNTS,
    PodRef,
    pod_references,
)
from app.engine.selectors import SelectorError, from_label_selector

PODS = Resource("", "pods")
PVCS = Resource("", "persistentvolumeclaims")
JOBS = Resource("batch", "jobs")
POD_BINDING = Resource("", "pods", "binding")

TEMPLATE_DENIED = "TemplateLabelNotPermitted"
SELECTOR_DENIED = "SelectorNotPermitted"
REFERENCE_DENIED = "ReferenceNotPermitted"
ACCOUNT_DENIED = "AccountNotLent"
UNAVAILABLE = "ParentUnavailable"

Path = tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Spawn:
    """Objects a controller creates from part of a workload: where that part is, what it makes."""

    path: Path  # an object template (``metadata`` and ``spec``), or a list of them
    creates: Resource
    many: bool = False


@dataclass(frozen=True, slots=True)
class Workload:
    """A kind whose controller creates pods from a template and adopts what its selector matches.

    ``manual_selector``: where a Job says its selector is hand-written. Otherwise the API server
    generates a selector on the job's own uid, which matches no other bucket's pods.
    """

    kind: str
    template: Path  # the PodTemplateSpec
    selector: Path | None
    manual_selector: Path | None = None
    spawns_also: tuple[Spawn, ...] = ()

    @property
    def spawns(self) -> tuple[Spawn, ...]:
        return (Spawn(self.template, PODS), *self.spawns_also)


def _apps(kind: str) -> Workload:
    return Workload(kind, ("spec", "template"), ("spec", "selector"))


_JOB_SPEC: Path = ("spec", "jobTemplate", "spec")

# The built-in workload kinds, by (group, resource).
WORKLOADS: Mapping[tuple[str, str], Workload] = {
    ("apps", "deployments"): _apps("Deployment"),
    ("apps", "replicasets"): _apps("ReplicaSet"),
    # A StatefulSet's controller also creates a claim per pod from each volumeClaimTemplate.
    ("apps", "statefulsets"): Workload(
        "StatefulSet",
        ("spec", "template"),
        ("spec", "selector"),
        spawns_also=(Spawn(("spec", "volumeClaimTemplates"), PVCS, many=True),),
    ),
    ("apps", "daemonsets"): _apps("DaemonSet"),
    # A ReplicationController's selector is a plain map (``from_label_selector`` reads both).
    ("", "replicationcontrollers"): _apps("ReplicationController"),
    ("batch", "jobs"): Workload(
        "Job", ("spec", "template"), ("spec", "selector"), ("spec", "manualSelector")
    ),
    ("batch", "cronjobs"): Workload(
        "CronJob",
        (*_JOB_SPEC, "template"),
        (*_JOB_SPEC, "selector"),
        (*_JOB_SPEC, "manualSelector"),
        (Spawn(("spec", "jobTemplate"), JOBS),),
    ),
    # Pods are made from a PodTemplate by whoever reads it; it has no selector.
    ("", "podtemplates"): Workload("PodTemplate", ("template",), None),
}

# What a HorizontalPodAutoscaler may scale: (group, kind) → (resource, version).
SCALE_TARGETS: Mapping[tuple[str, str], tuple[str, str]] = {
    ("apps", "Deployment"): ("deployments", "v1"),
    ("apps", "ReplicaSet"): ("replicasets", "v1"),
    ("apps", "StatefulSet"): ("statefulsets", "v1"),
    ("", "ReplicationController"): ("replicationcontrollers", "v1"),
}

# Pod references judged by the user's ``get`` grant on the referenced resource.
JUDGED_REFERENCES = frozenset({SERVICE_ACCOUNTS, SECRETS, CONFIGMAPS, PERSISTENT_VOLUME_CLAIMS})
# What the API server gives every pod by itself: the namespace's ``default`` service account
# (created unlabeled by the service-account controller) and the public cluster CA that the
# root-ca publisher puts in every namespace; OpenShift's API server also projects its public
# service CA, which its own controller puts in every namespace. Judging them would break every pod.
INJECTED = frozenset(
    {
        PodRef(SERVICE_ACCOUNTS, "default"),
        PodRef(CONFIGMAPS, "kube-root-ca.crt"),
        PodRef(CONFIGMAPS, "openshift-service-ca.crt"),
    }
)

# Every (group, resource) whose metadata these rules read; the webhook's ClusterRole grants
# ``get`` on each (manifests/deploy/rbac.yaml).
METADATA_RESOURCES: frozenset[tuple[str, str]] = frozenset(
    {
        *(("", kind) for kind in JUDGED_REFERENCES),
        *((group, resource) for (group, _), (resource, _) in SCALE_TARGETS.items()),
        ("", "pods"),
    }
)


def check_workloads(request: Request, ctx: Context) -> Decision | None:
    """Refuse a write that would make a controller act outside the user's labels; else None."""
    rule = RULES.get((request.resource.group, request.resource.resource))
    # Every denial here needs a grant with label limits (or an invalid annotation). A user bound
    # to no role carrying an annotation in the namespace or cluster-wide has none, whatever they
    # do, so the rules are skipped for them (cluster admins, controllers) at the price of a few
    # set lookups.
    if rule is None or not ctx.snapshot.limited(request.user, request.namespace):
        return None
    return rule(request, ctx)


# --- workloads -----------------------------------------------------------------------------------


def check_workload(request: Request, ctx: Context) -> Decision | None:
    """Pod (and job) templates and the selector of a built-in workload kind.

    CREATE judges the new object; UPDATE the stored one and the new (a template in another
    bucket may be neither written nor taken over); DELETE the stored one (its pods go with it);
    ``scale`` the stored one, looked up (scaling creates and deletes its pods). The template
    cannot change through other subresources (``status``), which are left alone.
    """
    res = request.resource
    workload = WORKLOADS[(res.group, res.resource)]
    if res.subresource not in ("", "scale") or request.operation == "CONNECT":
        return None
    versions: list[tuple[bool, Mapping[str, Any]]] | None = None
    for spawn in workload.spawns:
        for grants, judged in _deputy_grants(request, ctx, spawn.creates):
            decided = grant_decision(request, grants)
            if decided is not None:
                if decided.allowed:
                    continue
                return decided
            if versions is None:
                try:
                    versions = _versions(request, ctx)
                except ParentUnavailable as exc:
                    return Decision.deny(
                        UNAVAILABLE,
                        f"{who(request)}: its pod template cannot be checked: {exc}",
                        mode=grants.mode(),
                    )
            denial = _check_spawn(request, ctx, workload, spawn, grants, judged, versions)
            if denial is not None:
                return denial
    if request.operation in ("CREATE", "UPDATE") and not res.subresource:
        spec = _dig(request.object, (*workload.template, "spec"))
        return _check_references(request, ctx, spec, "its pod template")
    return None


def _check_spawn(
    request: Request,
    ctx: Context,
    workload: Workload,
    spawn: Spawn,
    grants: Grants,
    judged: Resource,
    versions: list[tuple[bool, Mapping[str, Any]]],
) -> Decision | None:
    """The template's labels in every version, then (for pods) the selector of the last."""
    path = ".".join(spawn.path)
    for existing, obj in versions:
        found = _dig(obj, spawn.path)
        templates = enumerate(mapping_items(found)) if spawn.many else ((None, found),)
        for index, template in templates:
            at = path if index is None else f"{path}[{index}]"
            where = f"{'stored ' if existing else ''}{_template_name(spawn)} ({at})"
            labels = labels_of(template)
            denial = _label_denial(
                request, ctx, grants, labels, f"its {where}", judged, TEMPLATE_DENIED
            )
            if denial is not None:
                return denial
    if spawn.creates == PODS and request.operation != "DELETE":
        return _check_selector(request, ctx, workload, grants, versions[-1][1])
    return None


def _template_name(spawn: Spawn) -> str:
    names = {PODS: "pod template", PVCS: "volume claim template"}
    return names.get(spawn.creates, f"{spawn.creates.resource} template")


def _versions(request: Request, ctx: Context) -> list[tuple[bool, Mapping[str, Any]]]:
    """The workload as stored (``True``) and as written, whichever the request affects."""
    if request.resource.subresource:
        return [(True, ctx.lookup(request))]
    if request.operation == "CREATE":
        return [(False, request.object or {})]
    if request.operation == "UPDATE":
        if request.old_object is None:
            raise ParentUnavailable("the request carries no oldObject to compare with")
        return [(True, request.old_object), (False, request.object or {})]
    stored = request.old_object if request.old_object is not None else ctx.lookup(request)
    return [(True, stored)]


def _deputy_grants(
    request: Request, ctx: Context, creates: Resource
) -> list[tuple[Grants, Resource]]:
    """The user's grants for what the controller will create; the write's own when none."""
    grants = find_grants(ctx.snapshot, request.user, request.namespace, ("create",), creates, "")
    if grants.any:
        return [(grants, creates)]
    return [(own, request.authorized_resource) for own in request_grants(request, ctx.snapshot)]


def _check_selector(
    request: Request,
    ctx: Context,
    workload: Workload,
    grants: Grants,
    obj: Mapping[str, Any],
) -> Decision | None:
    """The controller adopts and deletes the pods its selector matches: they must be the user's."""
    if workload.selector is None:
        return None
    if workload.manual_selector is not None and _dig(obj, workload.manual_selector) is not True:
        return None
    where = ".".join(workload.selector)
    raw = _dig(obj, workload.selector)
    try:
        selector = from_label_selector(raw)
    except SelectorError as exc:
        return Decision.deny(
            SELECTOR_DENIED, f"{who(request)}: its {where} is malformed: {exc}", mode=grants.mode()
        )
    if grants.within(selector, ctx.options.allow_unlabeled):
        return None
    keys = sorted(
        {req.key for _, entries in grants.restricted for e in entries for req in e.requirements}
    )
    shown = ",".join(map(str, selector)) or "everything"
    return Decision.deny(
        SELECTOR_DENIED,
        f"{who(request)}: its {where} ({shown}) can match pods of other labels, which the "
        f"controller would adopt and delete; it must select only permitted values of "
        f"{', '.join(keys)}, e.g. with matchLabels ({grants.allowances()})",
        mode=grants.mode(),
    )


# --- pod references ------------------------------------------------------------------------------


def check_pod(request: Request, ctx: Context) -> Decision | None:
    """The service account, Secrets, ConfigMaps and claims a pod uses, whenever its spec changes.

    The spec can change on an update (a new image runs with the same mounts) and through
    ``pods/ephemeralcontainers``; other subresources leave it alone.
    """
    sub = request.resource.subresource
    if (request.operation, sub) not in _POD_WRITES:
        return None
    return _check_references(request, ctx, _dig(request.object, ("spec",)), "it")


_POD_WRITES = frozenset({("CREATE", ""), ("UPDATE", ""), ("UPDATE", "ephemeralcontainers")})


def _check_references(request: Request, ctx: Context, spec: Any, whose: str) -> Decision | None:
    """Every judged reference must carry labels the user's ``get`` grant on it permits; a
    ServiceAccount must also be one the roles granting the write lend (``_account_loans``)."""
    for ref in sorted(pod_references(spec if isinstance(spec, Mapping) else None)):
        if ref.kind not in JUDGED_REFERENCES or not ref.name or ref in INJECTED:
            continue
        resource = Resource("", ref.kind)
        # A pod runs as its ServiceAccount: an identity loan, limited as impersonation is.
        account = ref.kind == SERVICE_ACCOUNTS
        grants = find_grants(
            ctx.snapshot, request.user, request.namespace, ("get",), resource, ref.name, account
        )
        checks = [(grants, False), *((g, True) for g in _account_loans(request, ctx, account))]
        labels: Mapping[str, str] | None = None
        for grants, loan in checks:
            decided = grant_decision(request, grants)
            if decided is not None:
                if decided.allowed:
                    continue
                # Only roles with an invalid annotation grant this: they grant nothing.
                return Decision.deny(
                    decided.reason, f"{who(request)}: {whose} uses {ref}, and {grants.broken()}"
                )
            if labels is None:
                target = ObjectRef("", "v1", ref.kind, request.namespace, ref.name)
                try:
                    labels = labels_of(ctx.metadata(target))
                except ParentUnavailable as exc:
                    return Decision.deny(
                        UNAVAILABLE,
                        f"{who(request)}: {whose} uses {ref}, whose labels cannot be checked: "
                        f"{exc}",
                        mode=grants.mode(),
                    )
            denial = _label_denial(
                request,
                ctx,
                grants,
                labels,
                f"{whose} uses {ref}, which",
                resource,
                REFERENCE_DENIED,
                verb="get",
                limits=f": the user may run pods only as {grants.loan_limits()}" if loan else "",
            )
            if denial is not None:
                return denial
    return None


def _account_loans(request: Request, ctx: Context, account: bool) -> list[Grants]:
    """For a ServiceAccount, the roles that grant the write (of the pod, or of the workload whose
    template it is) by their identity loan limits: the pod runs with that account's grants on
    every resource, so a label-restricted role lends only accounts within all of its buckets
    (``Permissions.loan_entries``), whether or not it grants ``get`` on them."""
    if not account:
        return []
    return request_grants(request, ctx.snapshot, lends=Resource("", SERVICE_ACCOUNTS))


# --- the labels that decide identity loans -------------------------------------------------------

ACCOUNT = Resource("", SERVICE_ACCOUNTS)


def check_account(request: Request, ctx: Context) -> Decision | None:
    """A ServiceAccount's labels decide who may act as it (every identity loan is judged by
    them), so changing them, or deleting the account, is judged as lending it.

    The roles granting the write must lend the account as stored and, after a label change, as
    written: else a tenant allowed to write ServiceAccounts (no annotation entry limits them)
    could relabel another bucket's account into hers and run pods as it. A delete frees the
    name for an account of her labels, which inherits everything bound to the name. Other
    changes (secrets, automount) are left to the label rule.
    """
    if request.resource.subresource or request.operation not in ("UPDATE", "DELETE"):
        return None
    if (
        request.operation == "UPDATE"
        and request.old_object is not None
        and labels_of(request.old_object) == labels_of(request.object)
    ):
        return None
    versions: list[tuple[bool, Mapping[str, Any]]] | None = None
    for grants in request_grants(request, ctx.snapshot, lends=ACCOUNT):
        decided = grant_decision(request, grants)
        if decided is not None:
            if decided.allowed:
                continue
            return decided
        try:
            versions = versions if versions is not None else _versions(request, ctx)
        except ParentUnavailable as exc:
            return Decision.deny(
                UNAVAILABLE,
                f"{who(request)}: the labels it lends the account by cannot be checked: {exc}",
                mode=grants.mode(),
            )
        changing = "deleting" if request.operation == "DELETE" else "relabelling"
        for existing, obj in versions:
            denial = _label_denial(
                request,
                ctx,
                grants,
                labels_of(obj),
                "the account as stored" if existing else "the account as written",
                ACCOUNT,
                ACCOUNT_DENIED,
                limits=(
                    f": {changing} a ServiceAccount is judged as lending it, and the user may "
                    f"lend only {grants.loan_limits()}"
                ),
            )
            if denial is not None:
                return denial
    return None


# --- scale targets -------------------------------------------------------------------------------


def check_scale_target(request: Request, ctx: Context) -> Decision | None:
    """A HorizontalPodAutoscaler scales its target as the user would: judge the target's labels.

    The user's grant to scale the target decides (``update``/``patch`` on ``<resource>/scale``);
    without one, the autoscaler's own entry does.
    """
    if request.operation not in ("CREATE", "UPDATE") or request.resource.subresource:
        return None
    target = _dig(request.object, ("spec", "scaleTargetRef"))
    target = target if isinstance(target, Mapping) else {}
    kind, name = _text(target.get("kind")), _text(target.get("name"))
    api_version = _text(target.get("apiVersion"))
    group = api_version.rpartition("/")[0]
    known = SCALE_TARGETS.get((group, kind))
    candidates: list[tuple[Grants, Resource]] = []
    if known is not None:
        scaled = Resource(group, known[0], "scale")
        grants = find_grants(
            ctx.snapshot, request.user, request.namespace, ("update", "patch"), scaled, name
        )
        if grants.any:
            candidates.append((grants, scaled))
    if not candidates:
        resource = request.authorized_resource
        candidates = [(own, resource) for own in request_grants(request, ctx.snapshot)]
    described = f'{kind or "?"} "{name}" ({api_version or "no apiVersion"})'
    labels: Mapping[str, str] | None = None
    for grants, judged in candidates:
        decided = grant_decision(request, grants)
        if decided is not None:
            if decided.allowed:
                continue
            return decided
        if known is None or not name:
            supported = ", ".join(f"{k} ({g or 'v1'})" for g, k in SCALE_TARGETS)
            return Decision.deny(
                UNAVAILABLE,
                f"{who(request)}: its scaleTargetRef {described} cannot be checked: label-rbac "
                f"looks up only {supported}",
                mode=grants.mode(),
            )
        if labels is None:
            ref = ObjectRef(group, known[1], known[0], request.namespace, name)
            try:
                labels = labels_of(ctx.metadata(ref))
            except ParentUnavailable as exc:
                return Decision.deny(
                    UNAVAILABLE,
                    f"{who(request)}: its scaleTargetRef {described} cannot be checked: {exc}",
                    mode=grants.mode(),
                )
        subject = f"its scaleTargetRef {described}, which"
        denial = _label_denial(request, ctx, grants, labels, subject, judged, TEMPLATE_DENIED)
        if denial is not None:
            return denial
    return None


# --- bindings ------------------------------------------------------------------------------------


def check_binding(request: Request, ctx: Context) -> Decision | None:
    """``POST .../bindings`` binds the named pod and copies annotations to it: as pods/binding."""
    if request.operation != "CREATE" or request.resource.subresource:
        return None
    name = request.name or _text(_dig(request.object, ("metadata", "name")))
    # RBAC matched the roles on ``bindings``; their entries for ``pods/binding`` (or ``pods``) say
    # which pods the user may bind.
    granting = ctx.snapshot.granting_roles(
        request.user, request.namespace, ("create",), request.authorized_resource, name
    )
    grants = classify(granting, POD_BINDING)
    decided = grant_decision(request, grants)
    if decided is not None:
        return None if decided.allowed else decided
    ref = ObjectRef("", "v1", "pods", request.namespace, name)
    try:
        labels = labels_of(ctx.metadata(ref))
    except ParentUnavailable as exc:
        return Decision.deny(
            UNAVAILABLE,
            f"{who(request)}: the pod it binds cannot be checked: {exc}",
            mode=grants.mode(),
        )
    return _label_denial(
        request, ctx, grants, labels, f"it binds {ref}, which", POD_BINDING, TEMPLATE_DENIED
    )


# --- shared --------------------------------------------------------------------------------------


def _label_denial(
    request: Request,
    ctx: Context,
    grants: Grants,
    labels: Mapping[str, str],
    subject: str,
    judged: Resource,
    reason: str,
    verb: str = "",
    limits: str = "",
) -> Decision | None:
    """None when some restricted role permits ``labels``; else a denial naming the label, and
    what the roles permit (``limits``, when said otherwise than by their allowances)."""
    allow_unlabeled = ctx.options.allow_unlabeled
    if grants.passing(labels, allow_unlabeled):
        return None
    _, entries = grants.restricted[0]
    violation = next(v for e in entries if (v := e.violation(labels, allow_unlabeled)) is not None)
    has = (
        f"has no label {violation.key}"
        if violation.value is None
        else f'has label {violation.key}="{violation.value}"'
    )
    for_what = f"{verb} {judged}" if verb else str(judged)
    limits = limits or f", not permitted for {for_what} ({grants.allowances()})"
    return Decision.deny(
        reason,
        f"{who(request)}: {subject} {has}{limits}",
        *(f"{r.ref}: {' and '.join(e.describe() for e in es)}" for r, es in grants.restricted),
        mode=grants.mode(),
    )


def _dig(obj: Any, path: Path) -> Any:
    for key in path:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


RULES: Mapping[tuple[str, str], Callable[[Request, Context], Decision | None]] = {
    **{key: check_workload for key in WORKLOADS},
    ("", "pods"): check_pod,
    ("autoscaling", "horizontalpodautoscalers"): check_scale_target,
    ("", "bindings"): check_binding,
    ("", SERVICE_ACCOUNTS): check_account,
}
