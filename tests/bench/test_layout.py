"""A tiny run of the layout benchmark through a real kube-apiserver, to keep it working."""

from __future__ import annotations

import json
from pathlib import Path

from tests.bench import run_bench
from tests.kube.conftest import require_control_plane

CLUSTER_KINDS = ("clusterrole", "clusterrolebinding")


def test_a_tiny_layout_run_stores_the_cluster_part_once_and_the_previous_layout_in_every_namespace(
    tmp_path: Path,
) -> None:
    require_control_plane()
    out, profiles = tmp_path / "layout.json", tmp_path / "profiles"
    result = run_bench(
        "layout", "--namespaces", "20", "--cluster-grants", "2", "--baseline-namespaces", "10",
        "--edits", "2", "--baseline-edits", "1", "--json", str(out), "--profiles", str(profiles),
        "--profile-seconds", "1", "--settle", "0", timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    this, previous = json.loads(out.read_text())
    assert (this["layout"], previous["layout"]) == ("this", "previous")
    assert "stored / information" in result.stdout  # the table
    for run, namespaces in ((this, 20), (previous, 10)):
        # Per namespace a Namespace, three Roles and three RoleBindings; two grants of two.
        assert run["objects"] == namespaces * 7 + 2 * 2
        # label-rbac, default and the kube-* namespaces have parameters too.
        assert run["params_objects"] == namespaces + 5
        assert 0 < run["written_s"] <= run["enforcing_s"]
        assert run["marked_s"] > 0  # every namespace marked: the first compile's end
        cpu = run["first_compile_cpu_ms_per_namespace"]
        assert set(cpu) == {"apiserver", "etcd", "compiler"} and min(cpu.values()) > 0
        for at in ("none", "compiled", "end"):
            assert run[f"apiserver_heap_{at}_mb"] > 10, at  # the API server's live heap
        assert run["information_bytes"] == namespaces * run["own_bytes"] + run["cluster_bytes"]
        for at in ("none", "compiled", "end", "settled"):
            assert run[f"apiserver_rss_{at}_mb"] > 50, at
        for peak in ("first", "takeover"):
            assert 10 < run[f"compiler_peak_{peak}_mb"] < 1000
        for kind, rows in run["edits"].items():
            expected = (
                1
                if kind in ("crd", "role")
                else previous["edits"][kind]["count"]
                if run is previous
                else 2
            )
            assert len(rows["rows"]) == rows["count"] == expected, kind
            # The previous release discovers a CRD within its minute's discovery, then writes
            # every namespace.
            most = 150 if kind == "crd" and run is previous else 60
            assert 0 < rows["p50_s"] <= rows["p99_s"] <= rows["max_s"] < most, kind
    # This layout: the compiler wrote the policy with the cluster part, which a cluster-wide
    # edit rewrites alone; the previous layout rewrote every namespace's copy instead.
    assert this["policy_bytes"]["label-rbac"] > 0
    for kind in CLUSTER_KINDS:
        for row in this["edits"][kind]["rows"]:
            assert row["params_rewritten"] == 0 and row["policy_writes"] == 1, (kind, row)
        for row in previous["edits"][kind]["rows"]:
            assert row["params_rewritten"] == 10 + 5 and row["policy_writes"] == 0, (kind, row)
    assert this["per_namespace_bytes"] < previous["per_namespace_bytes"]
    # A CRD no annotation restricts: a write of the policy here, of every namespace there.
    (crd,) = this["edits"]["crd"]["rows"]
    assert crd["params_rewritten"] == 0 and crd["policy_writes"] == 1, crd
    (crd,) = previous["edits"]["crd"]["rows"]
    assert crd["params_rewritten"] == 10 + 5 and crd["policy_writes"] == 0, crd
    # A tenant's Role restricting bolts: every namespace indexes them (written again), its own
    # first, and no write of a bolt elsewhere was refused meanwhile.
    assert "role" not in previous["edits"]
    (role,) = this["edits"]["role"]["rows"]
    assert role["params_rewritten"] == 20 + 5 and role["policy_writes"] >= 1, role
    assert role["refused"] == 0 < role["probes"], role
    assert 0 < role["own_s"] <= role["seconds"] and 0 < role["own_s"] <= role["last_s"], role
    # The API server's profiles (gzipped protobuf, for go tool pprof), per layout.
    for layout in ("this", "previous"):
        for at in ("none", "compiled", "first-compile.cpu"):
            found = (profiles / f"{layout}-{at}.pprof").read_bytes()
            assert found[:2] == b"\x1f\x8b", (layout, at)
    # The upgrade: this release's compiler took over the previous layout and rewrote it.
    assert 10 < previous["compiler_peak_upgrade_mb"] < 1000
    upgraded = previous["upgraded"]
    assert upgraded["params_objects"] == 10 + 5
    assert upgraded["params_bytes"] < previous["params_bytes"]
