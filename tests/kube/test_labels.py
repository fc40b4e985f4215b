"""Label buckets through a real API server (README "The decision"): tenants writing with kubectl.

alice (Role team-a) and bob (Role team-b) share a namespace, as in manifests/examples. Each
write goes kubectl → kube-apiserver → the shipped ValidatingWebhookConfiguration → the webhook
process, and the denial a tenant sees is kubectl's stderr.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.kube.cluster import LabelRbacCluster
from tests.kube.controlplane import ADMIN
from tests.kube.support import eventually, install_tenants, obj


@pytest.fixture
def tenants(kube: LabelRbacCluster, namespace: str) -> str:
    install_tenants(kube, namespace)
    return namespace


def create(kube: LabelRbacCluster, user: str, document: dict[str, object]) -> tuple[int, str]:
    done = kube.kubectl(user, "create", "-f", "-", input=yaml.safe_dump(document))
    return done.returncode, done.stdout + done.stderr


def configmap(ns: str, name: str, **labels: str) -> dict[str, object]:
    return obj("ConfigMap", name, ns, labels, data={"k": "v"})


def deployment(ns: str, name: str, team: str) -> dict[str, object]:
    # The selector names the team: one that could adopt other buckets' pods is refused
    # (README "What a write makes controllers do").
    labels = {"app": name, "team": team}
    return obj(
        "Deployment",
        name,
        ns,
        labels,
        api_version="apps/v1",
        spec={
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]},
            },
        },
    )


@pytest.mark.parametrize(
    ("user", "labels", "allowed", "message"),
    [
        pytest.param("alice", {"team": "a"}, True, "configmap/c created", id="own-bucket"),
        pytest.param(
            "alice",
            {"team": "b"},
            False,
            'admission webhook "labels.labelrbac.io" denied the request: user "alice" may not '
            'create configmaps "c" in namespace "{ns}": label team="b" is not permitted '
            "(role {ns}/team-a allows team in [a])",
            id="other-bucket",
        ),
        pytest.param(
            "bob",
            {},
            False,
            "missing label team (role {ns}/team-b allows team in [b])",
            id="unlabeled",
        ),
        pytest.param(ADMIN, {"team": "z"}, True, "configmap/c created", id="admin-unrestricted"),
    ],
)
def test_create_is_judged_by_the_bucket(
    kube: LabelRbacCluster,
    tenants: str,
    user: str,
    labels: dict[str, str],
    allowed: bool,
    message: str,
) -> None:
    status, output = create(kube, user, configmap(tenants, "c", **labels))
    assert (status == 0) is allowed, output
    assert message.format(ns=tenants) in output


def test_relabel_out_of_the_bucket_is_denied_in_it_allowed(
    kube: LabelRbacCluster, tenants: str
) -> None:
    assert create(kube, "alice", configmap(tenants, "c", team="a"))[0] == 0
    ok = kube.kubectl("alice", "-n", tenants, "label", "configmap", "c", "tier=web")
    assert ok.returncode == 0, ok.stderr
    away = kube.kubectl("alice", "-n", tenants, "label", "configmap", "c", "team=b", "--overwrite")
    assert away.returncode != 0
    assert 'label team="b" is not permitted (role ' in away.stderr
    stored = kube.kubectl(ADMIN, "-n", tenants, "get", "configmap", "c", "-o", "yaml")
    assert yaml.safe_load(stored.stdout)["metadata"]["labels"] == {"team": "a", "tier": "web"}


def test_another_buckets_object_cannot_be_updated_or_deleted(
    kube: LabelRbacCluster, tenants: str
) -> None:
    assert create(kube, "bob", configmap(tenants, "theirs", team="b"))[0] == 0
    steal = kube.kubectl("alice", "-n", tenants, "label", "configmap", "theirs", "team=a",
                         "--overwrite")  # fmt: skip
    assert steal.returncode != 0
    assert 'label team="b" is not permitted' in steal.stderr
    delete = kube.kubectl("alice", "-n", tenants, "delete", "configmap", "theirs")
    assert delete.returncode != 0
    assert 'may not delete configmaps "theirs"' in delete.stderr
    own = kube.kubectl("bob", "-n", tenants, "delete", "configmap", "theirs")
    assert own.returncode == 0, own.stderr


def test_scale_is_judged_by_the_deployments_labels(kube: LabelRbacCluster, tenants: str) -> None:
    """deployments/scale carries no labels: the webhook reads the Deployment's."""
    for name, team in (("web-a", "a"), ("web-b", "b")):
        kube.apply(ADMIN, [deployment(tenants, name, team)])
    ok = kube.kubectl("alice", "-n", tenants, "scale", "deployment", "web-a", "--replicas", "3")
    assert ok.returncode == 0, ok.stderr
    denied = kube.kubectl("alice", "-n", tenants, "scale", "deployment", "web-b", "--replicas=3")
    assert denied.returncode != 0
    assert 'label team="b" is not permitted' in denied.stderr
    replicas = kube.kubectl(ADMIN, "-n", tenants, "get", "deployment", "web-b",
                            "-o", "jsonpath={.spec.replicas}")  # fmt: skip
    assert replicas.stdout == "1"


