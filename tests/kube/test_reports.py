"""``label-rbac report`` through a real kube-apiserver with the upstream report CRDs
(../shared/fixtures/policy-reports): every report it writes is accepted by their schemas, a
label or RBAC change updates the right report within seconds, a tenant who may write reports
cannot make one say what it should not (forged, emptied, deleted, unlabeled, a stray: each
undone within an interval), a tenant admin's long annotations cannot make a report too large,
and a new leader keeps when each finding was first seen.

The example RBAC (manifests/examples) is installed; the reporter runs as a process with the
identity and rights manifests/reports ships, leader of its Lease, writing both the
wgpolicyk8s.io and the openreports.io kinds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
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
RBAC = "/apis/rbac.authorization.k8s.io/v1"
CRD_API = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
T1 = f"{WG}/namespaces/t1/policyreports"
MERGE = "application/merge-patch+json"
FORGED = {"summary": {"pass": 42, "fail": 0, "warn": 0, "error": 0, "skip": 0}, "results": []}


def configmap(name: str, labels: dict[str, str], namespace: str = "t1") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace, "labels": labels}}  # fmt: skip


# The tenant who may write policy reports in t1 (as Kyverno's aggregated roles let admins).
REPORT_WRITER = [
    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
     "metadata": {"name": "report-writer", "namespace": "t1"},
     "rules": [{"apiGroups": ["wgpolicyk8s.io"], "resources": ["policyreports"],
                "verbs": ["get", "list", "create", "update", "patch", "delete"]}]},
    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
     "metadata": {"name": "report-writer", "namespace": "t1"},
     "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                 "name": "report-writer"},
     "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "alice"}]},
]  # fmt: skip


class Reporters:
    """The reporter processes of the module, each logging to its own file."""

    def __init__(self, cp: ControlPlane, workdir: Path) -> None:
        self.cp, self.workdir = cp, workdir
        self.running: dict[str, subprocess.Popen[str]] = {}

    def start(self, identity: str) -> None:
        log = (self.workdir / f"reporter-{identity}.log").open("w")
        self.running[identity] = subprocess.Popen(
            [sys.executable, "-m", "app", "report",
             "--kubeconfig", str(self.cp.kubeconfig(REPORTER.name)), "--identity", identity,
             "--interval", str(INTERVAL), "--lease-seconds", "3", "--openreports"],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "KUBECONFIG": ""}, start_new_session=True,
        )  # fmt: skip

    def log(self, identity: str) -> str:
        return (self.workdir / f"reporter-{identity}.log").read_text()

    def stop(self, identity: str) -> None:
        stop(self.running.pop(identity))


INTERVAL = 0.2


@pytest.fixture(scope="module")
def reporters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Reporters]:
    require_control_plane()
    workdir = tmp_path_factory.mktemp("reports")
    cp = ControlPlane(workdir, users=(*DEFAULT_USERS, REPORTER))
    cp.start()
    running = Reporters(cp, workdir)
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
        cp.apply(ADMIN, REPORT_WRITER)
        cp.apply(ADMIN, [configmap("ok", {"team": "a"}), configmap("stray", {"team": "z"}),
                         configmap("witness", {"team": "w"}),  # failing, never changed
                         configmap("coredns", {}, "kube-system")])  # fmt: skip
        running.start("one")
        yield running
    finally:
        for identity in list(running.running):
            running.stop(identity)
            print(running.log(identity)[-3000:])
        cp.stop()


@pytest.fixture
def cluster(reporters: Reporters) -> ControlPlane:
    return reporters.cp


def report(cp: ControlPlane, path: str) -> dict[str, Any] | None:
    status, body = cp.request(ADMIN, "GET", path)
    return body if status == 200 else None


def failing(found: dict[str, Any] | None) -> dict[str, str]:
    """Failed results by the name of the object they are about → their rule."""
    results = (found or {}).get("results") or []
    return {r["resources"][0]["name"]: r["rule"] for r in results if r["result"] == "fail"}


def passing(found: dict[str, Any] | None) -> set[str]:
    results = (found or {}).get("results") or []
    return {r["resources"][0]["name"] for r in results if r["result"] == "pass"}


def counts(found: dict[str, Any]) -> dict[str, int]:
    """Results by outcome, as Policy Reporter counts them (from the results)."""
    tally: dict[str, int] = {}
    for result in found.get("results") or []:
        tally[result["result"]] = tally.get(result["result"], 0) + 1
    return tally


def summary_of(cp: ControlPlane, path: str) -> dict[str, int] | None:
    return (report(cp, path) or {}).get("summary")


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
    uid = cp.request(ADMIN, "GET", "/api/v1/namespaces/t1/configmaps/stray")[1]["metadata"]["uid"]
    assert stray["resources"][0] == {"apiVersion": "v1", "kind": "ConfigMap", "name": "stray",
                                     "namespace": "t1", "uid": uid}  # fmt: skip
    assert "no role's permission annotation permits its labels (team=z)" in stray["message"]
    # Policy Reporter counts results: the compliant objects and roles have pass results.
    assert counts(found) == {k: v for k, v in found["summary"].items() if v}
    assert "ok" in passing(found) and found["summary"]["pass"] >= 2  # ok, t1's valid roles
    cluster_path = f"{WG}/clusterpolicyreports/label-rbac"
    wait_for(lambda: report(cp, cluster_path) is not None, "the cluster report", timeout=10)
    cluster_report = report(cp, cluster_path)
    assert cluster_report is not None and cluster_report["kind"] == "ClusterPolicyReport"
    # platform-ops' valid annotation: a pass result naming the ClusterRole, with its uid.
    (ops,) = [r for r in cluster_report["results"] if r["resources"][0]["name"] == "platform-ops"
              and r["resources"][0]["kind"] == "ClusterRole"]  # fmt: skip
    ops_uid = cp.request(ADMIN, "GET", f"{RBAC}/clusterroles/platform-ops")[1]["metadata"]["uid"]
    assert (ops["result"], ops["resources"][0]["uid"]) == ("pass", ops_uid)
    assert cluster_report["summary"]["pass"] == counts(cluster_report).get("pass")
    # The system namespaces are left out: kube-system's unlabeled configmap is in no report.
    assert report(cp, f"{WG}/namespaces/kube-system/policyreports/label-rbac") is None
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


def restored(cp: ControlPlane, what: str) -> float:
    """Seconds until t1's report says again what the reporter found (witness fails, labeled)."""

    def honest() -> bool:
        found = report(cp, f"{T1}/label-rbac")
        return (found is not None and "witness" in failing(found)
                and found["summary"]["pass"] != 42
                and found["metadata"].get("labels", {}).get(MANAGED) == "label-rbac")  # fmt: skip

    lag = wait_for(honest, f"the t1 report restored after {what}", timeout=10)
    print(f"{what} -> restored: {lag * 1000:.0f} ms")
    return lag


