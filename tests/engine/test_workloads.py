"""What a write makes controllers do: every rule of the workload rule set, through real reviews.

Each case is an AdmissionReview as the API server sends it (parsed by ``app.webhook.wire``), decided
by the whole pipeline against a small RBAC world in namespace ``t1``; the objects a rule looks up
come from a metadata lookup backed by a table of labelled objects.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from app.engine.context import (
    Context,
    ObjectRef,
    Options,
    ParentUnavailable,
    no_metadata_lookup,
    no_parent_lookup,
)
from app.engine.decide import POST_CHECKS, evaluate
from app.engine.model import Decision, Request
from app.engine.policy import DEFAULT_ANNOTATION_KEY
from app.engine.rbac import Compiler
from app.engine.workloads import RULES, WORKLOADS, check_workloads
from app.webhook.wire import parse_review
from tests.support import binding, load_review, make_review, role, rule, snapshot

NS = "t1"
TEAM_A = {"team": "a"}
TEAM_B = {"team": "b"}
A_ONLY = {"team": ["a"]}
ALL = "* */*"

WORLD = snapshot(
    # alice: everything in t1, every resource restricted to team=a.
    role("team-a", NS, [rule("*", ALL, "*")], {"*": A_ONLY}),
    binding("tenants-a", "team-a", "Group:tenants", namespace=NS),
    # dave: workloads and autoscalers restricted to team=a, and no grant on pods at all.
    role(
        "deployer",
        NS,
        [
            rule("*", "deployments", "apps"),
            rule("*", "cronjobs", "batch"),
            rule("*", "horizontalpodautoscalers", "autoscaling"),
        ],
        {
            "deployments.apps": A_ONLY,
            "cronjobs.batch": A_ONLY,
            "horizontalpodautoscalers.autoscaling": A_ONLY,
        },
    ),
    binding("dave", "deployer", "User:dave", namespace=NS),
    # erin: pods without limits, deployments restricted to team=a.
    role("pods-open", NS, [rule("*", "pods")]),
    role("deploy-a", NS, [rule("*", "deployments", "apps")], {"deployments.apps": A_ONLY}),
    binding("erin-pods", "pods-open", "User:erin", namespace=NS),
    binding("erin-deploy", "deploy-a", "User:erin", namespace=NS),
    # frank: pods only through a role whose annotation is invalid.
    role("broken", NS, [rule("create", "pods")], "{not json"),
    binding("frank-broken", "broken", "User:frank", namespace=NS),
    binding("frank-deploy", "deploy-a", "User:frank", namespace=NS),
    # gina: pods restricted to team=a; Secrets, ConfigMaps readable without label limits.
    role(
        "pods-a",
        NS,
        [rule("*", "pods pods/ephemeralcontainers"), rule("get", "secrets configmaps")],
        {"pods": A_ONLY},
    ),
    binding("gina", "pods-a", "User:gina", namespace=NS),
    # sched: the legacy bindings resource, restricted through the pods entry.
    role("binder", NS, [rule("create", "bindings")], {"pods": A_ONLY}),
    binding("sched", "binder", "User:sched", namespace=NS),
    # tina: pods and every workload kind restricted to team=a; no grant on serviceaccounts.
    role(
        "workloads-a",
        NS,
        [
            rule("*", "pods podtemplates replicationcontrollers"),
            rule("*", "deployments replicasets statefulsets daemonsets", "apps"),
            rule("*", "jobs cronjobs", "batch"),
        ],
        {
            "pods": A_ONLY,
            "podtemplates": A_ONLY,
            "replicationcontrollers": A_ONLY,
            "*.apps": A_ONLY,
            "*.batch": A_ONLY,
        },
    ),
    binding("tina", "workloads-a", "User:tina", namespace=NS),
    # sam: pods restricted to team=a; ServiceAccounts written without label limits (no entry
    # names them), lent only within team=a (every entry).
    role("edit-a", NS, [rule("*", "pods serviceaccounts")], {"pods": A_ONLY}),
    binding("sam", "edit-a", "User:sam", namespace=NS),
    # admin: everything everywhere, no annotation.
    role("admin", rules=[rule("*", ALL, "*")]),
    binding("admin", "admin", "User:admin"),
)

# The objects rules look up, by (resource, name) in t1.
STORED: dict[tuple[str, str], Mapping[str, str]] = {
    ("secrets", "s-a"): TEAM_A,
    ("secrets", "s-b"): TEAM_B,
    ("configmaps", "cm-a"): TEAM_A,
    ("configmaps", "cm-b"): TEAM_B,
    ("configmaps", "kube-root-ca.crt"): {},
    ("serviceaccounts", "default"): {},
    ("serviceaccounts", "sa-a"): TEAM_A,
    ("serviceaccounts", "sa-b"): TEAM_B,
    ("serviceaccounts", "sa-none"): {},
    ("persistentvolumeclaims", "pvc-a"): TEAM_A,
    ("persistentvolumeclaims", "pvc-b"): TEAM_B,
    ("deployments", "d-a"): TEAM_A,
    ("deployments", "d-b"): TEAM_B,
    ("replicationcontrollers", "rc-b"): TEAM_B,
    ("pods", "web-a"): TEAM_A,
    ("pods", "web-b"): TEAM_B,
}


@dataclass
class Cluster:
    """Metadata and parent lookups over ``STORED`` and ``parents``, noting every call."""

    parents: dict[tuple[str, str], Mapping[str, Any]] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)

    def metadata(self, ref: ObjectRef) -> Mapping[str, Any]:
        self.calls.append(f"{ref.resource}/{ref.name}")
        labels = STORED.get((ref.resource, ref.name))
        if ref.namespace != NS or labels is None:
            raise ParentUnavailable(f"could not read {ref}: HTTP 404 NotFound")
        return {"metadata": {"name": ref.name, "namespace": NS, "labels": dict(labels)}}

    def lookup(self, request: Request) -> Mapping[str, Any]:
        self.calls.append(f"{request.resource.resource}/{request.name}")
        found = self.parents.get((request.resource.resource, request.name))
        if found is None:
            raise ParentUnavailable(f"could not read {request.resource.resource}: HTTP 404")
        return found


def decide(req: Request, cluster: Cluster | None = None, allow_unlabeled: bool = False) -> Decision:
    cluster = cluster or Cluster()
    options = Options(Compiler((DEFAULT_ANNOTATION_KEY,)), allow_unlabeled)
    return evaluate(req, Context(WORLD, options, cluster.lookup, cluster.metadata))


# --- Building reviews ----------------------------------------------------------------------------

USERS = {
    "alice": ["tenants"],
    "dave": [],
    "erin": [],
    "frank": [],
    "gina": [],
    "sched": [],
    "tina": [],
    "sam": [],
    "admin": [],
}

# (group, version, resource, kind)
KINDS = {
    "Deployment": ("apps", "v1", "deployments"),
    "ReplicaSet": ("apps", "v1", "replicasets"),
    "StatefulSet": ("apps", "v1", "statefulsets"),
    "DaemonSet": ("apps", "v1", "daemonsets"),
    "ReplicationController": ("", "v1", "replicationcontrollers"),
    "Job": ("batch", "v1", "jobs"),
    "CronJob": ("batch", "v1", "cronjobs"),
    "PodTemplate": ("", "v1", "podtemplates"),
    "Pod": ("", "v1", "pods"),
    "HorizontalPodAutoscaler": ("autoscaling", "v2", "horizontalpodautoscalers"),
    "Binding": ("", "v1", "bindings"),
    "ServiceAccount": ("", "v1", "serviceaccounts"),
}


def review(
    user: str,
    operation: str,
    obj: Mapping[str, Any] | None,
    old: Mapping[str, Any] | None = None,
    sub: str = "",
    kind: str = "",
    of: str = "",
) -> Request:
    """A review of ``obj`` (``of``: the kind of the resource, when ``obj`` is a Scale)."""
    source = obj if obj is not None else old
    assert source is not None
    group, version, resource = KINDS[of or source["kind"]]
    request: dict[str, Any] = {
        "uid": "5b7c8a52-0000-4000-8000-000000000001",
        "kind": {"group": group, "version": version, "kind": kind or source["kind"]},
        "resource": {"group": group, "version": version, "resource": resource},
        "name": source["metadata"]["name"],
        "namespace": NS,
        "operation": operation,
        "userInfo": {"username": user, "groups": [*USERS[user], "system:authenticated"]},
        "object": obj,
        "oldObject": old,
        "dryRun": False,
    }
    if sub:
        request["subResource"] = sub
    document = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    return parse_review(json.loads(json.dumps(document))).request


def pod_spec(**fields: Any) -> dict[str, Any]:
    return {"containers": [{"name": "c", "image": "nginx"}], **fields}


def template(labels: Mapping[str, str], **spec: Any) -> dict[str, Any]:
    return {"metadata": {"labels": dict(labels)}, "spec": pod_spec(**spec)}


def selector(labels: Mapping[str, str] | None) -> dict[str, Any] | None:
    return None if labels is None else {"matchLabels": dict(labels)}


def workload(
    kind: str,
    labels: Mapping[str, str] = TEAM_A,
    pods: Mapping[str, str] = TEAM_A,
    select: Mapping[str, str] | None = TEAM_A,
    name: str = "w",
    job_labels: Mapping[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """A workload of ``kind`` as the API server stores it, with its pod template and selector."""
    group, version, _ = KINDS[kind]
    meta = {"name": name, "namespace": NS, "labels": dict(labels)}
    body: dict[str, Any]
    if kind == "PodTemplate":
        body = {"template": template(pods, **spec)}
    elif kind == "CronJob":
        job_template = {
            "metadata": {"labels": dict(job_labels or pods)},
            "spec": {"template": template(pods, **spec)},
        }
        body = {"spec": {"schedule": "* * * * *", "jobTemplate": job_template}}
    elif kind == "ReplicationController":
        rc = {"replicas": 1, "selector": dict(select or {}), "template": template(pods, **spec)}
        body = {"spec": rc}
    elif kind == "Job":
        job = {"template": template(pods, **spec)}
        if select is not None:
            job |= {"selector": selector(select), "manualSelector": True}
        else:
            # What the API server generates when the selector is not written by hand.
            uid = {"batch.kubernetes.io/controller-uid": "1f0c"}
            job |= {"selector": selector(uid), "manualSelector": False}
            job["template"]["metadata"]["labels"] |= uid
        body = {"spec": job}
    else:
        body = {"spec": {"selector": selector(select), "template": template(pods, **spec)}}
    api_version = f"{group}/{version}" if group else version
    return {"apiVersion": api_version, "kind": kind, "metadata": meta, **body}


def pod(name: str = "p", labels: Mapping[str, str] = TEAM_A, **spec: Any) -> dict[str, Any]:
    meta = {"name": name, "namespace": NS, "labels": dict(labels)}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": pod_spec(**spec)}


def hpa(kind: str, name: str, api_version: str = "apps/v1", v1: bool = False) -> dict[str, Any]:
    target = {"apiVersion": api_version, "kind": kind, "name": name}
    spec: dict[str, Any] = {"scaleTargetRef": target, "maxReplicas": 3}
    meta = {"name": "h", "namespace": NS, "labels": dict(TEAM_A)}
    version = "autoscaling/v1" if v1 else "autoscaling/v2"
    return {
        "apiVersion": version,
        "kind": "HorizontalPodAutoscaler",
        "metadata": meta,
        "spec": spec,
    }


def legacy_binding(pod_name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": pod_name, "namespace": NS, "annotations": {"x": "y"}},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "node1"},
    }


# --- Templates and selectors of every workload kind ----------------------------------------------

# Jobs and CronJobs are judged by their selector only when it is written by hand (below).
SELECTED = [k for k in WORKLOADS.values() if k.selector is not None and not k.manual_selector]
TEMPLATED = [spec.kind for spec in WORKLOADS.values()]


@pytest.mark.parametrize("kind", TEMPLATED)
def test_template_in_bucket_is_allowed(kind: str) -> None:
    decision = decide(review("alice", "CREATE", workload(kind)))
    assert decision.allowed, decision.message


@pytest.mark.parametrize("kind", TEMPLATED)
def test_template_in_another_bucket_is_refused(kind: str) -> None:
    decision = decide(review("alice", "CREATE", workload(kind, pods=TEAM_B, select=TEAM_B)))
    assert (decision.allowed, decision.reason) == (False, "TemplateLabelNotPermitted")
    assert 'has label team="b", not permitted for pods (role t1/team-a allows team in [a])' in (
        decision.message
    )


@pytest.mark.parametrize("kind", [w.kind for w in SELECTED])
def test_selector_reaching_outside_the_bucket_is_refused(kind: str) -> None:
    decision = decide(review("alice", "CREATE", workload(kind, select={"app": "web"})))
    assert (decision.allowed, decision.reason) == (False, "SelectorNotPermitted")
    assert "(app=web) can match pods of other labels" in decision.message
    assert "it must select only permitted values of team" in decision.message


def selector_case(select: Any, allowed: bool, kind: str = "Deployment") -> Any:
    obj = workload(kind)
    obj["spec"]["selector"] = select
    return obj, allowed


@pytest.mark.parametrize(
    ("obj", "allowed"),
    [
        pytest.param(*selector_case({"matchLabels": {"team": "a", "app": "x"}}, True), id="and"),
        pytest.param(
            *selector_case(
                {"matchExpressions": [{"key": "team", "operator": "In", "values": ["a"]}]}, True
            ),
            id="expression-in",
        ),
        pytest.param(
            *selector_case(
                {"matchExpressions": [{"key": "team", "operator": "In", "values": ["a", "b"]}]},
                False,
            ),
            id="expression-in-two-buckets",
        ),
        pytest.param(
            *selector_case(
                {"matchExpressions": [{"key": "team", "operator": "NotIn", "values": ["b"]}]},
                False,
            ),
            id="not-in-confines-nothing",
        ),
        pytest.param(*selector_case({}, False), id="empty-selects-everything"),
        pytest.param(*selector_case(None, False), id="no-selector"),
        pytest.param(*selector_case({"matchLabels": "team=a"}, False), id="malformed"),
        pytest.param(*selector_case({"team": "a"}, True, "ReplicationController"), id="rc-map"),
        pytest.param(*selector_case({"app": "x"}, False, "ReplicationController"), id="rc-open"),
    ],
)
def test_selector_shapes(obj: dict[str, Any], allowed: bool) -> None:
    decision = decide(review("alice", "CREATE", obj))
    assert decision.allowed is allowed, decision.message
    if not allowed:
        assert decision.reason == "SelectorNotPermitted"


def test_job_with_a_generated_selector_is_judged_by_its_template() -> None:
    assert decide(review("alice", "CREATE", workload("Job", select=None))).allowed
    foreign = workload("Job", pods=TEAM_B, select=None)
    assert decide(review("alice", "CREATE", foreign)).reason == "TemplateLabelNotPermitted"


def test_job_with_a_manual_selector_must_confine_it() -> None:
    decision = decide(review("alice", "CREATE", workload("Job", select={"app": "x"})))
    assert decision.reason == "SelectorNotPermitted"
    cron = workload("CronJob")
    job_spec = cron["spec"]["jobTemplate"]["spec"]
    job_spec |= {"manualSelector": True, "selector": selector({"app": "x"})}
    decision = decide(review("alice", "CREATE", cron))
    assert decision.reason == "SelectorNotPermitted"
    assert "its spec.jobTemplate.spec.selector (app=x)" in decision.message
    job_spec["selector"] = selector(TEAM_A)
    assert decide(review("alice", "CREATE", cron)).allowed


def test_cronjob_job_template_labels_are_judged_for_jobs() -> None:
    cron = workload("CronJob", job_labels=TEAM_B)
    decision = decide(review("alice", "CREATE", cron))
    assert decision.reason == "TemplateLabelNotPermitted"
    assert 'jobs template (spec.jobTemplate) has label team="b", not permitted for jobs.batch' in (
        decision.message
    )


def test_missing_template_label_passes_only_with_allow_unlabeled() -> None:
    obj = workload("Deployment", pods={"app": "x"}, select={"team": "a", "app": "x"})
    denied = decide(review("alice", "CREATE", obj))
    assert "has no label team, not permitted for pods" in denied.message
    assert decide(review("alice", "CREATE", obj), allow_unlabeled=True).allowed


# --- Operations and subresources -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("old_pods", "new_pods", "fragment"),
    [
        pytest.param(TEAM_A, TEAM_A, "", id="in-bucket"),
        pytest.param(
            TEAM_A, TEAM_B, 'its pod template (spec.template) has label team="b"', id="new"
        ),
        pytest.param(
            TEAM_B, TEAM_A, 'its stored pod template (spec.template) has label team="b"', id="take"
        ),
    ],
)
def test_update_judges_stored_and_new_template(
    old_pods: Mapping[str, str], new_pods: Mapping[str, str], fragment: str
) -> None:
    old = workload("Deployment", pods=old_pods, select=None)
    new = workload("Deployment", pods=new_pods, select=None)
    for obj in (old, new):  # apps/v1 selectors are immutable; keep it in the bucket
        obj["spec"]["selector"] = selector(TEAM_A)
    decision = decide(review("alice", "UPDATE", new, old))
    assert decision.allowed is not fragment, decision.message
    assert fragment in decision.message


def test_delete_judges_the_stored_template() -> None:
    foreign = workload("ReplicaSet", pods=TEAM_B, select=TEAM_B)
    decision = decide(review("alice", "DELETE", None, foreign))
    assert 'its stored pod template (spec.template) has label team="b"' in decision.message
    assert decide(review("alice", "DELETE", None, workload("ReplicaSet"))).allowed


def test_status_is_not_judged() -> None:
    """The API server keeps the spec on a status write: the template cannot change there."""
    foreign = workload("Deployment", pods=TEAM_B, select=TEAM_B)
    decision = decide(review("alice", "UPDATE", foreign, foreign, sub="status"))
    assert decision.allowed, decision.message


def scale(name: str = "w") -> Request:
    obj = {"apiVersion": "autoscaling/v1", "kind": "Scale", "metadata": {"name": name}}
    spec = {"replicas": 3}
    return review(
        "alice", "UPDATE", {**obj, "spec": spec}, obj, sub="scale", kind="Scale", of="Deployment"
    )


def test_scale_judges_the_stored_template() -> None:
    """Scaling makes the controller create or delete pods from the stored template."""
    foreign = Cluster({("deployments", "w"): workload("Deployment", pods=TEAM_B, select=TEAM_B)})
    decision = decide(scale(), foreign)
    assert decision.reason == "TemplateLabelNotPermitted", decision.message
    assert 'its stored pod template (spec.template) has label team="b"' in decision.message
    assert decide(scale(), Cluster({("deployments", "w"): workload("Deployment")})).allowed


def test_scale_without_cluster_access_fails_closed() -> None:
    options = Options(Compiler((DEFAULT_ANNOTATION_KEY,)))
    ctx = Context(WORLD, options, no_parent_lookup, no_metadata_lookup)
    decision = evaluate(scale(), ctx)
    assert (decision.allowed, decision.reason) == (False, "ParentUnavailable")
    assert "runs without cluster access (static --rbac-dir)" in decision.message


# --- Whose grants judge a template ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("user", "obj", "reason", "fragment"),
    [
        pytest.param(
            "dave",
            workload("Deployment", pods=TEAM_B, select=TEAM_B),
            "TemplateLabelNotPermitted",
            "not permitted for deployments.apps (role t1/deployer allows team in [a])",
            id="no-pod-grant-falls-back-to-the-workload-entry",
        ),
        pytest.param(
            "dave", workload("Deployment"), "LabelsPermitted", "", id="fallback-in-bucket"
        ),
        pytest.param(
            "erin",
            workload("Deployment", pods=TEAM_B, select={"app": "x"}),
            "LabelsPermitted",
            "",
            id="unrestricted-pods-leave-the-template-free",
        ),
        pytest.param(
            "frank",
            workload("Deployment", pods=TEAM_B),
            "InvalidAnnotation",
            "role t1/broken grants nothing here",
            id="pod-grant-through-an-invalid-annotation",
        ),
        pytest.param(
            "admin",
            workload("Deployment", pods=TEAM_B, select={}),
            "Unrestricted",
            "",
            id="admin",
        ),
    ],
)
def test_template_grants(user: str, obj: dict[str, Any], reason: str, fragment: str) -> None:
    cluster = Cluster()
    decision = decide(review(user, "CREATE", obj), cluster)
    assert decision.reason == reason, decision.message
    assert fragment in decision.message
    if decision.allowed:
        assert cluster.calls == []


# --- References of pods and pod templates --------------------------------------------------------


def env(ref: str, name: str) -> list[dict[str, Any]]:
    return [{"name": "X", "valueFrom": {ref: {"name": name, "key": "k"}}}]


REFERENCES = [
    pytest.param({"volumes": [{"name": "v", "secret": {"secretName": "s-a"}}]}, "", id="secret-a"),
    pytest.param(
        {"volumes": [{"name": "v", "secret": {"secretName": "s-b"}}]},
        'secrets "s-b"',
        id="secret-b",
    ),
    pytest.param(
        {"containers": [{"name": "c", "image": "i", "env": env("secretKeyRef", "s-b")}]},
        'secrets "s-b"',
        id="env-secret",
    ),
    pytest.param(
        {"initContainers": [{"name": "i", "envFrom": [{"configMapRef": {"name": "cm-b"}}]}]},
        'configmaps "cm-b"',
        id="init-env-from-configmap",
    ),
    pytest.param({"imagePullSecrets": [{"name": "s-b"}]}, 'secrets "s-b"', id="pull-secret"),
    pytest.param(
        {"volumes": [{"name": "v", "projected": {"sources": [{"secret": {"name": "s-b"}}]}}]},
        'secrets "s-b"',
        id="projected-secret",
    ),
    pytest.param(
        {"volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "pvc-b"}}]},
        'persistentvolumeclaims "pvc-b"',
        id="pvc",
    ),
    pytest.param({"serviceAccountName": "sa-a"}, "", id="service-account-a"),
    pytest.param({"serviceAccountName": "sa-b"}, 'serviceaccounts "sa-b"', id="service-account-b"),
    pytest.param({"serviceAccountName": "default"}, "", id="default-service-account"),
]


@pytest.mark.parametrize(("spec", "offender"), REFERENCES)
def test_pod_references(spec: dict[str, Any], offender: str) -> None:
    decision = decide(review("alice", "CREATE", pod(**spec)))
    assert decision.allowed is not offender, decision.message
    if offender:
        assert decision.reason == "ReferenceNotPermitted"
        assert decision.message == (
            f'user "alice" may not create pods "p" in namespace "t1": it uses {offender}, which '
            f'has label team="b", not permitted for get {offender.split()[0]} '
            "(role t1/team-a allows team in [a])"
        )


@pytest.mark.parametrize(("spec", "offender"), REFERENCES)
def test_pod_template_references(spec: dict[str, Any], offender: str) -> None:
    obj = workload("StatefulSet", **spec)
    decision = decide(review("alice", "CREATE", obj))
    assert decision.allowed is not offender, decision.message
    if offender:
        assert f"its pod template uses {offender}, which has label" in decision.message


SERVICE_CA = {
    "configMap": {
        "name": "openshift-service-ca.crt",
        "items": [{"key": "service-ca.crt", "path": "service-ca.crt"}],
    }
}


@pytest.mark.parametrize("openshift", [False, True], ids=["kubernetes", "openshift"])
def test_what_the_api_server_injects_keeps_working(openshift: bool) -> None:
    """The default service account, its token and the root CA ConfigMap (a recorded pod), and
    the service CA OpenShift's API server adds to the same projected volume."""
    recorded = copy.deepcopy(load_review("b008-create-pods")["request"]["object"])
    recorded["metadata"] |= {"namespace": NS, "labels": dict(TEAM_A)}
    if openshift:
        (access,) = [v for v in recorded["spec"]["volumes"] if "projected" in v]
        access["projected"]["sources"].append(SERVICE_CA)
    cluster = Cluster()
    decision = decide(review("alice", "CREATE", recorded), cluster)
    assert decision.allowed, decision.message
    assert cluster.calls == []