def test_exec_is_judged_by_the_pods_labels(kube: LabelRbacCluster, tenants: str) -> None:
    """``kubectl exec`` reads the pod first (the authorization webhook refuses another bucket's);
    the exec itself, a CONNECT without labels, is judged by the pod's (admission webhook).
    Admission runs before the API server looks for the pod's node: the pod in alice's bucket
    gets past the webhook, then has no node to run on here."""
    for name, team in (("p-a", "a"), ("p-b", "b")):
        pod = obj("Pod", name, tenants, {"team": team},
                  spec={"containers": [{"name": "c", "image": "busybox"}]})  # fmt: skip
        kube.apply(ADMIN, [pod])
    denied = kube.kubectl("alice", "-n", tenants, "exec", "p-b", "--", "true")
    assert denied.returncode != 0
    assert f'may not get pods "p-b" in namespace "{tenants}": the existing object\'s label ' \
        'team="b" is not permitted' in denied.stderr  # fmt: skip
    path = f"/api/v1/namespaces/{tenants}/pods/{{}}/exec?command=true&stdout=true"
    status, body = kube.control_plane.request("alice", "POST", path.format("p-b"))
    assert status == 403, body
    assert 'admission webhook "labels.labelrbac.io" denied the request' in body["message"]
    assert 'may not create pods/exec "p-b"' in body["message"]
    assert 'label team="b" is not permitted' in body["message"]
    status, body = kube.control_plane.request("alice", "POST", path.format("p-a"))
    assert status != 403, body
    assert "labelrbac" not in str(body)


def test_pods_run_only_as_service_accounts_the_role_lends(
    kube: LabelRbacCluster, tenants: str
) -> None:
    """A pod runs with its ServiceAccount's grants: alice's team-a Role grants her nothing on
    ServiceAccounts, yet lends her pods (and her Deployments' pods) only team=a accounts."""
    kube.apply(ADMIN, [obj("ServiceAccount", f"deployer-{team}", tenants, {"team": team})
                       for team in ("a", "b")])  # fmt: skip

    def dry_run(document: dict[str, object]) -> tuple[int, str]:
        done = kube.kubectl("alice", "create", "--dry-run=server", "-f", "-",
                            input=yaml.safe_dump(document))  # fmt: skip
        return done.returncode, done.stdout + done.stderr

    # No token volume: the API server would project the account's token and CA ConfigMaps into
    # the pod, each judged as what the pod uses; the account alone is what this is about.
    no_token = {"automountServiceAccountToken": False}

    def pod_as(account: str) -> dict[str, object]:
        spec = {**no_token, "serviceAccountName": account,
                "containers": [{"name": "c", "image": "busybox"}]}  # fmt: skip
        return obj("Pod", "p", tenants, {"team": "a"}, spec=spec)

    def deployment_as(account: str) -> dict[str, object]:
        document: Any = deployment(tenants, "web", "a")
        document["spec"]["template"]["spec"] |= {**no_token, "serviceAccountName": account}
        return dict(document)

    def own_bucket_lent() -> None:
        for document in (pod_as("deployer-a"), deployment_as("deployer-a")):
            status, output = dry_run(document)
            assert status == 0, output

    eventually(own_bucket_lent)  # once the webhook's metadata cache holds the new accounts
    lent_only = "the user may run pods only as ServiceAccounts labeled team in [a] (role "
    for written, whose, document in (
        ('pods "p"', "it", pod_as("deployer-b")),
        ('deployments.apps "web"', "its pod template", deployment_as("deployer-b")),
    ):
        status, output = dry_run(document)
        assert status != 0
        assert (
            f'user "alice" may not create {written} in namespace "{tenants}": {whose} uses '
            f'serviceaccounts "deployer-b", which has label team="b": {lent_only}{tenants}/team-a)'
        ) in output