MANAGED = "app.kubernetes.io/managed-by"


def test_a_tenant_cannot_forge_empty_or_delete_a_report(cluster: ControlPlane) -> None:
    cp = cluster
    wait_for(lambda: "witness" in failing(report(cp, f"{T1}/label-rbac")), "the t1 report", 60)
    status, _ = cp.request("alice", "PATCH", f"{T1}/label-rbac", FORGED, content_type=MERGE)
    assert status == 200  # she may: the report is restored, not protected
    restored(cp, "forged")
    status, _ = cp.request("alice", "PATCH", f"{T1}/label-rbac", {"results": None},
                           content_type=MERGE)  # fmt: skip
    assert status == 200
    restored(cp, "emptied")
    assert cp.request("alice", "DELETE", f"{T1}/label-rbac")[0] == 200
    restored(cp, "deleted")
    label = {"metadata": {"labels": {MANAGED: None}}, **FORGED}
    assert cp.request("alice", "PATCH", f"{T1}/label-rbac", label, content_type=MERGE)[0] == 200
    restored(cp, "unlabeled and forged")
    # A stray carrying the reporter's label is deleted; a report of her own is left alone.
    for name, labels in (("label-rbac-7", {MANAGED: "label-rbac"}), ("mine", {})):
        body = {
            "apiVersion": "wgpolicyk8s.io/v1alpha2",
            "kind": "PolicyReport",
            "metadata": {"name": name, "namespace": "t1", "labels": labels},
            **FORGED,
        }
        assert cp.request("alice", "POST", T1, body)[0] == 201  # fmt: skip
    lag = wait_for(lambda: report(cp, f"{T1}/label-rbac-7") is None, "the stray deleted", 10)
    print(f"stray -> deleted: {lag * 1000:.0f} ms")
    assert report(cp, f"{T1}/mine") is not None