def test_unreadable_reference_fails_closed() -> None:
    missing = pod(volumes=[{"name": "v", "secret": {"secretName": "gone"}}])
    decision = decide(review("alice", "CREATE", missing))
    assert (decision.allowed, decision.reason) == (False, "ParentUnavailable")
    assert decision.message == (
        'user "alice" may not create pods "p" in namespace "t1": it uses secrets "gone", whose '
        'labels cannot be checked: could not read secrets "gone" in namespace "t1": '
        "HTTP 404 NotFound"
    )
    ctx = Context(WORLD, Options(Compiler((DEFAULT_ANNOTATION_KEY,))))
    static = evaluate(review("alice", "CREATE", missing), ctx)
    assert "this webhook runs without cluster access (static --rbac-dir)" in static.message


def test_references_are_judged_only_where_get_is_restricted() -> None:
    """gina may read every Secret and ConfigMap, so RBAC's own rules decide what she mounts."""
    spec = {"volumes": [{"name": "v", "secret": {"secretName": "s-b"}}]}
    cluster = Cluster()
    assert decide(review("gina", "CREATE", pod(**spec)), cluster).allowed
    assert cluster.calls == []


def test_ephemeral_containers_are_judged() -> None:
    old = pod()
    new = copy.deepcopy(old)
    debug = {"name": "debug", "image": "busybox", "env": env("secretKeyRef", "s-b")}
    new["spec"]["ephemeralContainers"] = [debug]
    decision = decide(review("gina", "UPDATE", new, old, sub="ephemeralcontainers"))
    assert decision.allowed  # gina's get on secrets is unrestricted
    decision = decide(review("alice", "UPDATE", new, old, sub="ephemeralcontainers"))
    assert decision.reason == "ReferenceNotPermitted"