def test_apply_creates_in_the_bucket_server_side_not_client_side(
    kube: LabelRbacCluster, tenants: str
) -> None:
    """Client-side ``kubectl apply`` GETs the object first; a get of an object whose labels
    cannot be read (here: it does not exist yet) is refused, so that no other bucket's object
    is revealed. Server-side apply sends the object with the request and is judged by it."""
    document = yaml.safe_dump(configmap(tenants, "new", team="a"))
    client_side = kube.kubectl("alice", "apply", "-f", "-", input=document)
    assert client_side.returncode != 0
    assert (
        f'may not get configmaps "new" in namespace "{tenants}": its labels cannot be checked '
        f'(could not read configmaps "new" in namespace "{tenants}": HTTP 404 NotFound)'
    ) in client_side.stderr
    server_side = kube.kubectl("alice", "apply", "--server-side", "-f", "-", input=document)
    assert server_side.returncode == 0, server_side.stderr
    assert server_side.stdout.strip() == "configmap/new serverside-applied"

    def applied_again() -> None:
        # The API server keeps the refused get for unauthorizedTTL (1 s) before asking again.
        again = kube.kubectl("alice", "apply", "-f", "-", input=document)
        assert again.returncode == 0, again.stderr

    eventually(applied_again, timeout=5)
    other = yaml.safe_dump(configmap(tenants, "theirs", team="b"))
    refused = kube.kubectl("alice", "apply", "--server-side", "-f", "-", input=other)
    assert refused.returncode != 0
    assert 'label team="b" is not permitted' in refused.stderr


def test_the_ci_robot_rolls_web_within_both_teams(kube: LabelRbacCluster, tenants: str) -> None:
    """Role ci: get/update/patch on the deployment named web, labeled team a or b (an admin
    impersonating the robot's ServiceAccount, as the API server authenticates its token)."""
    robot = f"system:serviceaccount:{tenants}:ci-deployer"
    kube.apply(ADMIN, [deployment(tenants, "web", "a"), deployment(tenants, "api", "a")])
    rolled = kube.kubectl(ADMIN, "--as", robot, "-n", tenants, "set", "image", "deployment/web",
                          "c=busybox:2")  # fmt: skip
    assert rolled.returncode == 0, rolled.stderr
    relabel = kube.kubectl(ADMIN, "--as", robot, "-n", tenants, "label", "deployment", "web",
                           "team=c", "--overwrite")  # fmt: skip
    assert relabel.returncode != 0
    assert f'user "{robot}" may not update deployments.apps "web"' in relabel.stderr
    assert 'label team="c" is not permitted (role ' in relabel.stderr
    other = kube.kubectl(ADMIN, "--as", robot, "-n", tenants, "set", "image", "deployment/api",
                         "c=busybox:2")  # fmt: skip
    assert other.returncode != 0
    assert "labelrbac" not in other.stderr  # RBAC's resourceNames refuse it first
    assert f'User "{robot}" cannot get resource "deployments"' in other.stderr
