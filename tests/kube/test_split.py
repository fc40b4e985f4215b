"""One decision, one place: with the compiled policies on, who judges which write.

The shipped overlay ``manifests/enforce-compiled`` is installed in a loopback kube-apiserver with
the webhook and a compiler. Namespace ``t1`` compiles and is labeled ``labelrbac.io/compiled``;
``t2`` holds too many bindings for ``--max-params-bytes``, so it is delegated and unlabeled. The
tests count the webhook's decisions, then stop the webhook (every entry of ``enforce`` fails
closed) and look at what tenants get: what the policy judges is still judged, what is left to
the webhook is refused as the webhook being unreachable, and a write judged by neither never
passes — not even when someone labels the delegated namespace compiled.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from app.compiled.admission_policy import COMPILER, subresource_policy
from app.engine.params import MARK, SOFTENED_MARK
from tests.kube.cluster import Compilers, LabelRbacCluster
from tests.kube.conftest import require_control_plane, wait_for
from tests.kube.controlplane import ADMIN, COMPILER_USER, DEFAULT_USERS
from tests.support import GHOST_OWNER, binding, role, rule

MAX_BYTES = 6000  # t1 (a few grants) fits; t2 (two hundred subjects) does not
CRUD = "create update patch delete deletecollection get"


def tenant_rbac(namespace: str, extra_users: int = 0) -> list[dict[str, Any]]:
    team_a = role(
        "team-a",
        namespace,
        [
            rule(CRUD, "configmaps secrets serviceaccounts"),
            rule(CRUD, "deployments deployments/scale", "apps"),
        ],
        {"configmaps": {"team": ["a"]}},
    )
    bound = binding("team-a", "team-a", "User:alice", namespace=namespace)
    crowd = [
        binding(f"member-{i:03d}", "team-a", f"User:member-with-a-long-name-{i:03d}",
                namespace=namespace)
        for i in range(extra_users)
    ]  # fmt: skip
    return [{"apiVersion": "rbac.authorization.k8s.io/v1", **obj} for _, obj in
            [team_a, bound, *crowd]]  # fmt: skip


@pytest.fixture(scope="module")
def kube_split(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabelRbacCluster]:
    require_control_plane()
    workdir = tmp_path_factory.mktemp("split")
    with LabelRbacCluster(
        workdir, users=(*DEFAULT_USERS, COMPILER_USER), overlay="enforce-compiled"
    ) as kube:
        cp = kube.control_plane
        for namespace in ("t1", "t2"):
            cp.request(ADMIN, "POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
        cp.apply(ADMIN, tenant_rbac("t1") + tenant_rbac("t2", extra_users=200))
        compilers = Compilers(cp, workdir)
        compilers.start("compiler", "--max-params-bytes", str(MAX_BYTES))
        try:
            wait_for(lambda: marked("t1", kube) and compiled("t2", kube) == "False", "compiled")
            yield kube
        finally:
            compilers.stop_all()


def marked(namespace: str, kube: LabelRbacCluster) -> bool:
    _, ns = kube.control_plane.request(ADMIN, "GET", f"/api/v1/namespaces/{namespace}")
    return bool(ns["metadata"].get("labels", {}).get(MARK) == "true")


def compiled(namespace: str, kube: LabelRbacCluster) -> str:
    """The parameters' Compiled condition ("True", "False"), "" while there are none."""
    status, params = kube.control_plane.request(
        ADMIN,
        "GET",
        f"/apis/labelrbac.io/v1alpha1/namespaces/{namespace}/labelrbacparams/label-rbac",
    )
    conditions = params.get("status", {}).get("conditions", []) if status == 200 else []
    return str(conditions[0]["status"]) if conditions else ""


def write(kube: LabelRbacCluster, namespace: str, what: str, team: str = "a") -> str:
    """A dry-run write by alice: "" when allowed, else the API server's message."""
    labels = {"team": team}
    paths = {
        "configmap": ("POST", "/api/v1/namespaces/{ns}/configmaps",
                      {"metadata": {"name": "c", "labels": labels}}),
        "secret": ("POST", "/api/v1/namespaces/{ns}/secrets", {"metadata": {"name": "s"}}),
        "deployment": ("POST", "/apis/apps/v1/namespaces/{ns}/deployments", DEPLOYMENT),
    }  # fmt: skip
    method, path, body = paths[what]
    status, answer = kube.control_plane.request(
        "alice", method, path.format(ns=namespace) + "?dryRun=All", body
    )
    return "" if status < 300 else str(answer.get("message", answer))


