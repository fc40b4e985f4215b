"""A tiny run of the constants benchmark through a real kube-apiserver, to keep it working."""

from __future__ import annotations

import json
from pathlib import Path

from bench.constants import LISTS, constant, with_empty_lists
from tests.bench import run_bench
from tests.kube.conftest import require_control_plane


def test_the_shipped_constant_leaves_empty_lists_out_and_the_old_encoding_puts_them_back() -> None:
    shipped = constant(3)
    assert '":[]' not in shipped
    old = with_empty_lists(shipped)
    # Each of the three grants has two requirements, each with all four lists.
    assert all(old.count(f'"{name}":') == 3 * 2 for name in LISTS)


def test_a_tiny_constants_run_creates_each_encoding(tmp_path: Path) -> None:
    require_control_plane()
    out = tmp_path / "constants.json"
    result = run_bench("constants", "--cluster-grants", "3", "--rounds", "1", "--json", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    rows = json.loads(out.read_text())
    assert [r["encoding"] for r in rows] == [
        "shipped",
        "empty lists",
        "one string",
        "policy",
        "policy, no part",
    ]
    assert all(len(r["seconds"]) == 1 and r["median_s"] > 0 for r in rows)
    assert rows[0]["code_points"] < rows[1]["code_points"]
    # The whole policy holds its constant (twice: a match condition copies it) and more.
    assert rows[4]["code_points"] + 2 * rows[0]["code_points"] <= rows[3]["code_points"]
