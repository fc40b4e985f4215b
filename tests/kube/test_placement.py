"""Placement through a real API server (docs/placement.md): a bucket's pods only on its pool.

Two pools of Nodes, labelled ``node-restriction.kubernetes.io/pool`` a and b and tainted
``pool=<pool>:NoSchedule`` (no kubelet: admission judges the spec). alice's Role grants team=a and
places it on pool a; bob's the same for b; carol's team=a Role is in warn mode; dana's Role grants
team=a without a placement; admin is unrestricted. Writes go kubectl → kube-apiserver → the
shipped webhook registration → the webhook process; most are server-side dry runs, judged as
real ones.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from typing import Any

import pytest
import yaml

from tests.kube.cluster import LabelRbacCluster
from tests.kube.controlplane import ADMIN
from tests.kube.support import eventually, obj
from tests.support import ROOT

POOL = "node-restriction.kubernetes.io/pool"
PLACEMENT = "labelrbac.io/placement"
DENIED = 'admission webhook "labels.labelrbac.io" denied the request: '
RBAC = "rbac.authorization.k8s.io/v1"
RULES = [
    {"apiGroups": [""], "verbs": ["*"],
     "resources": ["pods", "pods/binding", "bindings", "podtemplates", "replicationcontrollers"]},
    {"apiGroups": ["apps"], "verbs": ["*"],
     "resources": ["deployments", "replicasets", "statefulsets", "daemonsets"]},
    {"apiGroups": ["batch"], "verbs": ["*"], "resources": ["jobs", "cronjobs"]},
    {"apiGroups": ["rbac.authorization.k8s.io"], "verbs": ["create"],
     "resources": ["roles", "rolebindings"]},
]  # fmt: skip
SUFFIX = secrets.token_hex(3)
NODE_A, NODE_B = f"pool-a-{SUFFIX}", f"pool-b-{SUFFIX}"


def placement(pool: str) -> str:
    return json.dumps(
        {"nodeLabels": {POOL: [pool]}, "tolerations": [{"key": "pool", "values": [pool]}]}
    )


def tenant_role(ns: str, name: str, user: str, team: str, **annotations: str) -> list[Any]:
    role = obj("Role", name, ns, {"team": team}, api_version=RBAC, rules=RULES)
    role["metadata"]["annotations"] = {
        "labelrbac.io/permissions": json.dumps({"*": {"team": [team]}}),
        **annotations,
    }
    subject = {"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": user}
    ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name}
    return [role, obj("RoleBinding", name, ns, api_version=RBAC, subjects=[subject], roleRef=ref)]


@pytest.fixture(scope="module")
def pools(kube: LabelRbacCluster) -> None:
    """One Node per pool, labelled and tainted as a pool's nodes are."""
    nodes = [
        {"apiVersion": "v1", "kind": "Node",
         "metadata": {"name": name, "labels": {POOL: pool}},
         "spec": {"taints": [{"key": "pool", "value": pool, "effect": "NoSchedule"}]}}
        for name, pool in ((NODE_A, "a"), (NODE_B, "b"))
    ]  # fmt: skip
    kube.apply(ADMIN, nodes)


@pytest.fixture
def tenants(kube: LabelRbacCluster, namespace: str, pools: None) -> str:
    kube.apply(
        ADMIN,
        [
            *tenant_role(namespace, "team-a", "alice", "a", **{PLACEMENT: placement("a")}),
            *tenant_role(namespace, "team-b", "bob", "b", **{PLACEMENT: placement("b")}),
            *tenant_role(
                namespace, "warn-a", "carol", "a",
                **{"labelrbac.io/placement": placement("a"), "labelrbac.io/mode": "warn"},
            ),
            *tenant_role(namespace, "unplaced-a", "dana", "a"),
        ],
    )  # fmt: skip

    def judged() -> None:  # the webhook knows the roles and the Nodes
        status, output = create(kube, "alice", pod(namespace, nodeName=NODE_B), "--dry-run=server")
        assert status != 0 and "not in [a]" in output, output
        status, output = create(kube, "alice", pod(namespace, nodeName=NODE_A), "--dry-run=server")
        assert status == 0, output

    eventually(judged, timeout=20)
    return namespace


def create(
    kube: LabelRbacCluster, user: str, document: dict[str, Any], *flags: str
) -> tuple[int, str]:
    done = kube.kubectl(user, "create", *flags, "-f", "-", input=yaml.safe_dump(document))
    return done.returncode, done.stdout + done.stderr


