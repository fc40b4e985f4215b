"""``label-rbac report`` through a real kube-apiserver with the upstream report CRDs
(../shared/fixtures/policy-reports): every report it writes is accepted by their schemas, and a
label or RBAC change updates the right report within seconds.

The example RBAC (manifests/examples) is installed; the reporter runs as a process with the
identity and rights manifests/reports ships, leader of its Lease, writing both the
wgpolicyk8s.io and the openreports.io kinds.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.kube.conftest import require_control_plane, wait_for
from tests.kube.controlplane import ADMIN, DEFAULT_USERS, ControlPlane, service_account
from tests.process import stop
from tests.support import ROOT

CRDS = ROOT.parent / "shared" / "fixtures" / "policy-reports"
EXAMPLES = ROOT / "manifests" / "examples"
WG = "/apis/wgpolicyk8s.io/v1alpha2"
OPEN = "/apis/openreports.io/v1alpha1"
REPORTER = service_account("label-rbac", "label-rbac-reporter")


def configmap(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "t1", "labels": labels}}  # fmt: skip


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    require_control_plane()
    workdir = tmp_path_factory.mktemp("reports")
    cp = ControlPlane(workdir, users=(*DEFAULT_USERS, REPORTER))
    cp.start()
    reporter: subprocess.Popen[str] | None = None
    try:
        crds = [d for path in sorted(CRDS.glob("*.yaml")) for d in yaml.safe_load_all(
            path.read_text()) if d]  # fmt: skip
        cp.apply(ADMIN, crds)
        for path in (f"{WG}/policyreports", f"{WG}/clusterpolicyreports", f"{OPEN}/reports"):
            wait_for(lambda p=path: cp.request(ADMIN, "GET", p)[0] == 200, f"the CRD of {path}")
        cp.request(ADMIN, "POST", "/api/v1/namespaces", {"metadata": {"name": "label-rbac"}})
        cp.apply(ADMIN, (EXAMPLES / "namespaces.yaml").read_text())
        cp.apply(ADMIN, (EXAMPLES / "tenants.yaml").read_text())
        cp.apply(ADMIN, (EXAMPLES / "cluster.yaml").read_text())
        cp.apply(ADMIN, (ROOT / "manifests" / "reports" / "rbac.yaml").read_text())
        cp.apply(ADMIN, [configmap("ok", {"team": "a"}), configmap("stray", {"team": "z"})])
        log = (workdir / "reporter.log").open("w")
        reporter = subprocess.Popen(
            [sys.executable, "-m", "app", "report",
             "--kubeconfig", str(cp.kubeconfig(REPORTER.name)), "--identity", "one",
             "--interval", "0.2", "--lease-seconds", "3", "--openreports"],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "KUBECONFIG": ""}, start_new_session=True,
        )  # fmt: skip
        yield cp
    finally:
        if reporter is not None:
            stop(reporter)
            print((workdir / "reporter.log").read_text()[-3000:])
        cp.stop()


def report(cp: ControlPlane, path: str) -> dict[str, Any] | None:
    status, body = cp.request(ADMIN, "GET", path)
    return body if status == 200 else None


def failing(found: dict[str, Any] | None) -> dict[str, str]:
    """Failed results by the name of the object they are about → their rule."""
    results = (found or {}).get("results") or []
    return {r["resources"][0]["name"]: r["rule"] for r in results if r["result"] == "fail"}


def test_reports_are_written_as_the_crds_accept_them(cluster: ControlPlane) -> None:
    cp = cluster
    path = f"{WG}/namespaces/t1/policyreports/label-rbac"
    lag = wait_for(lambda: "stray" in failing(report(cp, path)), "the t1 report", timeout=60)
    print(f"reporter start -> t1 report: {lag:.1f} s")
    found = report(cp, path)
    assert found is not None
    (stray,) = [r for r in found["results"] if r["resources"][0]["name"] == "stray"]
    assert stray["source"] == "label-rbac" and stray["policy"] == "label-rbac"
    assert stray["rule"] == "labels-in-a-bucket" and stray["severity"] == "high"
    assert stray["resources"][0] == {"apiVersion": "v1", "kind": "ConfigMap", "name": "stray",
                                     "namespace": "t1"}  # fmt: skip
    assert "no role's permission annotation permits its labels (team=z)" in stray["message"]
    assert found["summary"]["fail"] == len(found["results"])
    assert found["summary"]["pass"] >= 1  # the ok configmap, the valid roles of t1
    cluster_path = f"{WG}/clusterpolicyreports/label-rbac"
    wait_for(lambda: report(cp, cluster_path) is not None, "the cluster report", timeout=10)
    cluster_report = report(cp, cluster_path)
    assert cluster_report is not None and cluster_report["kind"] == "ClusterPolicyReport"
    assert cluster_report["summary"]["pass"] >= 1  # platform-ops' valid annotation
    # platform-ops restricts every resource ("*"); the shipped rights list only some of them:
    # the others are said to be unaudited, not silently left out.
    errors = {r["resources"][0]["name"]: r for r in cluster_report["results"]
              if r["result"] == "error"}  # fmt: skip
    assert "services" in errors and "configmaps" not in errors
    assert errors["services"]["rule"] == "audited"
    assert "cannot be listed" in errors["services"]["message"]
    assert cluster_report["summary"]["error"] == len(errors)
    open_path = f"{OPEN}/namespaces/t1/reports/label-rbac"
    wait_for(lambda: report(cp, open_path) is not None, "the openreports report", timeout=10)
    opened = report(cp, open_path)
    assert opened is not None and failing(opened) == failing(found)
    assert opened["source"] == "label-rbac"


def test_a_label_change_updates_the_report_within_seconds(cluster: ControlPlane) -> None:
    cp = cluster
    path = f"{WG}/namespaces/t1/policyreports/label-rbac"
    wait_for(lambda: "stray" in failing(report(cp, path)), "the t1 report", timeout=60)
    cp.apply(ADMIN, [configmap("stray", {"team": "a"})])
    lag = wait_for(lambda: "stray" not in failing(report(cp, path)), "the fix", timeout=10)
    print(f"label change -> report: {lag * 1000:.0f} ms")
    cp.apply(ADMIN, [configmap("stray2", {"team": "q"})])
    wait_for(lambda: "stray2" in failing(report(cp, path)), "a new finding", timeout=10)


def test_an_rbac_change_updates_the_right_report(cluster: ControlPlane) -> None:
    cp = cluster
    broken = {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "broken", "namespace": "t2",
                     "annotations": {"labelrbac.io/permissions": "{not json"}},
        "rules": [],
    }  # fmt: skip
    cp.request(ADMIN, "POST", "/api/v1/namespaces", {"metadata": {"name": "t2"}})
    cp.apply(ADMIN, [broken])
    path = f"{WG}/namespaces/t2/policyreports/label-rbac"
    lag = wait_for(lambda: failing(report(cp, path)).get("broken") == "valid-annotation",
                   "the t2 report", timeout=10)  # fmt: skip
    print(f"RBAC change -> report: {lag * 1000:.0f} ms")
    assert "broken" not in failing(report(cp, f"{WG}/namespaces/t1/policyreports/label-rbac"))