def narrow_roles(namespace: str, roles: int) -> list[dict[str, Any]]:
    """A tenant admin's narrower roles at the annotation limits (4 label keys of 64 values
    each, every key and value as long as a label's may be), each bound to her, and a bucket no
    bound role holds: her objects there are orphans, each of whose results once spelled out
    every bound role's entries twice."""
    keys = [f"example.com/{n}" + "k" * 62 for n in range(4)]
    items: list[dict[str, Any]] = []
    for n in range(roles):
        permissions = {"configmaps": {k: [f"{n}{i}{v:02d}" + "v" * 59 for v in range(64)]
                                      for i, k in enumerate(keys)}}  # fmt: skip
        items.append(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": {
                    "name": f"narrow-{n}",
                    "namespace": namespace,
                    "annotations": {"labelrbac.io/permissions": json.dumps(permissions)},
                },
                "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["update"]}],
            }
        )
        items.append({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": f"narrow-{n}", "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                        "name": f"narrow-{n}"},
            "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io",
                          "name": "alice"}],
        })  # fmt: skip
    items.append({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "elsewhere", "namespace": namespace, "annotations": {
            "labelrbac.io/permissions": json.dumps({"configmaps": {"team": ["b"]}})}},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["update"]}],
    })  # fmt: skip
    return items


def test_long_annotations_cannot_make_a_report_too_large(cluster: ControlPlane) -> None:
    """Six narrower roles with long literal values and 40 orphans: once a 413 on every pass,
    and a forged report left in place. Written now, under the size limit."""
    cp = cluster
    cp.request(ADMIN, "POST", "/api/v1/namespaces", {"metadata": {"name": "big"}})
    forged = {"apiVersion": "wgpolicyk8s.io/v1alpha2", "kind": "PolicyReport",
              "metadata": {"name": "label-rbac", "namespace": "big",
                           "labels": {MANAGED: "label-rbac"}}, **FORGED}  # fmt: skip
    assert cp.request(ADMIN, "POST", f"{WG}/namespaces/big/policyreports", forged)[0] == 201
    cp.apply(ADMIN, narrow_roles("big", 6))
    cp.apply(ADMIN, [configmap(f"cm-{i:02d}", {"team": "b"}, "big") for i in range(40)])
    path = f"{WG}/namespaces/big/policyreports/label-rbac"
    lag = wait_for(lambda: (summary_of(cp, path) or {}).get("fail") == 40, "the big report", 30)
    found = report(cp, path)
    assert found is not None and found["summary"]["pass"] != 42
    orphans = [r for r in found["results"] if r["rule"] == "writable-by-holders"]
    assert len(orphans) == 40
    assert all(r["properties"]["permitted"].endswith("...") for r in orphans)
    size = len(json.dumps(found, separators=(",", ":")))
    biggest = max(len(json.dumps(r, separators=(",", ":"))) for r in orphans)
    print(f"six long roles, 40 orphans: report {size} bytes, largest result {biggest} bytes, "
          f"written {lag:.1f} s after the objects")  # fmt: skip
    assert size < 1_500_000 and biggest < 2_500