def spec(**fields: Any) -> dict[str, Any]:
    return {"containers": [{"name": "c", "image": "busybox"}], **fields}


def pod(ns: str, name: str = "p", team: str = "a", **fields: Any) -> dict[str, Any]:
    return obj("Pod", name, ns, {"team": team}, spec=spec(**fields))


def on(pool: str) -> dict[str, str]:
    return {POOL: pool}


def required(*terms: list[dict[str, Any]]) -> dict[str, Any]:
    selector = {"nodeSelectorTerms": [{"matchExpressions": t} for t in terms]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": selector}}


IN_A = {"key": POOL, "operator": "In", "values": ["a"]}
UNPINNED = f"does not pin node label {POOL} to [a]"
FIX = f"add nodeSelector {POOL}: a"


@pytest.mark.parametrize(
    ("user", "fields", "denied"),
    [
        pytest.param("alice", {"nodeSelector": on("a")}, None, id="node-selector"),
        pytest.param("alice", {"affinity": required([IN_A])}, None, id="affinity-in"),
        pytest.param(
            "alice",
            {
                "nodeSelector": on("a"),
                "tolerations": [{"key": "pool", "value": "a", "effect": "NoSchedule"}],
            },
            None,
            id="own-toleration",
        ),
        pytest.param("alice", {}, FIX, id="unpinned"),
        pytest.param("alice", {"nodeSelector": on("b")}, FIX, id="other-pool"),
        pytest.param(
            "alice",
            {
                "affinity": required(
                    [IN_A], [{"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}]
                )
            },
            UNPINNED,
            id="second-term",
        ),
        pytest.param(
            "alice",
            {"affinity": required([{"key": POOL, "operator": "NotIn", "values": ["b"]}])},
            UNPINNED,
            id="notin",
        ),
        pytest.param(
            "alice",
            {"affinity": required([{"key": POOL, "operator": "Exists"}])},
            UNPINNED,
            id="exists",
        ),
        pytest.param(
            "alice",
            {
                "affinity": {
                    "nodeAffinity": {
                        "preferredDuringSchedulingIgnoredDuringExecution": [
                            {"weight": 1, "preference": {"matchExpressions": [IN_A]}}
                        ]
                    }
                }
            },
            UNPINNED,
            id="preferred-only",
        ),
        pytest.param(
            "alice", {"nodeName": "no-such-node"}, "which is not known", id="unknown-node"
        ),
        pytest.param(
            "alice",
            {"nodeSelector": on("a"), "tolerations": [{"operator": "Exists"}]},
            "tolerates every taint",
            id="tolerate-all",
        ),
        pytest.param(
            "alice",
            {
                "nodeSelector": on("a"),
                "tolerations": [{"key": "pool", "value": "b", "effect": "NoSchedule"}],
            },
            'toleration of pool="b", NoSchedule is not permitted',
            id="other-pools-toleration",
        ),
        pytest.param("bob", {"nodeSelector": on("b")}, None, id="bob-own-pool"),
        pytest.param("dana", {}, None, id="no-placement-role"),
        pytest.param(ADMIN, {"nodeName": "no-such-node"}, None, id="admin"),
    ],
)
def test_pods(
    kube: LabelRbacCluster, tenants: str, user: str, fields: dict[str, Any], denied: str | None
) -> None:
    team = "b" if user == "bob" else "a"
    status, output = create(kube, user, pod(tenants, team=team, **fields), "--dry-run=server")
    if denied is None:
        assert status == 0, output
    else:
        assert status != 0, output
        assert DENIED in output and denied in output, output


def test_node_name_to_the_other_pool_names_the_node_and_the_fix(
    kube: LabelRbacCluster, tenants: str
) -> None:
    status, output = create(kube, "alice", pod(tenants, nodeName=NODE_B), "--dry-run=server")
    assert status != 0
    assert (
        f'{DENIED}user "alice" may not create pods "p" in namespace "{tenants}": it runs on node '
        f'"{NODE_B}", which has label {POOL}="b", not in [a]; name a node labeled {POOL} in [a], '
        f"or leave spec.nodeName to the scheduler (role {tenants}/team-a places its pods on nodes "
        f"{POOL} in [a]; tolerations pool in [a] (NoSchedule, PreferNoSchedule, NoExecute))"
    ) in output


def workload(kind: str, ns: str, pool_spec: dict[str, Any]) -> dict[str, Any]:
    """A ``kind`` of team=a whose pod template has ``pool_spec``, selecting its own pods."""
    labels = {"team": "a", "app": "w"}
    restart = {"restartPolicy": "Never"} if kind in ("Job", "CronJob") else {}
    template = {"metadata": {"labels": labels}, "spec": spec(**restart, **pool_spec)}
    apps = {"selector": {"matchLabels": labels}, "template": template}
    job = {"metadata": {"labels": labels}, "spec": {"template": template}}
    api_version, body = {
        "Deployment": ("apps/v1", {"spec": apps}),
        "ReplicaSet": ("apps/v1", {"spec": apps}),
        "StatefulSet": ("apps/v1", {"spec": {**apps, "serviceName": "w"}}),
        "DaemonSet": ("apps/v1", {"spec": apps}),
        "ReplicationController": ("v1", {"spec": {"selector": labels, "template": template}}),
        "Job": ("batch/v1", {"spec": {"template": template}}),
        "CronJob": ("batch/v1", {"spec": {"schedule": "* * * * *", "jobTemplate": job}}),
        "PodTemplate": ("v1", {"template": template}),
    }[kind]
    return obj(kind, "w", ns, labels, api_version=api_version, **body)


KINDS = ["Deployment", "ReplicaSet", "StatefulSet", "DaemonSet", "ReplicationController", "Job",
         "CronJob", "PodTemplate"]  # fmt: skip


@pytest.mark.parametrize("kind", KINDS)
def test_every_workload_kind(kube: LabelRbacCluster, tenants: str, kind: str) -> None:
    status, output = create(kube, "alice", workload(kind, tenants, {"nodeSelector": on("a")}),
                            "--dry-run=server")  # fmt: skip
    assert status == 0, output
    status, output = create(kube, "alice", workload(kind, tenants, {"nodeSelector": on("b")}),
                            "--dry-run=server")  # fmt: skip
    assert status != 0 and DENIED in output, output
    assert "its pod template" in output and FIX in output, output


def test_updates_json_and_merge_patch_and_server_side_apply(
    kube: LabelRbacCluster, tenants: str
) -> None:
    # A pod bound to pool a at creation, then a toleration added (the one update a running pod
    # takes): another pool's is refused (JSON patch), its own pool's allowed (merge patch).
    status, output = create(kube, "alice", pod(tenants, "bound", nodeName=NODE_A))
    assert status == 0, output
    other = [{"op": "add", "path": "/spec/tolerations/-",
              "value": {"key": "pool", "value": "b", "effect": "NoSchedule"}}]  # fmt: skip
    done = kube.kubectl("alice", "-n", tenants, "patch", "pod", "bound", "--type=json",
                        "-p", json.dumps(other))  # fmt: skip
    assert done.returncode != 0 and 'toleration of pool="b"' in done.stderr, done.stderr
    own = {"spec": {"tolerations": [{"key": "pool", "value": "a", "effect": "NoSchedule"}]}}
    done = kube.kubectl("alice", "-n", tenants, "patch", "pod", "bound", "--type=merge",
                        "-p", json.dumps(own))  # fmt: skip
    assert done.returncode == 0, done.stderr

    # A Deployment written by server-side apply, then moved to pool b by apply and by patch.
    deployment = workload("Deployment", tenants, {"nodeSelector": on("a")})
    done = kube.kubectl("alice", "apply", "--server-side", "-f", "-",
                        input=yaml.safe_dump(deployment))  # fmt: skip
    assert done.returncode == 0, done.stderr
    moved = workload("Deployment", tenants, {"nodeSelector": on("b")})
    done = kube.kubectl("alice", "apply", "--server-side", "-f", "-", input=yaml.safe_dump(moved))
    assert done.returncode != 0 and FIX in done.stderr, done.stderr
    patch = {"spec": {"template": {"spec": {"nodeSelector": on("b")}}}}
    done = kube.kubectl("alice", "-n", tenants, "patch", "deployment", "w", "--type=merge",
                        "-p", json.dumps(patch))  # fmt: skip
    assert done.returncode != 0 and FIX in done.stderr, done.stderr
    where = f"/spec/template/spec/nodeSelector/{POOL.replace('/', '~1')}"
    json_patch = [{"op": "replace", "path": where, "value": "b"}]
    done = kube.kubectl("alice", "-n", tenants, "patch", "deployment", "w", "--type=json",
                        "-p", json.dumps(json_patch))  # fmt: skip
    assert done.returncode != 0 and FIX in done.stderr, done.stderr


@pytest.mark.parametrize("legacy", [False, True], ids=["pods-binding", "bindings"])
def test_binding_only_to_a_node_of_the_pool(
    kube: LabelRbacCluster, tenants: str, legacy: bool
) -> None:
    status, output = create(kube, "alice", pod(tenants, "pending", nodeSelector=on("a")))
    assert status == 0, output

    def bind(node: str) -> tuple[int, str]:
        body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "pending"},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}}  # fmt: skip
        if not legacy:
            path = f"/api/v1/namespaces/{tenants}/pods/pending/binding"
        else:
            path = f"/api/v1/namespaces/{tenants}/bindings"
            body["metadata"]["labels"] = {"team": "a"}
        done = kube.kubectl("alice", "create", "--raw", path, "-f", "-", input=json.dumps(body))
        return done.returncode, done.stdout + done.stderr

    status, output = bind(NODE_B)
    assert status != 0 and f'which has label {POOL}="b", not in [a]' in output, output
    status, output = bind("no-such-node")
    assert status != 0 and "which is not known" in output, output
    status, output = bind(NODE_A)
    assert status == 0, output


