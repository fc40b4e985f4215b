"""A tiny run of the scale benchmark, so that it keeps working (the real run loads 100k objects)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support import ROOT


def test_a_tiny_scale_run_prints_the_table_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    result = subprocess.run(
        [sys.executable, "scripts/bench_scale.py", "--sizes", "100,300", "--seconds", "0.1",
         "--json", str(out), "--keep", str(tmp_path / "dirs"), "--against", str(ROOT)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "load/parse" in result.stdout and "vs smallest" in result.stdout
    figures = json.loads(out.read_text())
    # Each size measured twice (this code and the code it is compared against), in order.
    assert [(f["size"], f["code"]) for f in figures] == [
        (100, "this"), (100, str(ROOT)), (300, "this"), (300, str(ROOT))
    ]
    for f in figures:
        # The generated layout: a Namespace, three Roles and four RoleBindings per namespace,
        # and a ClusterRole and ClusterRoleBinding per 500 objects (at least two).
        namespaces = (f["size"] - 4) // 8
        assert f["objects"] == namespaces * 8 + 4
        assert f["roles"] == namespaces * 3 + 2
        assert f["load_s"] > 0 and f["parse_s"] > 0
        assert f["rss_after_mb"] >= f["rss_before_mb"] > 0
        assert f["allowed_per_s"] > 0 and f["denied_per_s"] > 0