DEPLOYMENT = {
    "metadata": {"name": "d", "labels": {"team": "a"}},
    "spec": {
        "selector": {"matchLabels": {"app": "d"}},
        "template": {
            "metadata": {"labels": {"app": "d", "team": "a"}},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]},
        },
    },
}


def decisions(kube: LabelRbacCluster, resource: str) -> float:
    """How many AdmissionReviews of ``resource`` the webhook has decided."""
    assert kube.webhook is not None
    _, text = kube.webhook.request("GET", "/metrics")
    pattern = rf'^label_rbac_decisions_total\{{[^}}]*resource="{resource}"[^}}]*\}} (\S+)$'
    return sum(float(v) for v in re.findall(pattern, str(text), re.MULTILINE))


LABEL_DENIAL = 'label team="b" is not permitted (role {ns}/team-a allows team in [a])'
UNREACHABLE = 'failed calling webhook "{entry}"'


def test_in_a_compiled_namespace_the_webhook_decides_only_what_the_policy_leaves(
    kube_split: LabelRbacCluster,
) -> None:
    kube = kube_split
    configmaps, deployments = decisions(kube, "configmaps"), decisions(kube, "deployments.apps")
    assert write(kube, "t1", "configmap") == ""
    assert LABEL_DENIAL.format(ns="t1") in write(kube, "t1", "configmap", team="b")
    assert write(kube, "t1", "deployment") == ""
    assert decisions(kube, "configmaps") == configmaps  # the policy's alone
    assert decisions(kube, "deployments.apps") == deployments + 1  # a template: the webhook's
    # In the delegated namespace the webhook judges every write, as without the policies.
    assert LABEL_DENIAL.format(ns="t2") in write(kube, "t2", "configmap", team="b")
    assert decisions(kube, "configmaps") == configmaps + 1


def test_in_a_compiled_namespace_relabelling_an_account_is_judged_as_lending_it(
    kube_split: LabelRbacCluster,
) -> None:
    """alice writes ServiceAccounts without label limits (her annotation names configmaps only)
    but lends only team=a: the webhook, not the policy, judges the labels that decide loans."""
    kube = kube_split
    meta = {"name": "robot-b", "namespace": "t1", "labels": {"team": "b"}}
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta}
    kube.control_plane.apply(ADMIN, [account])
    accounts = decisions(kube, "serviceaccounts")
    status, answer = kube.control_plane.request(
        "alice",
        "PATCH",
        "/api/v1/namespaces/t1/serviceaccounts/robot-b",
        {"metadata": {"labels": {"team": "a"}}},
        content_type="application/merge-patch+json",
    )
    assert status == 403, answer
    assert answer["message"] == (
        'admission webhook "labels-compiled.labelrbac.io" denied the request: user "alice" may '
        'not update serviceaccounts "robot-b" in namespace "t1": the account as stored has label '
        'team="b": relabelling a ServiceAccount is judged as lending it, and the user may lend '
        "only ServiceAccounts labeled team in [a] (role t1/team-a)"
    )
    assert decisions(kube, "serviceaccounts") == accounts + 1


def test_in_a_compiled_namespace_giving_an_account_an_owner_is_judged_as_deleting_it(
    kube_split: LabelRbacCluster,
) -> None:
    """An owner that does not exist would have the garbage collector delete robot-b for alice,
    who may not delete it: the webhook judges ServiceAccounts there too. Her own takes one."""
    kube = kube_split
    accounts = [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": f"robot-{team}", "namespace": "t1", "labels": {"team": team}}}
        for team in ("a", "b")
    ]  # fmt: skip
    kube.control_plane.apply(ADMIN, accounts)
    patch = {"metadata": {"ownerReferences": [GHOST_OWNER]}}
    answers = {
        team: kube.control_plane.request(
            "alice",
            "PATCH",
            f"/api/v1/namespaces/t1/serviceaccounts/robot-{team}?dryRun=All",
            patch,
            content_type="application/merge-patch+json",
        )
        for team in ("a", "b")
    }
    assert answers["a"][0] == 200, answers["a"]
    status, answer = answers["b"]
    assert status == 403, answer
    assert answer["message"].startswith(
        'admission webhook "labels-compiled.labelrbac.io" denied the request: user "alice" may '
        'not update serviceaccounts "robot-b" in namespace "t1": it changes '
        'metadata.ownerReferences (adds ConfigMap "ghost"'
    ), answer
    assert 'may not delete serviceaccounts "robot-b"' in answer["message"], answer


