"""A tiny run of the writes benchmark through a real kube-apiserver, to keep it working."""

from __future__ import annotations

import json
from pathlib import Path

from tests.bench import run_bench
from tests.kube.conftest import require_control_plane


def test_a_tiny_writes_run_measures_each_shape_against_the_namespace_mark(
    tmp_path: Path,
) -> None:
    require_control_plane()
    out = tmp_path / "writes.json"
    result = run_bench(
        "writes", "--objects", "200", "--writes", "16", "--rounds", "1", "--json", str(out),
        timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    rows = json.loads(out.read_text())
    assert [row["shape"] for row in rows] == ["together", "replaced", "apart", "created", "posted"]
    for row in rows:
        assert row["apiserver_ms"] > 0 and row["mark_apiserver_ms"] > 0 and row["per_s"] > 0