def test_pod_status_is_not_judged() -> None:
    spec = {"volumes": [{"name": "v", "secret": {"secretName": "s-b"}}]}
    cluster = Cluster()
    stored = pod(**spec)
    assert decide(review("alice", "UPDATE", stored, stored, sub="status"), cluster).allowed
    assert cluster.calls == []


# --- The ServiceAccount a pod runs as: lent by the roles that grant the write -------------------

RUNS_AS = [*TEMPLATED, "Pod"]


def running_as(kind: str, account: str, user: str = "tina") -> Request:
    """A CREATE of a pod, or of a workload of ``kind``, whose pods run as ``account``."""
    if kind == "Pod":
        return review(user, "CREATE", pod(serviceAccountName=account))
    return review(user, "CREATE", workload(kind, serviceAccountName=account))


def loan_denial(kind: str, account: str, has: str, role: str = "workloads-a") -> str:
    group, _, resource = KINDS[kind]
    name = "p" if kind == "Pod" else "w"
    written = f'{resource}.{group} "{name}"' if group else f'{resource} "{name}"'
    whose = "it" if kind == "Pod" else "its pod template"
    return (
        f'user "tina" may not create {written} in namespace "t1": {whose} uses '
        f'serviceaccounts "{account}", which {has}: the user may run pods only as '
        f"ServiceAccounts labeled team in [a] (role t1/{role})"
    )


