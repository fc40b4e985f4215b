"""A tiny run of the compile benchmark, so that it keeps working (the real run goes to 100k)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.bench import run_bench


def test_a_tiny_compile_run_prints_every_size_and_change(tmp_path: Path) -> None:
    out = tmp_path / "compile.json"
    result = run_bench(
        "compile", "--sizes", "100,300", "--rounds", "1", "--sample", "20",
        "--json", str(out), "--profile", timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "function calls" in result.stdout  # the profile of the largest size
    small, large = json.loads(out.read_text())
    # The layout: namespaces of eight objects, two ClusterRoles and their bindings.
    assert (small["objects"], small["namespaces"], small["rendered"]) == (100, 12, 12)
    assert (large["objects"], large["namespaces"]) == (300, 37)
    assert large["rendered"] < large["namespaces"]  # sampled, and scaled to every namespace
    for f in (small, large):
        assert f["full_render_s"] > 0 and f["params_max_bytes"] >= f["params_mean_bytes"] > 0
        assert f["params_total_bytes"] >= f["params_mean_bytes"] * f["namespaces"] * 0.9
        assert f["delegated"] == 0
        changes = f["incremental"]
        # A namespace's Role or RoleBinding renders that namespace again; a ClusterRole bound
        # cluster-wide renders the cluster part (stored once, in the policy) and the namespaces
        # binding it by RoleBindings, not every namespace.
        assert changes["role annotation"]["namespaces"] == 1
        assert changes["new rolebinding"]["namespaces"] == 1
        assert not changes["role annotation"]["cluster_part"]
        assert changes["clusterrole annotation"]["cluster_part"]
        assert changes["clusterrole annotation"]["namespaces"] < f["namespaces"]
        assert all(change["seconds"] > 0 for change in changes.values())