def test_a_namespace_past_a_megabyte_of_results_is_split_by_bytes(cluster: ControlPlane) -> None:
    """560 orphans at the longest names, labels and annotations, every text cut: under the
    600-result count, over 1 MB of results, so two reports, each accepted, under etcd's
    1.5 MiB."""
    cp = cluster
    wide = "w" * 63
    cp.request(ADMIN, "POST", "/api/v1/namespaces", {"metadata": {"name": wide}})
    cp.apply(ADMIN, narrow_roles(wide, 1))
    labels = {f"example.com/k{i}": "v" * 63 for i in range(20)} | {"team": "b"}
    for i in range(560):  # one request each: kubectl's apply reads every object first
        body = configmap(f"{i:03d}" + "n" * 250, labels, wide)
        assert cp.request(ADMIN, "POST", f"/api/v1/namespaces/{wide}/configmaps", body)[0] == 201
    path = f"{WG}/namespaces/{wide}/policyreports"
    names = ("label-rbac", "label-rbac-2", "label-rbac-3")

    def fails() -> int:
        return sum((summary_of(cp, f"{path}/{name}") or {}).get("fail", 0) for name in names)

    lag = wait_for(lambda: fails() == 560, "the wide reports", timeout=180)
    stored = [r for r in (report(cp, f"{path}/{name}") for name in names) if r]
    sizes = [len(json.dumps(r, separators=(",", ":"))) for r in stored]
    print(f"560 orphans at the longest names: reports of {sizes} bytes, {lag:.1f} s")
    assert len(stored) == 2 and all(size < 1_100_000 for size in sizes)


def test_a_new_leader_keeps_first_sightings(reporters: Reporters) -> None:
    """A second replica takes over (the first stopped): its results keep the first leader's
    timestamps. The openreports.io CRDs are deleted first: the new leader says so once, with
    the CRD to install, instead of a refusal per namespace."""
    cp = reporters.cp
    wait_for(lambda: "witness" in failing(report(cp, f"{T1}/label-rbac")), "the t1 report", 60)
    before = report(cp, f"{T1}/label-rbac")
    assert before is not None
    stamps = {(r["rule"], r["resources"][0]["name"]): r["timestamp"] for r in before["results"]}
    for crd in ("reports.openreports.io", "clusterreports.openreports.io"):
        cp.request(
            ADMIN, "DELETE", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}"
        )
    wait_for(lambda: cp.request(ADMIN, "GET", f"{OPEN}/reports")[0] == 404, "the CRDs gone")
    time.sleep(1.5)  # every result's first sighting at least a second old
    reporters.start("two")
    reporters.stop("one")
    wait_for(lambda: "leading" in reporters.log("two"), "the second leader", timeout=30)
    cp.apply(ADMIN, [configmap("after", {"team": "q"})])
    wait_for(lambda: "after" in failing(report(cp, f"{T1}/label-rbac")), "two's first write", 15)
    after = report(cp, f"{T1}/label-rbac")
    assert after is not None
    kept = {(r["rule"], r["resources"][0]["name"]): r["timestamp"] for r in after["results"]}
    assert kept[("labels-in-a-bucket", "witness")] == stamps[("labels-in-a-bucket", "witness")]
    assert {k: kept[k] for k in stamps if k in kept} == stamps
    log = reporters.log("two")
    assert log.count("is not served") == 2  # reports and clusterreports, once each
    assert "CustomResourceDefinition reports.openreports.io is installed" in log
    assert "could not write" not in log and "HTTP 404" not in log


POOL = "node-restriction.kubernetes.io/pool"


