"""``who-can`` and ``audit`` against the live cluster, read with an admin's kubeconfig."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from tests.kube.cluster import LabelRbacCluster
from tests.kube.controlplane import ADMIN
from tests.kube.support import eventually, install_tenants, obj
from tests.support import ROOT


@pytest.fixture
def tenants(kube: LabelRbacCluster, namespace: str) -> str:
    install_tenants(kube, namespace)
    return namespace


def cli(kube: LabelRbacCluster, *args: str) -> subprocess.CompletedProcess[str]:
    kubeconfig = str(kube.control_plane.kubeconfig(ADMIN))
    return subprocess.run(
        [sys.executable, "-m", "app", *args, "--kubeconfig", kubeconfig],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_who_can_names_the_holders_of_a_bucket(kube: LabelRbacCluster, tenants: str) -> None:
    done = cli(kube, "who-can", "create", "configmaps", "-n", tenants, "-l", "team=a", "-o", "json")
    assert done.returncode == 0, done.stderr
    report: Any = json.loads(done.stdout)
    verdicts = {
        (s["subject"]["kind"], s["subject"]["name"]): (s["allowed"], s["labels"])
        for s in report["subjects"]
    }
    team = [[{"key": "team", "values": ["a"]}]]
    assert verdicts[("User", "alice")] == (True, team)
    assert verdicts[("Group", "t1-admins")] == (True, team)
    assert verdicts[("User", "bob")] == (False, [[{"key": "team", "values": ["b"]}]])
    assert verdicts[("Group", "system:masters")] == (True, [])


def test_audit_finds_objects_in_no_bucket(kube: LabelRbacCluster, tenants: str) -> None:
    kube.apply(
        ADMIN,
        [
            obj("ConfigMap", "stray", tenants, {"team": "z"}),
            obj("ConfigMap", "ok", tenants, {"team": "a"}),
        ],
    )
    done = cli(kube, "audit", "-n", tenants, "-o", "json")
    assert done.returncode == 1, done.stderr  # it found something to fix
    report = json.loads(done.stdout)
    assert [(o["name"], o["labels"]) for o in report["unbucketed"]] == [("stray", {"team": "z"})]
    assert [o["name"] for o in report["orphans"]] == ["stray"]
    holders = {
        (b["role"]["name"], b["resource"]): [(h["subject"]["name"], h["binding"]["name"])
                                             for h in b["holders"]]
        for b in report["buckets"][tenants]
    }  # fmt: skip
    assert holders[("team-a", "configmaps")] == [("t1-admins", "team-a"), ("alice", "team-a")]


# Questions kubectl auth can-i asks the cluster itself (its authorizers: label-rbac's
# /authorize, then RBAC): reads judged by labels, and verbs RBAC alone answers; alice's answer
# (0 yes, 1 no) holds a "mine" ConfigMap labeled team=a and a "theirs" labeled team=b.
CAN_I = [
    pytest.param(["list", "configmaps"], 1, id="list-without-selector"),
    pytest.param(["get", "configmaps/mine"], 0, id="get-own-labels"),
    pytest.param(["get", "cm/theirs"], 1, id="get-foreign-labels-short-name"),
    pytest.param(["get", "configmap/theirs"], 1, id="get-singular"),
    pytest.param(["watch", "deploy"], 1, id="watch-short-name"),
    pytest.param(["frobnicate", "configmaps"], 0, id="custom-verb-granted"),
    pytest.param(["bind", "roles"], 1, id="bind-not-granted"),
    pytest.param(["escalate", "roles.rbac.authorization.k8s.io"], 1, id="escalate-not-granted"),
    pytest.param(["use", "pods"], 0, id="use-granted"),
    pytest.param(["impersonate", "serviceaccounts/ci-deployer"], 1, id="impersonate-not-granted"),
]


@pytest.mark.parametrize(("question", "expected"), CAN_I)
def test_check_answers_as_kubectl_auth_can_i(
    kube: LabelRbacCluster, tenants: str, question: list[str], expected: int
) -> None:
    kube.apply(
        ADMIN,
        [obj("ConfigMap", "mine", tenants, {"team": "a"}),
         obj("ConfigMap", "theirs", tenants, {"team": "b"})],
    )  # fmt: skip
    ours = cli(kube, "check", *question, "-n", tenants, "--as", "alice", "--as-group", "tenants",
               "-q")  # fmt: skip
    assert (ours.returncode, ours.stdout) == (expected, ""), ours.stderr

    def kubectl_agrees() -> None:  # once the webhook's watch has the new objects' labels
        asked = kube.kubectl("alice", "auth", "can-i", *question, "-n", tenants)
        assert asked.stdout.split(maxsplit=1)[0] in ("yes", "no"), asked.stderr  # an answer
        assert asked.returncode == ours.returncode, (asked.stdout, asked.stderr)

    eventually(kubectl_agrees)


def test_check_list_reads_the_clusters_rbac(kube: LabelRbacCluster, tenants: str) -> None:
    done = cli(kube, "check", "--list", "--as", "alice", "-n", tenants, "-o", "json")
    assert done.returncode == 0, done.stderr
    rules = {(r["resource"], r["limits"]) for r in json.loads(done.stdout)["rules"]}
    assert ("configmaps", "team in [a]") in rules
    assert ("deployments.apps/scale", "team in [a]") in rules
    assert all(resource != "roles.rbac.authorization.k8s.io" for resource, _ in rules)
