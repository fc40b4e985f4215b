"""``who-can`` and ``audit`` against the live cluster, read with an admin's kubeconfig."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from tests.kube.cluster import LabelRbacCluster
from tests.kube.controlplane import ADMIN
from tests.kube.support import install_tenants, obj
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