def delegated_by(
    kube: LabelRbacCluster, namespace: str, found: tuple[str, dict[str, Any]]
) -> dict[str, Any]:
    """A new ``namespace`` with the role ``found`` bound to alice, once the compiler has written
    its parameters delegated: their Compiled condition."""
    cp = kube.control_plane
    cp.request(ADMIN, "POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
    name = found[1]["metadata"]["name"]
    bound = binding(name, name, "User:alice", namespace=namespace)
    cp.apply(
        ADMIN, [{"apiVersion": "rbac.authorization.k8s.io/v1", **o} for _, o in (found, bound)]
    )
    wait_for(lambda: compiled(namespace, kube) == "False", f"{namespace} delegated")
    _, params = cp.request(
        ADMIN,
        "GET",
        f"/apis/labelrbac.io/v1alpha1/namespaces/{namespace}/labelrbacparams/label-rbac",
    )
    condition: dict[str, Any] = params["status"]["conditions"][0]
    return condition


def test_a_namespace_whose_roles_restrict_subresources_more_is_left_to_the_webhook(
    kube_split: LabelRbacCluster,
) -> None:
    """A change of labels is judged by the object's subresource entries too, which the policy
    does not do: the compiler delegates the namespace, and the webhook judges its writes."""
    kube, cp = kube_split, kube_split.control_plane
    narrow = role(
        "narrow",
        "t3",
        [rule(CRUD, "configmaps configmaps/proxy")],
        {"configmaps": {"team": ["a", "b"]}, "configmaps/proxy": {"team": ["a"]}},
    )
    condition = delegated_by(kube, "t3", narrow)
    assert condition["reason"] == "SubresourceEntries", condition
    assert "role t3/narrow restricts subresources of configmaps" in condition["message"]
    assert not marked("t3", kube)
    meta = {"name": "c", "namespace": "t3", "labels": {"team": "b"}}
    cp.apply(ADMIN, [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta}])
    # Once the webhook knows the Role (a dry run names it), alice's relabel is its to refuse.
    wait_for(lambda: "t3/narrow" in write(kube, "t3", "configmap", team="z"), "webhook knows t3")
    status, answer = cp.request(
        "alice",
        "PATCH",
        "/api/v1/namespaces/t3/configmaps/c",
        {"metadata": {"labels": {"team": "a"}}},
        content_type="application/merge-patch+json",
    )
    assert status == 403, answer
    assert answer["message"].startswith(
        'admission webhook "labels.labelrbac.io" denied the request: user "alice" may not update '
        'configmaps "c" in namespace "t3": the existing object\'s label team="b" is not '
        "permitted where its subresources are concerned"
    ), answer


def test_a_namespace_where_a_mode_softens_a_denial_is_left_to_the_webhook(
    kube_split: LabelRbacCluster,
) -> None:
    """The shipped install has no warn or audit policy: the compiler delegates the namespace,
    and the webhook lets the write through with its own warning."""
    kube, cp = kube_split, kube_split.control_plane
    warned = role(
        "warned", "t4", [rule(CRUD, "configmaps")], {"configmaps": {"team": ["a"]}}, mode="warn"
    )
    condition = delegated_by(kube, "t4", warned)
    assert condition["reason"] == "Softened", condition
    assert not marked("t4", kube)
    configmaps = decisions(kube, "configmaps")
    body = {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "c", "namespace": "t4", "labels": {"team": "b"}}}  # fmt: skip
    wait_for(
        lambda: (
            "(not enforced: warn mode)"
            in cp.kubectl(
                "alice", "create", "--dry-run=server", "-f", "-", input=json.dumps(body)
            ).stderr
        ),
        "the webhook's warning",
    )
    done = cp.kubectl("alice", "create", "--dry-run=server", "-f", "-", input=json.dumps(body))
    assert done.returncode == 0, done.stderr
    assert (
        'label team="b" is not permitted (role t4/warned allows team in [a]) '
        "(not enforced: warn mode)" in done.stderr
    ), done.stderr
    assert decisions(kube, "configmaps") > configmaps  # the webhook's


@pytest.fixture()
def webhook_down(kube_split: LabelRbacCluster) -> Iterator[LabelRbacCluster]:
    kube = kube_split
    assert kube.webhook is not None
    kube.webhook.process.terminate()
    kube.webhook.process.wait(30)
    try:
        yield kube
    finally:
        kube.restart_webhook()