@pytest.mark.parametrize("kind", RUNS_AS)
@pytest.mark.parametrize(
    ("account", "has"),
    [
        pytest.param("sa-a", "", id="own-bucket"),
        pytest.param("default", "", id="namespace-default"),
        pytest.param("sa-b", 'has label team="b"', id="other-bucket"),
        pytest.param("sa-none", "has no label team", id="unlabeled"),
    ],
)
def test_pods_run_only_as_service_accounts_the_writing_roles_lend(
    kind: str, account: str, has: str
) -> None:
    """tina holds no grant on ServiceAccounts: the roles granting the write lend the account."""
    decision = decide(running_as(kind, account))
    assert decision.allowed is not has, decision.message
    if has:
        assert decision.reason == "ReferenceNotPermitted"
        assert decision.message == loan_denial(kind, account, has)


@pytest.mark.parametrize("kind", RUNS_AS)
def test_a_service_account_that_cannot_be_read_is_not_lent(kind: str) -> None:
    decision = decide(running_as(kind, "sa-gone"))
    assert (decision.allowed, decision.reason) == (False, "ParentUnavailable")
    assert decision.message.endswith(
        'uses serviceaccounts "sa-gone", whose labels cannot be checked: could not read '
        'serviceaccounts "sa-gone" in namespace "t1": HTTP 404 NotFound'
    )


