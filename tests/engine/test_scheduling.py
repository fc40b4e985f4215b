"""The placement rule, through real AdmissionReview payloads decided by the whole pipeline.

Two pools of Nodes (``node-restriction.kubernetes.io/pool`` a and b, each tainted ``pool``), tenants
of bucket ``team=a`` and ``team=b`` whose roles place them on their pool, and users around them: a
tenant of both, one with an unplaced grant too, a role with a placement and no permissions, a
warn-mode role, a deployer without pod grants, an unrestricted admin.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.engine.context import Context, ObjectRef, Options, ParentUnavailable
from app.engine.decide import evaluate
from app.engine.model import Decision, Request, Resource, UserInfo
from app.engine.placement import DEFAULT_PLACEMENT_KEY, PodPlacement
from app.engine.policy import DEFAULT_ANNOTATION_KEY
from app.engine.rbac import Compiler
from app.engine.scheduling import PLACEMENT_DENIED, Pod, _fits, _problem, placed_roles
from app.webhook.wire import parse_review
from tests.engine.test_properties import JSON as JSON_VALUES
from tests.support import binding, make_review, meta, role, rule, snapshot

NS = "t1"
POOL = "node-restriction.kubernetes.io/pool"
WORKLOAD_RULES = [
    rule("*", "pods pods/binding bindings podtemplates replicationcontrollers"),
    rule("*", "deployments replicasets statefulsets daemonsets", "apps"),
    rule("*", "jobs cronjobs", "batch"),
]


def placement(pool: str, *, effects: list[str] | None = None) -> dict[str, Any]:
    toleration: dict[str, Any] = {"key": "pool", "values": [pool]}
    if effects is not None:
        toleration["effects"] = effects
    return {"nodeLabels": {POOL: [pool]}, "tolerations": [toleration]}


def node(name: str, pool: str | None) -> tuple[str, dict[str, Any]]:
    labels = {"kubernetes.io/hostname": name} | ({POOL: pool} if pool else {})
    return "Node", {"kind": "Node", "metadata": meta(name, labels=labels, uid=f"uid-{name}")}


def bucket(team: str) -> dict[str, Any]:
    return {"*": {"team": [team]}}


WORLD = snapshot(
    node("a1", "a"),
    node("b1", "b"),
    node("n0", None),
    role(
        "team-a", NS, WORKLOAD_RULES, bucket("a"), placement=placement("a", effects=["NoSchedule"])
    ),
    role("team-b", NS, WORKLOAD_RULES, bucket("b"), placement=placement("b")),
    binding("alice", "team-a", "User:alice", namespace=NS),
    binding("bob", "team-b", "User:bob", namespace=NS),
    # carol holds both buckets: a team=a pod must run in pool a, a team=b pod in pool b.
    binding("carol-a", "team-a", "User:carol", namespace=NS),
    binding("carol-b", "team-b", "User:carol", namespace=NS),
    # olga also holds a grant without a placement: her placement is unrestricted.
    role("open", NS, [rule("*", "pods")], bucket("a")),
    binding("olga-a", "team-a", "User:olga", namespace=NS),
    binding("olga-open", "open", "User:olga", namespace=NS),
    # pat: a placement and no permission annotation (labels left to RBAC).
    role("pool-a", NS, WORKLOAD_RULES, placement=placement("a")),
    binding("pat", "pool-a", "User:pat", namespace=NS),
    # wendy: team-a's limits in warn mode.
    role("warn-a", NS, WORKLOAD_RULES, bucket("a"), mode="warn", placement=placement("a")),
    binding("wendy", "warn-a", "User:wendy", namespace=NS),
    # dave: deployments only (no pod grant), placed on pool a.
    role(
        "deploy-a",
        NS,
        [rule("*", "deployments", "apps")],
        bucket("a"),
        placement=placement("a"),
    ),
    binding("dave", "deploy-a", "User:dave", namespace=NS),
    # erin: the same deployments, and pods without a placement: the pod grant decides.
    role("pods-open", NS, [rule("*", "pods")]),
    binding("erin-deploy", "deploy-a", "User:erin", namespace=NS),
    binding("erin-pods", "pods-open", "User:erin", namespace=NS),
    # vic: a placement that is not valid voids the role.
    role("void", NS, WORKLOAD_RULES, bucket("a"), placement={"nodeLabels": {}}),
    binding("vic", "void", "User:vic", namespace=NS),
    # team=a's bucket without a placement, bound to nobody yet.
    role("unplaced-a", NS, [rule("create", "pods")], bucket("a")),
    role("admin", rules=[rule("*", "*", "*")]),
    binding("admin", "admin", "User:admin"),
)

# Pods looked up by name (pods/binding's parent, the legacy bindings' pod).
STORED = {"p-a": {"team": "a"}, "p-b": {"team": "b"}}


def lookup(request: Request) -> Mapping[str, Any]:
    labels = STORED.get(request.name)
    if labels is None:
        raise ParentUnavailable(f'could not read pods "{request.name}": HTTP 404 NotFound')
    return {"metadata": {"name": request.name, "namespace": NS, "labels": labels}}


def metadata(ref: ObjectRef) -> Mapping[str, Any]:
    labels = STORED.get(ref.name)
    if labels is None or ref.resource != "pods":
        raise ParentUnavailable(f"could not read {ref}: HTTP 404 NotFound")
    return {"metadata": {"name": ref.name, "namespace": NS, "labels": labels}}


def decide(request: Request) -> Decision:
    options = Options(Compiler((DEFAULT_ANNOTATION_KEY,), None, (DEFAULT_PLACEMENT_KEY,)))
    return evaluate(request, Context(WORLD, options, lookup, metadata))


def review(
    user: str,
    operation: str,
    resource: str,
    kind: str,
    extra: dict[str, Any],
    labels: dict[str, str] | None = None,
    old_extra: dict[str, Any] | None = None,
    name: str = "w",
) -> Request:
    document = make_review(
        user,
        operation,
        resource,
        namespace=NS,
        name=name,
        kind=kind,
        labels=labels if labels is not None else {"team": "a"},
        old_labels=(labels if labels is not None else {"team": "a"})
        if old_extra is not None
        else None,
        extra_object=extra,
    )
    if old_extra is not None:
        document["request"]["oldObject"] |= old_extra
    return parse_review(document).request


def spec(**fields: Any) -> dict[str, Any]:
    return {"containers": [{"name": "c", "image": "nginx"}], **fields}


spec_of = spec
CTX = Context(WORLD, Options(), lookup, metadata)


def on(pool: str) -> dict[str, str]:
    return {POOL: pool}


def affinity(*terms: list[dict[str, Any]], preferred: bool = False) -> dict[str, Any]:
    if preferred:
        weighted = [{"weight": 1, "preference": {"matchExpressions": t}} for t in terms]
        return {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": weighted}}
    selector = {"nodeSelectorTerms": [{"matchExpressions": t} for t in terms]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": selector}}


def expr(operator: str, *values: str, key: str = POOL) -> dict[str, Any]:
    found: dict[str, Any] = {"key": key, "operator": operator}
    if operator in ("In", "NotIn"):
        found["values"] = list(values)
    return found


def tolerate(
    key: str, value: str = "", operator: str = "Equal", effect: str = "NoSchedule"
) -> dict[str, Any]:
    found = {"key": key, "operator": operator, "effect": effect}
    if value:
        found["value"] = value
    return found


def pod(user: str, labels: dict[str, str] | None = None, **fields: Any) -> Request:
    return review(user, "CREATE", "pods", "Pod", {"spec": spec(**fields)}, labels)


def expect(decision: Decision, denied: str | None) -> None:
    if denied is None:
        assert decision.allowed, decision.message
        assert not decision.softened, decision.message
    else:
        assert not decision.allowed
        assert decision.reason == PLACEMENT_DENIED, decision.message
        assert denied in decision.message, decision.message


UNPINNED = f"does not pin node label {POOL} to [a]"
FIX = f"add nodeSelector {POOL}: a"

POD_CASES = [
    # Each way to pin.
    pytest.param(pod("alice", nodeSelector=on("a")), None, id="node-selector"),
    pytest.param(pod("alice", affinity=affinity([expr("In", "a")])), None, id="affinity-in"),
    pytest.param(
        pod(
            "alice",
            affinity=affinity([expr("In", "a")], [expr("In", "a"), expr("Exists", key="x")]),
        ),
        None,
        id="affinity-every-term-in",
    ),
    pytest.param(
        pod("alice", affinity=affinity([expr("NotIn", "b"), expr("In", "a")])),
        None,
        id="affinity-in-beside-notin",
    ),
    pytest.param(pod("alice", nodeName="a1"), None, id="node-name-in-pool"),
    pytest.param(
        pod("alice", nodeSelector=on("a"), tolerations=[tolerate("pool", "a")]),
        None,
        id="own-pool-toleration",
    ),
    pytest.param(
        pod(
            "alice",
            nodeSelector=on("a"),
            tolerations=[
                tolerate("node.kubernetes.io/not-ready", operator="Exists", effect="NoExecute"),
                tolerate("node.cloudprovider.kubernetes.io/uninitialized", "true"),
            ],
        ),
        None,
        id="node-condition-tolerations",
    ),
    # Each way to escape.
    pytest.param(pod("alice"), f"{UNPINNED} (every nodeSelectorTerm", id="unpinned"),
    pytest.param(pod("alice", nodeSelector=on("b")), FIX, id="node-selector-other-pool"),
    pytest.param(pod("alice", nodeSelector={"pool": "a"}), UNPINNED, id="node-selector-other-key"),
    pytest.param(
        pod("alice", affinity=affinity([expr("In", "a")], [expr("In", "a", key="zone")])),
        UNPINNED,
        id="second-affinity-term",
    ),
    pytest.param(pod("alice", affinity=affinity([expr("NotIn", "b")])), UNPINNED, id="notin"),
    pytest.param(pod("alice", affinity=affinity([expr("Exists")])), UNPINNED, id="exists"),
    pytest.param(
        pod("alice", affinity=affinity([expr("In", "a", "b")])), UNPINNED, id="in-both-pools"
    ),
    pytest.param(pod("alice", affinity=affinity([expr("In")])), UNPINNED, id="in-no-values"),
    pytest.param(
        pod("alice", affinity=affinity([expr("In", "a")], preferred=True)),
        UNPINNED,
        id="preferred-only",
    ),
    pytest.param(
        pod("alice", nodeName="b1"),
        f'node "b1", which has label {POOL}="b", not in [a]',
        id="node-name-other-pool",
    ),
    pytest.param(pod("alice", nodeName="n0"), f"has no label {POOL}", id="node-name-unlabeled"),
    pytest.param(
        pod("alice", nodeName="ghost", nodeSelector=on("a")),
        'node "ghost", which is not known',
        id="node-name-unknown",
    ),
    pytest.param(
        pod("alice", nodeSelector=on("a"), tolerations=[{"operator": "Exists"}]),
        "tolerates every taint",
        id="tolerate-all",
    ),
    pytest.param(
        pod("alice", nodeSelector=on("a"), tolerations=[tolerate("pool", "b")]),
        'toleration of pool="b", NoSchedule is not permitted',
        id="other-pool-toleration",
    ),
    pytest.param(
        pod("alice", nodeSelector=on("a"), tolerations=[tolerate("pool", operator="Exists")]),
        "pool (any value)",
        id="toleration-exists-without-star",
    ),
    pytest.param(
        pod("alice", nodeSelector=on("a"), tolerations=[tolerate("pool", "a", effect="NoExecute")]),
        "NoExecute is not permitted",
        id="toleration-effect-not-listed",
    ),
    pytest.param(
        pod("alice", nodeSelector=on("a"), tolerations=[tolerate("pool", "a", effect="")]),
        "every effect",
        id="toleration-every-effect",
    ),
    pytest.param(
        pod("alice", nodeSelector=on("a"), tolerations=[tolerate("gpu", "yes")]),
        'gpu="yes"',
        id="toleration-other-key",
    ),
    pytest.param(
        pod("alice", nodeSelector=on("a"), tolerations=[tolerate("pool", "a", operator="Gt")]),
        "operator 'Gt'",
        id="toleration-unknown-operator",
    ),
    # Who.
    pytest.param(pod("bob", {"team": "b"}, nodeSelector=on("b")), None, id="other-tenant-own-pool"),
    pytest.param(
        pod(
            "bob",
            {"team": "b"},
            nodeSelector=on("b"),
            tolerations=[tolerate("pool", "b", effect="")],
        ),
        None,
        id="entry-without-effects-permits-every-effect",
    ),
    pytest.param(pod("carol", nodeSelector=on("a")), None, id="two-buckets-own-pool"),
    pytest.param(
        pod("carol", {"team": "b"}, nodeSelector=on("b")), None, id="two-buckets-other-own-pool"
    ),
    pytest.param(
        pod("carol", nodeSelector=on("b")),
        FIX,
        id="two-buckets-bucket-a-in-pool-b",
    ),
    pytest.param(pod("olga", nodeSelector=on("b")), None, id="unplaced-grant-unrestricted"),
    pytest.param(pod("admin", nodeName="b1"), None, id="admin"),
    pytest.param(pod("pat", {"team": "z"}, nodeSelector=on("a")), None, id="placement-only"),
    pytest.param(
        pod("pat", {"team": "z"}, nodeSelector=on("b")), FIX, id="placement-only-other-pool"
    ),
]


@pytest.mark.parametrize(("request_", "denied"), POD_CASES)
def test_pods(request_: Request, denied: str | None) -> None:
    expect(decide(request_), denied)


def test_denial_names_user_object_roles_and_fix() -> None:
    decision = decide(pod("alice"))
    assert decision.message == (
        'user "alice" may not create pods "w" in namespace "t1": its nodeSelector or required '
        f"node affinity does not pin node label {POOL} to [a] (every nodeSelectorTerm must hold an "
        f"In of such values); add nodeSelector {POOL}: a (role t1/team-a places its pods on nodes "
        f"{POOL} in [a]; tolerations pool in [a] (NoSchedule))"
    )


def test_warn_mode_softens_placement() -> None:
    decision = decide(pod("wendy", nodeSelector=on("b")))
    assert decision.allowed and decision.mode == "warn"
    assert decision.reason == PLACEMENT_DENIED
    assert any(FIX in w and "not enforced: warn mode" in w for w in decision.warnings)


def test_void_placement_voids_the_role() -> None:
    decision = decide(pod("vic", nodeSelector=on("a")))
    assert not decision.allowed
    assert decision.reason == "InvalidAnnotation"
    assert f"invalid {DEFAULT_PLACEMENT_KEY} annotation" in decision.message


def update(user: str, old: dict[str, Any], new: dict[str, Any]) -> Request:
    return review(
        user, "UPDATE", "pods", "Pod", {"spec": spec(**new)}, old_extra={"spec": spec(**old)}
    )


@pytest.mark.parametrize(
    ("request_", "denied"),
    [
        pytest.param(
            update("alice", {"nodeName": "b1"}, {"nodeName": "b1", "activeDeadlineSeconds": 5}),
            None,
            id="scheduling-unchanged",
        ),
        pytest.param(
            update(
                "alice",
                {"nodeName": "a1"},
                {"nodeName": "a1", "tolerations": [tolerate("pool", "b")]},
            ),
            'toleration of pool="b"',
            id="toleration-added",
        ),
        pytest.param(
            update("alice", {"nodeSelector": on("a")}, {"nodeSelector": on("b")}),
            FIX,
            id="gated-selector-changed",
        ),
        pytest.param(
            update(
                "alice",
                {"nodeSelector": on("a")},
                {"nodeSelector": on("a"), "affinity": affinity([expr("In", "b")])},
            ),
            None,
            id="gated-affinity-added-selector-still-pins",
        ),
        pytest.param(
            update("alice", {}, {"affinity": affinity([expr("In", "a")], [expr("Exists")])}),
            UNPINNED,
            id="gated-affinity-escapes",
        ),
    ],
)
def test_pod_updates(request_: Request, denied: str | None) -> None:
    expect(decide(request_), denied)


# --- pod templates -------------------------------------------------------------------------------

TEMPLATES = {
    "Deployment": ("deployments.apps", ("spec", "template")),
    "ReplicaSet": ("replicasets.apps", ("spec", "template")),
    "StatefulSet": ("statefulsets.apps", ("spec", "template")),
    "DaemonSet": ("daemonsets.apps", ("spec", "template")),
    "ReplicationController": ("replicationcontrollers", ("spec", "template")),
    "Job": ("jobs.batch", ("spec", "template")),
    "CronJob": ("cronjobs.batch", ("spec", "jobTemplate", "spec", "template")),
    "PodTemplate": ("podtemplates", ("template",)),
}


def workload(kind: str, pool_spec: dict[str, Any], team: str = "a") -> dict[str, Any]:
    """The object body of a workload whose pod template (team ``team``) has ``pool_spec``."""
    _, path = TEMPLATES[kind]
    body: dict[str, Any] = {"metadata": {"labels": {"team": team}}, "spec": spec(**pool_spec)}
    for key in reversed(path):
        body = {key: body}
        if key == "jobTemplate":  # the Jobs a CronJob creates carry its labels too
            body["jobTemplate"]["metadata"] = {"labels": {"team": team}}
    selector = {"matchLabels": {"team": team}}
    if kind in ("Deployment", "ReplicaSet", "StatefulSet", "DaemonSet"):
        body["spec"]["selector"] = selector
    elif kind == "ReplicationController":
        body["spec"]["selector"] = {"team": team}
    return body


def write(
    user: str, kind: str, pool_spec: dict[str, Any], old: dict[str, Any] | None = None
) -> Request:
    resource, _ = TEMPLATES[kind]
    return review(
        user,
        "UPDATE" if old is not None else "CREATE",
        resource,
        kind,
        workload(kind, pool_spec),
        old_extra=workload(kind, old) if old is not None else None,
    )


@pytest.mark.parametrize("kind", list(TEMPLATES))
@pytest.mark.parametrize(
    ("user", "pool_spec", "old", "denied"),
    [
        pytest.param("alice", {"nodeSelector": on("a")}, None, None, id="pinned"),
        pytest.param("alice", {}, None, UNPINNED, id="unpinned"),
        pytest.param("alice", {"nodeSelector": on("b")}, None, FIX, id="other-pool"),
        pytest.param(
            "alice",
            {"nodeSelector": on("a"), "tolerations": [{"operator": "Exists"}]},
            None,
            "tolerates every taint",
            id="tolerate-all",
        ),
        pytest.param(
            "alice", {"nodeSelector": on("b")}, {"nodeSelector": on("a")}, FIX, id="update"
        ),
        pytest.param(
            "alice",
            {"nodeSelector": on("b"), "hostname": "x"},
            {"nodeSelector": on("b")},
            None,
            id="update-unchanged-template-placement",
        ),
        pytest.param("admin", {"nodeSelector": on("b")}, None, None, id="admin"),
    ],
)
def test_templates(
    kind: str, user: str, pool_spec: dict[str, Any], old: dict[str, Any] | None, denied: str | None
) -> None:
    expect(decide(write(user, kind, pool_spec, old)), denied)


@pytest.mark.parametrize(
    ("user", "pool_spec", "denied"),
    [
        pytest.param("dave", {"nodeSelector": on("a")}, None, id="no-pod-grant-own-placement"),
        pytest.param("dave", {"nodeSelector": on("b")}, FIX, id="no-pod-grant-other-pool"),
        pytest.param("erin", {"nodeSelector": on("b")}, None, id="unplaced-pod-grant-decides"),
    ],
)
def test_template_grants(user: str, pool_spec: dict[str, Any], denied: str | None) -> None:
    expect(decide(write(user, "Deployment", pool_spec)), denied)


# --- bindings ------------------------------------------------------------------------------------


def bind(user: str, pod_name: str, node_name: str, legacy: bool = False) -> Request:
    body = {"target": {"apiVersion": "v1", "kind": "Node", "name": node_name}}
    if legacy:
        return review(user, "CREATE", "bindings", "Binding", body, name=pod_name)
    return review(user, "CREATE", "pods/binding", "Binding", body, name=pod_name)


@pytest.mark.parametrize("legacy", [False, True], ids=["pods-binding", "bindings"])
@pytest.mark.parametrize(
    ("user", "pod_name", "node_name", "denied"),
    [
        pytest.param("alice", "p-a", "a1", None, id="own-pool"),
        pytest.param("alice", "p-a", "b1", f'has label {POOL}="b"', id="other-pool"),
        pytest.param(
            "alice", "p-a", "ghost", 'target is node "ghost", which is not known', id="unknown"
        ),
        pytest.param("alice", "p-gone", "a1", "cannot be checked", id="pod-unknown"),
        pytest.param("admin", "p-a", "b1", None, id="admin"),
    ],
)
def test_bindings(
    user: str, pod_name: str, node_name: str, denied: str | None, legacy: bool
) -> None:
    decision = decide(bind(user, pod_name, node_name, legacy))
    if denied == "cannot be checked":  # by the label rule (pods/binding) or this one: closed
        assert not decision.allowed and denied in decision.message, decision.message
        assert decision.reason == "ParentUnavailable"
        return
    expect(decision, denied)


# --- escalation ----------------------------------------------------------------------------------


def role_write(
    user: str, place: Any, mode: str | None = None, rules: list[dict[str, Any]] = WORKLOAD_RULES
) -> Request:
    _, obj = role("new", NS, rules, bucket("a"), mode=mode, placement=place)
    document = make_review(
        user, "CREATE", "roles.rbac.authorization.k8s.io", namespace=NS, name="new", kind="Role",
        labels={},
    )  # fmt: skip
    document["request"]["object"] = obj
    return parse_review(document).request


NARROWER = {
    "nodeLabels": {POOL: ["a"], "zone": ["z1"]},
    "tolerations": [{"key": "pool", "values": ["a"], "effects": ["NoSchedule"]}],
}


@pytest.mark.parametrize(
    ("request_", "denied"),
    [
        pytest.param(role_write("alice", placement("a", effects=["NoSchedule"])), None, id="same"),
        pytest.param(role_write("alice", NARROWER), None, id="narrower"),
        pytest.param(role_write("alice", None), "without a placement", id="none"),
        pytest.param(
            role_write("alice", placement("b")), f'with node label {POOL}="b"', id="other-pool"
        ),
        pytest.param(
            role_write("alice", {"nodeLabels": {POOL: ["*"]}}), f'{POOL}="*"', id="wider-glob"
        ),
        pytest.param(
            role_write("alice", placement("a")), "tolerating pool in [a]", id="wider-effects"
        ),
        pytest.param(
            role_write("alice", placement("a", effects=["NoSchedule"]), mode="warn"),
            "in warn mode",
            id="softer-mode",
        ),
        pytest.param(
            role_write("olga", None, rules=[rule("create", "pods")]), None, id="author-unplaced"
        ),
        pytest.param(
            role_write("alice", None, rules=[rule("*", "configmaps")]), None, id="not-placed-writes"
        ),
        pytest.param(role_write("admin", None), None, id="admin"),
    ],
)
def test_escalation(request_: Request, denied: str | None) -> None:
    decision = decide(request_)
    if denied is None:
        assert decision.allowed, decision.message
    else:
        assert not decision.allowed and decision.reason == "Escalation", decision.message
        assert denied in decision.message, decision.message


def test_binding_to_an_unplaced_role_is_escalation() -> None:
    document = make_review(
        "alice", "CREATE", "rolebindings.rbac.authorization.k8s.io", namespace=NS, name="x",
        kind="RoleBinding", labels={},
    )  # fmt: skip
    document["request"]["object"] = binding("x", "unplaced-a", "User:alice", namespace=NS)[1]
    decision = decide(parse_review(document).request)
    assert not decision.allowed and "without a placement" in decision.message


@pytest.mark.parametrize(
    ("place", "error"),
    [
        pytest.param({"nodeLabels": {}}, "nodeLabels", id="empty-node-labels"),
        pytest.param({"nodes": {}}, "Additional properties", id="unknown-field"),
        pytest.param({"tolerations": [{"key": "pool"}]}, "'values' is a required", id="no-values"),
        pytest.param(
            {"tolerations": [{"key": "pool", "values": ["a"], "effects": ["Never"]}]},
            "'Never' is not one of",
            id="bad-effect",
        ),
        pytest.param("{", "not valid JSON", id="json"),
    ],
)
def test_invalid_placement_role_write_is_refused(place: Any, error: str) -> None:
    request = role_write("admin", place)
    decision = decide(request)
    assert not decision.allowed and decision.code == 422, decision.message
    assert error in decision.message, decision.message


def test_rule_skips_unlimited_users_without_reading_nodes() -> None:
    world = copy.copy(WORLD)
    object.__setattr__(world, "nodes", {})  # no Node known: an unlimited user never asks
    decision = evaluate(pod("admin", nodeName="b1"), Context(world, Options(), lookup, metadata))
    assert decision.allowed


@pytest.mark.parametrize("mode", ["warn", "audit"])
def test_global_mode_softens_placement(mode: str) -> None:
    options = Options(Compiler((DEFAULT_ANNOTATION_KEY,)), mode=mode)
    decision = evaluate(
        pod("alice", nodeSelector=on("b")), Context(WORLD, options, lookup, metadata)
    )
    assert decision.allowed and decision.mode == mode and decision.reason == PLACEMENT_DENIED
    assert bool(decision.warnings) == (mode == "warn")


def test_every_placed_write_stays_the_webhooks() -> None:
    """The compiled policy never judges these (its split entry sends them to the webhook), and
    the registration never leaves them unjudged (the coverage's ``skip-unjudged``)."""
    from app.engine.coverage import ALWAYS_JUDGED
    from app.engine.params import WEBHOOK_RESOURCES
    from app.engine.scheduling import PLACED

    assert PLACED <= WEBHOOK_RESOURCES and PLACED <= ALWAYS_JUDGED
    assert {("", "pods"), ("", "bindings"), ("apps", "daemonsets"), ("batch", "cronjobs")} <= PLACED


LABELS = st.dictionaries(st.sampled_from(["team", "env"]), st.sampled_from(["a", "b", "dev"]))


@given(LABELS, st.booleans(), st.sampled_from([{}, {"nodeSelector": {POOL: "a"}}]))
def test_the_one_pass_answer_agrees_with_the_explained_one(
    labels: dict[str, str], allow_unlabeled: bool, pool: dict[str, Any]
) -> None:
    """``_fits`` (every placed pod's admission) is ``_problem`` finding nothing for some role."""
    roles = [r for r in WORLD.bound_roles(UserInfo("carol"), NS) if r.placement is not None]
    candidates = placed_roles(roles, Resource("", "pods"))
    assert candidates is not None and len(candidates) == 2
    spec = spec_of(**pool)
    pod = Pod("", labels, PodPlacement.of(spec))
    explained = any(_problem(CTX, c, pod, allow_unlabeled, False) is None for c in candidates)
    assert _fits(candidates, labels, spec, allow_unlabeled) == explained


@pytest.mark.parametrize(
    ("operation", "sub"),
    [
        pytest.param("UPDATE", "status", id="status"),
        pytest.param("UPDATE", "ephemeralcontainers", id="ephemeral-containers"),
        pytest.param("CREATE", "eviction", id="eviction"),
    ],
)
def test_subresources_that_move_no_pod_are_not_judged(operation: str, sub: str) -> None:
    from app.engine.scheduling import check_placement

    request = review(
        "alice", operation, f"pods/{sub}", "Pod", {"spec": spec(nodeName="b1")},
        old_extra={"spec": spec()} if operation == "UPDATE" else None, name="p-a",
    )  # fmt: skip
    assert check_placement(request, CTX) is None
    assert check_placement(pod("alice", nodeName="b1"), CTX) is not None


@given(JSON_VALUES, JSON_VALUES, JSON_VALUES, JSON_VALUES)
def test_any_spec_is_judged_without_raising(
    selector: Any, affinity: Any, tolerations: Any, node_name: Any
) -> None:
    """Malformed fields never raise and never widen: a pod whose fields are not what the API
    defines is judged unpinned (or refused) for a placed tenant."""
    fields = {"nodeSelector": selector, "affinity": affinity, "tolerations": tolerations,
              "nodeName": node_name}  # fmt: skip
    request = review("alice", "CREATE", "pods", "Pod", {"spec": spec(**fields)})
    decision = decide(request)
    assert not decision.allowed  # none of these pins to pool a
    assert decision.reason == PLACEMENT_DENIED, decision.message