def test_warn_mode_lets_the_pod_through_with_the_warning(
    kube: LabelRbacCluster, tenants: str
) -> None:
    status, output = create(kube, "carol", pod(tenants), "--dry-run=server")
    assert status == 0, output
    assert 'Warning: user "carol" may not create pods' in output and FIX in output, output
    assert "(not enforced: warn mode)" in output


@pytest.mark.parametrize(
    ("place", "denied"),
    [
        pytest.param(None, "without a placement", id="none"),
        pytest.param(placement("b"), f'with node label {POOL}="b"', id="other-pool"),
        pytest.param(placement("a"), None, id="same"),
    ],
)
def test_escalation(
    kube: LabelRbacCluster, tenants: str, place: str | None, denied: str | None
) -> None:
    annotations = {} if place is None else {"labelrbac.io/placement": place}
    role, _ = tenant_role(tenants, "made-by-alice", "alice", "a", **annotations)
    role["rules"] = [{"apiGroups": [""], "verbs": ["create"], "resources": ["pods"]}]
    status, output = create(kube, "alice", role, "--dry-run=server")
    if denied is None:
        assert status == 0, output
    else:
        assert status != 0 and denied in output and "escalation check" in output, output


def test_binding_a_role_without_placement_is_escalation(
    kube: LabelRbacCluster, tenants: str
) -> None:
    _, binding = tenant_role(tenants, "unplaced-a", "alice", "a")
    binding["metadata"]["name"] = "alice-unplaced"
    binding["metadata"]["labels"] = {"team": "a"}
    status, output = create(kube, "alice", binding, "--dry-run=server")
    assert status != 0, output
    assert f"without a placement through role {tenants}/unplaced-a" in output, output
    _, own = tenant_role(tenants, "team-a", "alice", "a")
    own["metadata"] |= {"name": "alice-again", "labels": {"team": "a"}}
    status, output = create(kube, "alice", own, "--dry-run=server")
    assert status == 0, output