@pytest.mark.parametrize("kind", RUNS_AS)
def test_unrestricted_writers_run_pods_as_any_service_account(kind: str) -> None:
    assert decide(running_as(kind, "sa-b", user="admin")).allowed


@pytest.mark.parametrize(
    ("obj", "allowed"),
    [
        pytest.param(pod(serviceAccountName="sa-b"), True, id="pod-through-unannotated-role"),
        pytest.param(
            workload("Deployment", serviceAccountName="sa-b"),
            False,
            id="deployment-through-annotated-role",
        ),
    ],
)
def test_the_roles_granting_the_write_lend_the_account(obj: dict[str, Any], allowed: bool) -> None:
    """erin writes pods through an unannotated role, Deployments through one limited to team=a."""
    decision = decide(review("erin", "CREATE", obj))
    assert decision.allowed is allowed, decision.message


def test_an_update_judges_the_account_the_new_template_runs_as() -> None:
    old = workload("Deployment", serviceAccountName="sa-a")
    new = workload("Deployment", serviceAccountName="sa-b")
    decision = decide(review("tina", "UPDATE", new, old))
    assert decision.message == loan_denial("Deployment", "sa-b", 'has label team="b"').replace(
        "create", "update"
    )


def test_the_deprecated_service_account_field_is_judged_too() -> None:
    decision = decide(review("tina", "CREATE", pod(serviceAccount="sa-b")))
    assert decision.message == loan_denial("Pod", "sa-b", 'has label team="b"')