def test_a_pod_bound_outside_its_pool_fails_until_its_node_joins_the_pool(
    cluster: ControlPlane,
) -> None:
    """Two pools of Nodes and a role placing team=a pods on pool a (docs/placement.md): a pod
    on pool a's Node passes; an admin binds another team=a pod to pool b's Node through
    pods/binding (no scheduler, no webhook: nothing stops an admin); the report fails it within
    an interval or two, naming the pod by its uid, and passes it once the Node is relabelled
    into pool a."""
    cp = cluster
    ns = "placed"
    cp.request(ADMIN, "POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
    cp.apply(ADMIN, [
        *({"apiVersion": "v1", "kind": "Node",
           "metadata": {"name": f"pool-{p}", "labels": {POOL: p}}} for p in ("a", "b")),
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": "default", "namespace": ns}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "team-a", "namespace": ns, "annotations": {
             "labelrbac.io/permissions": json.dumps({"pods": {"team": ["a"]}}),
             "labelrbac.io/placement": json.dumps({"nodeLabels": {POOL: ["a"]}})}},
         "rules": [{"apiGroups": [""], "resources": ["pods", "pods/binding"], "verbs": ["*"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "team-a", "namespace": ns},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "team-a"},
         "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "alice"}]},
    ])  # fmt: skip

    def pod(name: str, **spec: Any) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": ns, "labels": {"team": "a"}},
                "spec": {"automountServiceAccountToken": False,
                         "containers": [{"name": "c", "image": "nginx"}], **spec}}  # fmt: skip

    path = f"{WG}/namespaces/{ns}/policyreports/label-rbac"

    def placements() -> dict[str, str]:
        results = (report(cp, path) or {}).get("results") or []
        return {r["resources"][0]["name"]: r["result"] for r in results
                if r["rule"] == "placement"}  # fmt: skip

    pods = f"/api/v1/namespaces/{ns}/pods"
    assert cp.request(ADMIN, "POST", pods, pod("home", nodeName="pool-a"))[0] == 201
    wait_for(lambda: placements() == {"home": "pass"}, "the placed pod's pass", timeout=10)
    status, created = cp.request(ADMIN, "POST", pods, pod("stray"))
    assert status == 201, created
    binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "stray"},
               "target": {"apiVersion": "v1", "kind": "Node", "name": "pool-b"}}  # fmt: skip
    status, bound = cp.request(ADMIN, "POST", f"{pods}/stray/binding", binding)
    assert status == 201, bound
    lag = wait_for(lambda: failing(report(cp, path)).get("stray") == "placement",
                   "the misplaced pod's result", timeout=10)  # fmt: skip
    print(f"pods/binding -> fail result: {lag * 1000:.0f} ms (interval {INTERVAL * 1000:.0f} ms)")
    found = report(cp, path)
    assert found is not None
    (result,) = [r for r in found["results"]
                 if r["rule"] == "placement" and r["resources"][0]["name"] == "stray"]  # fmt: skip
    uid = created["metadata"]["uid"]
    assert result["resources"][0] == {"apiVersion": "v1", "kind": "Pod", "name": "stray",
                                      "namespace": ns, "uid": uid}  # fmt: skip
    assert result["message"].startswith(
        f'pod {ns}/stray: node "pool-b" is outside its pool (role {ns}/team-a places it on '
    )
    assert "delete it to have it scheduled again within its pool" in result["message"]
    assert result["properties"] == {"node": "pool-b", "labels": "team=a"}
    relabel = {"metadata": {"labels": {POOL: "a"}}}
    status, _ = cp.request(ADMIN, "PATCH", "/api/v1/nodes/pool-b", relabel, content_type=MERGE)
    assert status == 200
    lag = wait_for(lambda: placements() == {"home": "pass", "stray": "pass"},
                   "the pod's pass once its node joins the pool", timeout=10)  # fmt: skip
    print(f"node relabel -> pass result: {lag * 1000:.0f} ms")