def test_invalid_placement_is_refused_with_the_schema_error(
    kube: LabelRbacCluster, tenants: str
) -> None:
    role, _ = tenant_role(
        tenants, "bad", "alice", "a", **{"labelrbac.io/placement": '{"nodeLabels": {}}'}
    )
    status, output = create(kube, ADMIN, role, "--dry-run=server")
    assert status != 0, output
    assert "invalid labelrbac.io/placement annotation: schema violation at nodeLabels" in output


def test_audit_finds_pods_bound_outside_their_pool(kube: LabelRbacCluster, tenants: str) -> None:
    # An admin (unrestricted) binds a team=b pod to pool a's node, and one to pool b's (team=a
    # is left out: dana's unplaced team=a role leaves its pods' placement unrestricted).
    stray = pod(tenants, "stray", team="b", nodeName=NODE_A)
    home = pod(tenants, "home", team="b", nodeName=NODE_B)
    kube.apply(ADMIN, [stray, home, pod(tenants, "pending", team="b", nodeSelector=on("b"))])
    kubeconfig = str(kube.control_plane.kubeconfig(ADMIN))
    audit = ["audit", "-n", tenants, "-o", "json", "--kubeconfig", kubeconfig]
    done = subprocess.run(
        [sys.executable, "-m", "app", *audit], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1, done.stderr
    (found,) = json.loads(done.stdout)["misplaced"]
    assert (found["name"], found["node"], found["labels"]) == ("stray", NODE_A, {"team": "b"})
    assert found["why"].startswith(f'node "{NODE_A}" is outside its pool (role {tenants}/team-b')
