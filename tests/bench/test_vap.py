"""A tiny run of the compiled-policy benchmark through a real kube-apiserver, to keep it working."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from app.compiled.admission_policy import POLICY, binding, policy
from tests.bench import run_bench
from tests.kube.conftest import require_control_plane


def test_a_tiny_vap_run_measures_every_setup_against_no_admission(tmp_path: Path) -> None:
    require_control_plane()
    if shutil.which("wrk") is None:
        pytest.skip("wrk is not installed (apt-get install wrk)")
    out = tmp_path / "vap.json"
    # Another shape of the policy: the enforcing one knowing no ClusterRoleBinding's grant.
    other = tmp_path / "policy.yaml"
    other.write_text(yaml.safe_dump_all([policy(POLICY), binding(POLICY)]))
    result = run_bench(
        "vap", "--bindings", "3", "--connections", "1", "--seconds", "1", "--rounds", "1",
        "--setups", "compiled,webhook,params,denied", "--json", str(out),
        "--policy", str(other), timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    rows = json.loads(out.read_text())
    # (The baselines, the hand-written rule among them; the parts of the compiled policy: judging
    # nothing, and denying by labels only; then the policy of a file.)
    setups = ["none", "trivial", "rule", "compiled", "webhook", "params", "denied", "file"]
    assert [row["setup"] for row in rows] == setups
    for row in rows:
        assert row["bindings"] == 3 and row["connections"] == 1 and row["writer"] == "alice"
        assert row["p50_ms"] > 0 and row["rps"] > 0 and row["params_bytes"] > 0
        assert row["cpu_ms_per_create"] > 0 and row["load_average"] >= 0
    # Ratios are against the no-admission run of the same round, the trivial policy's, and the
    # hand-written rule's.
    none, trivial, rule, _, webhook, *_ = rows
    assert none["throughput_ratio"] == 1.0 and none["added_p50_ms"] == 0.0
    assert none["added_cpu_ms"] == 0.0
    assert trivial["cpu_vs_trivial"] == 1.0 and rule["rps_vs_rule"] == 1.0
    assert rule["cpu_vs_rule"] == 1.0 or rule["added_cpu_ms"] <= 0
    # Only the webhook setup sends reviews to the webhook process.
    assert webhook["webhook_cpu_ms_per_create"] > 0


def test_a_tiny_vap_run_measures_a_writer_granted_only_by_the_policys_constants_among_tenants(
    tmp_path: Path,
) -> None:
    require_control_plane()
    if shutil.which("wrk") is None:
        pytest.skip("wrk is not installed (apt-get install wrk)")
    out = tmp_path / "vap.json"
    result = run_bench(
        "vap", "--bindings", "3", "--connections", "1", "--seconds", "1", "--rounds", "1",
        "--setups", "compiled,full", "--cluster-grants", "0,2", "--writer", "cluster",
        "--namespaces", "4", "--json", str(out), timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    rows = json.loads(out.read_text())
    setups = ["none", "trivial", "rule", "compiled", "full"]
    assert [(row["cluster_grants"], row["setup"]) for row in rows] == [
        (k, setup) for k in (0, 2) for setup in setups
    ]
    # (Before each was measured, the compiled policy, and the shipped install's, let carol's own
    # label through, which only their constants grant her, and refused another.) The running
    # compiler wrote the policy of the shipped install with the constants the benchmark wrote.
    assert result.stdout.count("the compiler's: the same 1 constants") == 2, result.stdout
    for row in rows:
        assert row["writer"] == "carol" and row["cpu_ms_per_create"] > 0 and row["rps"] > 0
        assert row["namespaces"] == 4
    # Three tenant namespaces beside t1, each compiled and marked before anything was measured.
    assert "namespaces=4: 21 objects in" in result.stdout, result.stdout
    assert "the compiler marked every namespace after" in result.stdout
    without, with_two = rows[0], rows[len(setups)]
    # The cluster-wide grants are held once, in the policy's constants: they grow, the
    # namespace's parameters do not.
    assert with_two["params_bytes"] == without["params_bytes"]
    assert with_two["constant_code_points"] > without["constant_code_points"] > 0
    assert with_two["chunks"] == without["chunks"] == 1