@pytest.mark.parametrize(
    ("namespace", "what", "team", "expected"),
    [
        pytest.param("t1", "configmap", "a", "", id="compiled-own-bucket"),
        pytest.param("t1", "configmap", "b", LABEL_DENIAL, id="compiled-other-bucket"),
        pytest.param("t1", "secret", "a", "", id="compiled-unrestricted"),
        pytest.param(
            "t1",
            "deployment",
            "a",
            UNREACHABLE.format(entry="labels-compiled.labelrbac.io"),
            id="compiled-template",
        ),
        pytest.param(
            "t2", "configmap", "a", UNREACHABLE.format(entry="labels.labelrbac.io"), id="delegated"
        ),
    ],
)
def test_with_the_webhook_down_the_policy_still_judges_what_it_decides(
    webhook_down: LabelRbacCluster, namespace: str, what: str, team: str, expected: str
) -> None:
    message = write(webhook_down, namespace, what, team)
    if expected:
        assert expected.format(ns=namespace) in message
    else:
        assert message == ""


def test_in_a_compiled_namespace_a_kubelet_meets_the_node_rules_and_the_label_rule(
    kube_split: LabelRbacCluster,
) -> None:
    """The policy leaves no user out, and the compiled entry sends the webhook the writes of
    claims, which a node rule decides too: a kubelet that RBAC lets write claims and configmaps
    (its group bound to a role restricting configmaps to team=a) may not write a claim, nor a
    configmap of another team, in a compiled namespace as anywhere."""
    cp = kube_split.control_plane
    kubelet = "system:node:node-1"
    writes = role(
        "node-writes",
        "t1",
        [rule("create", "persistentvolumeclaims configmaps")],
        {"configmaps": {"team": ["a"]}},
    )
    bound = binding("node-writes", "node-writes", "Group:system:nodes", namespace="t1")
    objects = [{"apiVersion": "rbac.authorization.k8s.io/v1", **obj} for _, obj in (writes, bound)]
    cp.apply(ADMIN, objects)

    def create(resource: str, body: dict[str, Any]) -> tuple[int, str]:
        path = f"/api/v1/namespaces/t1/{resource}?dryRun=All"
        status, answer = cp.request(kubelet, "POST", path, body)
        return status, str(answer.get("message", "")) if isinstance(answer, dict) else str(answer)

    def configmap(team: str) -> dict[str, Any]:
        return {"metadata": {"name": "n", "labels": {"team": team}}}

    try:
        wait_for(lambda: create("configmaps", configmap("a"))[0] == 201, "the kubelet compiled")
        assert marked("t1", kube_split)
        status, message = create("configmaps", configmap("b"))
        denial = 'label team="b" is not permitted (role t1/node-writes allows team in [a])'
        assert status == 403 and denial in message, message
        claim = {
            "metadata": {"name": "claim", "labels": {"team": "a"}},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}},
            },
        }
        status, message = create("persistentvolumeclaims", claim)
        assert status == 403 and "may only update PVC status" in message, message
    finally:
        for kind, name in (("rolebinding", "node-writes"), ("role", "node-writes")):
            cp.kubectl(ADMIN, "delete", kind, name, "-n", "t1", "--ignore-not-found")


def test_no_one_but_the_compiler_labels_a_namespace_compiled(
    webhook_down: LabelRbacCluster,
) -> None:
    """The policy stands aside where there are no parameters, so the mark must mean they
    exist: an administrator's label is refused, and the namespace stays the webhook's."""
    kube = webhook_down
    done = kube.kubectl(ADMIN, "label", "namespace", "t2", f"{MARK}=true")
    assert done.returncode != 0
    assert "ValidatingAdmissionPolicy 'label-rbac-mark-owner'" in done.stderr, done.stderr
    assert f"only the compiler ({COMPILER}) does" in done.stderr
    assert UNREACHABLE.format(entry="labels.labelrbac.io") in write(kube, "t2", "configmap")


def test_a_delegated_namespace_labeled_compiled_refuses_writes(
    webhook_down: LabelRbacCluster,
) -> None:
    """Between the compiler's two writes (the mark taken off, then the parameters written
    delegated), or with the mark guard set aside, the policy does not stand aside there."""
    kube = webhook_down
    cp = kube.control_plane
    binding_path = (
        "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings/"
        "label-rbac-mark-owner"
    )
    _, guard = cp.request(ADMIN, "GET", binding_path)
    cp.request(ADMIN, "DELETE", binding_path)
    wait_for(
        lambda: kube.kubectl(ADMIN, "label", "namespace", "t2", f"{MARK}=true").returncode == 0,
        "the mark guard set aside",
    )
    try:
        # The webhook no longer receives t2's plain writes, and the policy does not stand aside.
        for team in ("a", "b"):
            message = write(kube, "t2", "configmap", team)
            assert f'namespace "t2" is labeled {MARK}=true' in message
            assert "too large to compile" in message
        assert UNREACHABLE.format(entry="labels-compiled.labelrbac.io") in write(
            kube, "t2", "deployment"
        )
    finally:
        kube.kubectl(ADMIN, "label", "namespace", "t2", f"{MARK}-")
        cp.apply(ADMIN, [{k: v for k, v in guard.items() if k != "metadata"}
                         | {"metadata": {"name": guard["metadata"]["name"]}}])  # fmt: skip