# --- Scale targets and bindings ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("user", "obj", "reason", "fragment"),
    [
        pytest.param("alice", hpa("Deployment", "d-a"), "LabelsPermitted", "", id="target-a"),
        pytest.param(
            "alice",
            hpa("Deployment", "d-b"),
            "TemplateLabelNotPermitted",
            'its scaleTargetRef Deployment "d-b" (apps/v1), which has label team="b", not '
            "permitted for deployments.apps/scale",
            id="target-b",
        ),
        pytest.param(
            "alice",
            hpa("Deployment", "d-b", v1=True),
            "TemplateLabelNotPermitted",
            'Deployment "d-b"',
            id="autoscaling-v1",
        ),
        pytest.param(
            "alice",
            hpa("ReplicationController", "rc-b", "v1"),
            "TemplateLabelNotPermitted",
            "not permitted for replicationcontrollers/scale",
            id="replicationcontroller",
        ),
        pytest.param(
            "alice",
            hpa("Deployment", "nope"),
            "ParentUnavailable",
            'could not read deployments.apps "nope" in namespace "t1": HTTP 404',
            id="missing-target",
        ),
        pytest.param(
            "alice",
            hpa("Widget", "w", "example.com/v1"),
            "ParentUnavailable",
            'its scaleTargetRef Widget "w" (example.com/v1) cannot be checked: label-rbac looks '
            "up only Deployment (apps)",
            id="unknown-kind",
        ),
        pytest.param(
            "dave",
            hpa("Deployment", "d-b"),
            "TemplateLabelNotPermitted",
            "not permitted for horizontalpodautoscalers.autoscaling",
            id="no-scale-grant-falls-back-to-the-autoscaler-entry",
        ),
        pytest.param("admin", hpa("Widget", "w", "x/v1"), "Unrestricted", "", id="admin"),
    ],
)
def test_scale_targets(user: str, obj: dict[str, Any], reason: str, fragment: str) -> None:
    decision = decide(review(user, "CREATE", obj))
    assert decision.reason == reason, decision.message
    assert fragment in decision.message


