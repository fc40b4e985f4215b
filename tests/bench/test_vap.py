"""A tiny run of the compiled-policy benchmark through a real kube-apiserver, to keep it working."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bench import vap
from tests.bench import run_bench
from tests.kube.conftest import require_control_plane
from tests.support import ROOT


def test_a_tiny_vap_run_measures_every_setup_against_no_admission(tmp_path: Path) -> None:
    require_control_plane()
    if shutil.which("wrk") is None:
        pytest.skip("wrk is not installed (apt-get install wrk)")
    out = tmp_path / "vap.json"
    result = run_bench(
        "vap", "--bindings", "3", "--connections", "1", "--seconds", "1", "--rounds", "1",
        "--setups", "compiled,webhook,params,denied", "--json", str(out),
        "--policy", str(ROOT / "manifests" / "compiled" / "policy.yaml"), timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    rows = json.loads(out.read_text())
    # (The baselines, the hand-written rule among them; the parts of the compiled policy: judging
    # nothing, and denying by labels only; then the policy of a file, here the shipped one.)
    setups = ["none", "trivial", "rule", "compiled", "webhook", "params", "denied", "file"]
    assert [row["setup"] for row in rows] == setups
    for row in rows:
        assert row["bindings"] == 3 and row["connections"] == 1
        assert row["p50_ms"] > 0 and row["rps"] > 0 and row["params_bytes"] > 0
        assert row["cpu_ms_per_create"] > 0 and row["load_average"] >= 0
    # Ratios are against the no-admission run of the same round, the trivial policy's, and the
    # increment of the hand-written rule's.
    none, trivial, rule, _, webhook, *_ = rows
    assert none["throughput_ratio"] == 1.0 and none["added_p50_ms"] == 0.0
    assert none["added_cpu_ms"] == 0.0
    assert trivial["cpu_vs_trivial"] == 1.0
    assert rule["cpu_vs_rule"] == 1.0 or rule["added_cpu_ms"] <= 0
    # Only the webhook setup sends reviews to the webhook process.
    assert webhook["webhook_cpu_ms_per_create"] > 0


def test_a_tiny_vap_run_measures_the_cluster_part_stored_once_beside_its_copies(
    tmp_path: Path,
) -> None:
    require_control_plane()
    if shutil.which("wrk") is None:
        pytest.skip("wrk is not installed (apt-get install wrk)")
    out = tmp_path / "vap.json"
    result = run_bench(
        "vap", "--bindings", "3", "--connections", "1", "--seconds", "1", "--rounds", "1",
        "--setups", "compiled,constant,literal,flat-literal", "--cluster-grants", "0,2",
        "--json", str(out),
        timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    rows = json.loads(out.read_text())
    setups = ["none", "trivial", "rule", "compiled", "constant", "literal", "flat-literal"]
    assert [(row["cluster_grants"], row["setup"]) for row in rows] == [
        (k, setup) for k in (0, 2) for setup in setups
    ]
    # (The compiled policy and the constant refused alice's probe of another team's label
    # before they were measured; the literals, which refuse nothing, let it through.)
    for row in rows:
        assert row["cpu_ms_per_create"] > 0 and row["rps"] > 0
    without, with_two = rows[0], rows[len(setups)]
    # The cluster-wide grants are copied into the parameters as shipped; the namespace's own
    # part does not grow with them (its index lists their resources: a few bytes), and the
    # constant holds them once.
    copied = with_two["params_bytes"] - without["params_bytes"]
    assert copied > 0
    assert with_two["own_params_bytes"] - without["own_params_bytes"] < copied / 20
    assert with_two["constant_bytes"] > without["constant_bytes"]


@pytest.mark.parametrize(
    ("value", "literal"),
    [
        pytest.param({"a": True}, '{"a":dyn(true)}', id="map"),
        pytest.param(["x", 1], '[dyn("x"),dyn(1)]', id="list"),
        pytest.param({"g": {"labels": []}}, '{"g":dyn({"labels":dyn([])})}', id="nested"),
        pytest.param('say "hi"', '"say \\"hi\\""', id="escaped-string"),
    ],
)
def test_a_cel_literal_wraps_every_value_so_mixed_types_type_check(
    value: object, literal: str
) -> None:
    assert vap.cel_literal(value) == literal


def test_the_cluster_part_splits_off_with_only_the_roles_and_grants_it_alone_refers_to() -> None:
    spec = {
        "users": {"alice": ["0"]},
        "groups": {},
        "clusterUsers": {"ops": ["c0"], "alice": ["c1"]},
        "clusterGroups": {"tenants": ["c1"]},
        "roles": {"0": {"*": {"CREATE": "a"}}, "c0": {"*": {"CREATE": "c0"}},
                  "c1": {"configmaps": {"CREATE": "c1", "DELETE": "c0"}}},
        "grants": {"a": {"role": "r"}, "c0": {"role": "c"}, "c1": {"role": "d"}},
    }  # fmt: skip
    own, cluster = vap.split_cluster_part(spec)
    assert cluster["clusterUsers"] == spec["clusterUsers"]
    assert cluster["clusterGroups"] == spec["clusterGroups"]
    assert sorted(cluster["roles"]) == ["c0", "c1"] and sorted(cluster["grants"]) == ["c0", "c1"]
    assert own["clusterUsers"] == own["clusterGroups"] == {}
    assert own["roles"] == {"0": spec["roles"]["0"]} and own["grants"] == {"a": {"role": "r"}}
    # Together they hold what the parameters as shipped hold.
    assert {**own["roles"], **cluster["roles"]} == spec["roles"]
    assert {**own["grants"], **cluster["grants"]} == spec["grants"]


def test_either_part_reads_ids_params_lack_from_the_cluster_part_nested_lookups_too() -> None:
    found = vap.either_part(
        "params.spec.grants[?(params.spec.roles[id][?k].orValue(''))] + "
        "params.spec.?clusterUsers[?u]",
        "C",
    )
    roles = "((id) in params.spec.roles ? params.spec.roles : C.roles)[id]"
    assert found == (
        f"((({roles}[?k].orValue(''))) in params.spec.grants ? params.spec.grants : C.grants)"
        f"[?({roles}[?k].orValue(''))] + C.?clusterUsers[?u]"
    )