@pytest.mark.parametrize(
    ("labels", "allowed"),
    [
        pytest.param({MARK: None}, True, id="take-the-mark-off"),
        pytest.param({MARK: "true"}, True, id="put-it-back"),
        pytest.param({MARK: "false"}, False, id="another-value"),
        pytest.param({MARK: "true", SOFTENED_MARK: "true"}, True, id="softened"),
        pytest.param({SOFTENED_MARK: None}, True, id="no-longer-softened"),
        pytest.param({SOFTENED_MARK: "false"}, False, id="softened-another-value"),
        pytest.param(
            {"pod-security.kubernetes.io/enforce": "privileged"}, False, id="another-label"
        ),
    ],
)
def test_the_compiler_may_change_nothing_on_a_namespace_but_its_marks(
    kube_split: LabelRbacCluster, labels: dict[str, Any], allowed: bool
) -> None:
    status, answer = kube_split.control_plane.request(
        COMPILER,
        "PATCH",
        "/api/v1/namespaces/t1",
        {"metadata": {"labels": labels}},
        content_type="application/merge-patch+json",
    )
    if allowed:
        assert status == 200, answer
    else:
        assert status == 403 and "label-rbac-marks" in answer["message"], answer


def test_the_subresource_policys_refusal_as_the_api_server_renders_it(
    kube_split: LabelRbacCluster,
) -> None:
    """``label-rbac-subresources`` refuses what kube-apiserver v1.36 never serves on the
    resources it matches (an aggregated API's ``virtualmachines/start``, say), so its refusal is
    rendered here by a copy of it matching ``deployments/scale`` instead: the API server
    evaluates its message on a real subresource write in the compiled namespace, and in a
    namespace not marked compiled the copy matches nothing."""
    cp = kube_split.control_plane
    probe = copy.deepcopy(subresource_policy())
    for document in probe:
        document["metadata"]["name"] = "probe-subresources"
    probe[1]["spec"]["policyName"] = "probe-subresources"
    constraints = probe[0]["spec"]["matchConstraints"]
    constraints["resourceRules"] = [
        {"apiGroups": ["apps"], "apiVersions": ["*"], "operations": ["UPDATE"],
         "resources": ["deployments/scale"]}
    ]  # fmt: skip
    del constraints["excludeResourceRules"]
    scale = {"apiVersion": "autoscaling/v1", "kind": "Scale", "spec": {"replicas": 2}}
    for namespace in ("t1", "t2"):
        path = f"/apis/apps/v1/namespaces/{namespace}/deployments"
        status, answer = cp.request(ADMIN, "POST", path, {**DEPLOYMENT, "metadata": {"name": "s"}})
        assert status == 201, answer
    cp.apply(ADMIN, probe)

    def update(namespace: str) -> tuple[int, str]:
        path = f"/apis/apps/v1/namespaces/{namespace}/deployments/s/scale?dryRun=All"
        status, answer = cp.request(ADMIN, "PUT", path, {**scale, "metadata": {"name": "s"}})
        return status, str(answer.get("message", "")) if isinstance(answer, dict) else ""

    try:
        wait_for(lambda: update("t1")[0] == 403, "the probe policy in force")
        _, message = update("t1")
        assert (
            f'user "{ADMIN}" may not update deployments/scale.apps in namespace "t1": namespace '
            f'"t1" is labeled {MARK}=true, and label-rbac judges there no subresource but '
            "proxy, scale, status and those of the resources its webhook keeps (an "
            "administrator may exempt the namespace: labelrbac.io/exempt=true)"
        ) in message, message
        assert update("t2")[0] == 200  # delegated, not marked: not the policy's
    finally:
        cp.kubectl(ADMIN, "delete", "validatingadmissionpolicybinding,validatingadmissionpolicy",
                   "probe-subresources", "--ignore-not-found")  # fmt: skip
        for namespace in ("t1", "t2"):
            cp.kubectl(ADMIN, "delete", "deployment", "s", "-n", namespace, "--ignore-not-found")
