"""A tiny run of the scale benchmark, so that it keeps working (the real run loads 100k objects)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.bench import run_bench
from tests.support import ROOT


def test_a_tiny_scale_run_prints_the_tables_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    result = run_bench(
        "scale", "--sizes", "100,300", "--seconds", "0.1",
        "--json", str(out), "--keep", str(tmp_path / "dirs"), "--against", str(ROOT),
        "--watch", "--rounds", "3", timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    for heading in ("load/parse", "vs smallest", "watch/dir", "alternating rounds"):
        assert heading in result.stdout
    figures = json.loads(out.read_text())
    # Each size loaded from its directory twice (this code and the code it is compared against),
    # then from the same objects as JSON files, in order, and synced once from the API server.
    assert [(f["size"], f["code"]) for f in figures["dir"]] == [
        (100, "this"), (100, str(ROOT)), (100, "json"),
        (300, "this"), (300, str(ROOT)), (300, "json"),
    ]  # fmt: skip
    assert [f["size"] for f in figures["watch"]] == [100, 300]
    for f in figures["dir"] + figures["watch"]:
        # The generated layout: a Namespace, three Roles and four RoleBindings per namespace,
        # and a ClusterRole and ClusterRoleBinding per 500 objects (at least two).
        namespaces = (f["size"] - 4) // 8
        assert f["objects"] == namespaces * 8 + 4
        assert f["roles"] == namespaces * 3 + 2
        assert f["rss_after_mb"] >= f["rss_before_mb"] > 0
        assert f["allowed_per_s"] > 0 and f["denied_per_s"] > 0
    for f in figures["dir"]:
        assert f["load_s"] > 0 and f["parse_s"] > 0
    for f in figures["watch"]:
        assert f["sync_wall_s"] > 0 and f["server_s"] > 0
    # Flatness: every size against the smallest, measured in one process.
    smallest, larger = figures["flat"]
    assert (smallest["size"], larger["size"]) == (100, 300)
    assert smallest["allowed_vs_smallest"] == smallest["denied_vs_smallest"] == 1
    assert larger["allowed_vs_smallest"] > 0 and larger["denied_vs_smallest"] > 0