@pytest.mark.parametrize(
    ("user", "pod_name", "reason"),
    [
        # sched's roles have no entry for ``bindings`` itself; the pods entry judges the pod.
        pytest.param("sched", "web-a", "Unrestricted", id="own-pod"),
        pytest.param("sched", "web-b", "TemplateLabelNotPermitted", id="foreign-pod"),
        pytest.param("sched", "gone", "ParentUnavailable", id="missing-pod"),
        pytest.param("admin", "web-b", "Unrestricted", id="admin"),
    ],
)
def test_legacy_bindings_are_judged_by_the_pod(user: str, pod_name: str, reason: str) -> None:
    decision = decide(review(user, "CREATE", legacy_binding(pod_name)))
    assert decision.reason == reason, decision.message
    if reason == "TemplateLabelNotPermitted":
        assert decision.message == (
            'user "sched" may not create bindings "web-b" in namespace "t1": it binds pods '
            '"web-b" in namespace "t1", which has label team="b", not permitted for pods/binding '
            "(role t1/binder allows team in [a])"
        )


# --- Cost ----------------------------------------------------------------------------------------


def test_other_resources_are_not_looked_at() -> None:
    """A custom resource shaped like a workload is no built-in controller's business."""
    widget = workload("Deployment", pods=TEAM_B, select={})
    document = make_review("alice", "CREATE", "widgets.example.com", namespace=NS, labels=TEAM_A)
    document["request"]["object"] |= {"spec": widget["spec"]}
    req = parse_review(document).request
    cluster = Cluster()
    ctx = Context(WORLD, Options(), cluster.lookup, cluster.metadata)
    assert check_workloads(req, ctx) is None
    assert cluster.calls == []


def test_the_rule_runs_after_the_label_rule() -> None:
    assert check_workloads in POST_CHECKS


@pytest.mark.parametrize("mode", ["warn", "audit"])
def test_softer_modes_soften_workload_denials(mode: str) -> None:
    """A denial of these rules is a policy denial like the label rule's: modes apply to it."""
    options = Options(Compiler((DEFAULT_ANNOTATION_KEY,)), mode=mode)
    cluster = Cluster()
    ctx = Context(WORLD, options, cluster.lookup, cluster.metadata)
    decision = evaluate(review("alice", "CREATE", workload("Deployment", pods=TEAM_B)), ctx)
    assert (decision.allowed, decision.mode, decision.reason) == (
        True,
        mode,
        "TemplateLabelNotPermitted",
    )
    assert 'its pod template (spec.template) has label team="b"' in decision.message
    assert bool(decision.warnings) is (mode == "warn")


