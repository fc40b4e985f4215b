"""A tiny run of the HTTP benchmark, so that it keeps working (the real one: wrk, 8k objects)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support import ROOT


def test_a_tiny_http_run_compares_both_servers_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "http.json"
    result = subprocess.run(
        [sys.executable, "scripts/bench_http.py", "--objects", "300", "--seconds", "1",
         "--rounds", "2", "--models", "gthread:2x2,sync:1x1:ka0", "--client", "python",
         "--connections", "2", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "throughput ratio" in result.stdout and "CPU/request ratio" in result.stdout
    rows = json.loads(out.read_text())
    assert [(r["model"], r["path"]) for r in rows] == [
        ("gthread:2x2:ka75", "/validate"), ("gthread:2x2:ka75", "/authorize"),
        ("sync:1x1:ka0", "/validate"), ("sync:1x1:ka0", "/authorize"),
    ]  # fmt: skip
    for row in rows:
        for server in ("noop", "label_rbac"):
            assert len(row[server]) == 2  # alternating rounds, each server measured each round
            for run in row[server]:
                assert run["rps"] > 0 and run["p99_ms"] >= run["p50_ms"] > 0
                assert run["non_2xx"] == 0 and run["cpu_ms_per_request"] > 0
        assert row["throughput_ratio"] > 0 and row["p99_ratio"] > 0 and row["cpu_ratio"] > 0


def test_a_bad_serving_model_is_refused_in_one_line() -> None:
    result = subprocess.run(
        [sys.executable, "scripts/bench_http.py", "--models", "tornado:2x2"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert "expected CLASS:WORKERSxTHREADS" in result.stderr