def claim(labels: Mapping[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": "data", "labels": dict(labels)}, "spec": {"resources": {}}}


@pytest.mark.parametrize(
    ("claims", "fragment"),
    [
        pytest.param([claim(TEAM_A)], "", id="in-bucket"),
        pytest.param(
            [claim(TEAM_A), claim(TEAM_B)],
            'its volume claim template (spec.volumeClaimTemplates[1]) has label team="b", not '
            "permitted for persistentvolumeclaims",
            id="second-foreign",
        ),
        pytest.param(
            [claim({})], "(spec.volumeClaimTemplates[0]) has no label team", id="unlabeled"
        ),
    ],
)
def test_statefulset_claim_templates_are_judged_for_claims(
    claims: list[dict[str, Any]], fragment: str
) -> None:
    """The StatefulSet controller creates a PersistentVolumeClaim from each template."""
    obj = workload("StatefulSet")
    obj["spec"]["volumeClaimTemplates"] = claims
    decision = decide(review("alice", "CREATE", obj))
    assert decision.allowed is not fragment, decision.message
    assert fragment in decision.message


def test_reference_granted_only_through_an_invalid_annotation_is_refused() -> None:
    """frank reads Secrets only through a role whose annotation is broken: it grants nothing."""
    world = snapshot(
        role("broken-get", NS, [rule("get", "secrets"), rule("create", "pods")], "{not json"),
        role("pods-open", NS, [rule("create", "pods")]),
        binding("frank-get", "broken-get", "User:frank", namespace=NS),
        binding("frank-pods", "pods-open", "User:frank", namespace=NS),
    )
    cluster = Cluster()
    ctx = Context(world, Options(), cluster.lookup, cluster.metadata)
    spec = {"volumes": [{"name": "v", "secret": {"secretName": "s-a"}}]}
    decision = evaluate(review("frank", "CREATE", pod(**spec)), ctx)
    assert (decision.allowed, decision.reason) == (False, "InvalidAnnotation")
    assert decision.message.startswith(
        'user "frank" may not create pods "p" in namespace "t1": it uses secrets "s-a", and role '
        "t1/broken-get grants nothing here: "
    )
    assert cluster.calls == []


@pytest.mark.parametrize("user", ["alice", "dave", "erin", "frank", "gina", "sched", "admin"])
def test_the_shortcut_for_users_without_label_limits_changes_no_decision(user: str) -> None:
    """Users bound to no annotated role skip the rules; the rules alone decide the same."""
    cluster = Cluster({("deployments", "w"): workload("Deployment", pods=TEAM_B)})
    ctx = Context(WORLD, Options(), cluster.lookup, cluster.metadata)
    secret = {"volumes": [{"name": "v", "secret": {"secretName": "s-b"}}]}
    for obj in (workload("Deployment", pods=TEAM_B, select={}, **secret), pod(**secret)):
        req = review(user, "CREATE", obj)
        rule = RULES[(req.resource.group, req.resource.resource)]
        assert check_workloads(req, ctx) == rule(req, ctx)


def test_a_new_snapshot_is_seen_by_the_shortcut() -> None:
    foreign = review("erin", "CREATE", workload("StatefulSet", pods=TEAM_B, select={}))
    open_world = snapshot(
        role("pods-open", NS, [rule("*", "pods"), rule("*", "statefulsets", "apps")]),
        binding("erin", "pods-open", "User:erin", namespace=NS),
    )
    assert check_workloads(foreign, Context(open_world)) is None
    limited = snapshot(
        role("pods-a", NS, [rule("*", "pods"), rule("*", "statefulsets", "apps")], {"*": A_ONLY}),
        binding("erin", "pods-a", "User:erin", namespace=NS),
    )
    denial = check_workloads(foreign, Context(limited))
    assert denial is not None and denial.reason == "TemplateLabelNotPermitted"
    assert check_workloads(foreign, Context(open_world)) is None


# --- The labels that decide identity loans: relabelling a ServiceAccount is lending it ---------


def account(name: str, labels: Mapping[str, str], **fields: Any) -> dict[str, Any]:
    meta = {"name": name, "namespace": NS, "labels": dict(labels)}
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta, **fields}


def account_denial(verb: str, name: str, version: str, has: str) -> str:
    changing = "deleting" if verb == "delete" else "relabelling"
    return (
        f'user "sam" may not {verb} serviceaccounts "{name}" in namespace "t1": the account '
        f"as {version} {has}: {changing} a ServiceAccount is judged as lending it, and the "
        "user may lend only ServiceAccounts labeled team in [a] (role t1/edit-a)"
    )


@pytest.mark.parametrize(
    ("user", "operation", "new", "old", "message"),
    [
        pytest.param("sam", "UPDATE", account("sa-b", TEAM_A), account("sa-b", TEAM_B),
                     account_denial("update", "sa-b", "stored", 'has label team="b"'),
                     id="another-bucket-into-hers"),
        pytest.param("sam", "UPDATE", account("sa-none", TEAM_A), account("sa-none", {}),
                     account_denial("update", "sa-none", "stored", "has no label team"),
                     id="unlabeled-into-hers"),
        pytest.param("sam", "UPDATE", account("sa-a", TEAM_B), account("sa-a", TEAM_A),
                     account_denial("update", "sa-a", "written", 'has label team="b"'),
                     id="hers-into-another-bucket"),
        pytest.param("sam", "UPDATE", account("sa-a", {**TEAM_A, "tier": "x"}),
                     account("sa-a", TEAM_A), None, id="hers-relabelled-within"),
        pytest.param("sam", "UPDATE", account("sa-b", TEAM_B, automountServiceAccountToken=False),
                     account("sa-b", TEAM_B), None, id="labels-unchanged"),
        pytest.param("sam", "DELETE", None, account("sa-b", TEAM_B),
                     account_denial("delete", "sa-b", "stored", 'has label team="b"'),
                     id="delete-another-buckets"),
        pytest.param("sam", "DELETE", None, account("sa-a", TEAM_A), None, id="delete-hers"),
        pytest.param("sam", "CREATE", account("sa-new", TEAM_B), None, None,
                     id="create-is-no-loan"),
        pytest.param("admin", "UPDATE", account("sa-b", TEAM_A), account("sa-b", TEAM_B), None,
                     id="unrestricted-writer"),
    ],
)  # fmt: skip
def test_relabelling_a_service_account_is_judged_as_lending_it(
    user: str,
    operation: str,
    new: dict[str, Any] | None,
    old: dict[str, Any] | None,
    message: str | None,
) -> None:
    """sam may write any ServiceAccount (her role's entries do not name them) but lends only
    team=a: she may not move an account between what she may and may not lend."""
    decision = decide(review(user, operation, new, old))
    assert decision.allowed is (message is None), decision.message
    if message is not None:
        assert (decision.reason, decision.message) == ("AccountNotLent", message)


@pytest.mark.parametrize(
    ("operation", "new"),
    [
        pytest.param("UPDATE", account("sa-b", TEAM_A), id="update-without-old-object"),
        pytest.param("DELETE", None, id="delete-without-old-object"),
    ],
)
def test_an_account_whose_stored_labels_cannot_be_read_is_not_relabelled(
    operation: str, new: dict[str, Any] | None
) -> None:
    request = review("sam", operation, new, account("sa-b", TEAM_B))
    request = dataclasses.replace(request, old_object=None)
    decision = decide(request)
    assert (decision.allowed, decision.reason) == (False, "ParentUnavailable"), decision.message
    assert "the labels it lends the account by cannot be checked" in decision.message


@pytest.mark.parametrize("mode", ["warn", "audit"])
def test_softer_modes_soften_account_denials(mode: str) -> None:
    options = Options(Compiler((DEFAULT_ANNOTATION_KEY,)), mode=mode)
    cluster = Cluster()
    ctx = Context(WORLD, options, cluster.lookup, cluster.metadata)
    request = review("sam", "UPDATE", account("sa-b", TEAM_A), account("sa-b", TEAM_B))
    decision = evaluate(request, ctx)
    assert (decision.allowed, decision.mode, decision.reason) == (True, mode, "AccountNotLent")
    assert bool(decision.warnings) is (mode == "warn")
