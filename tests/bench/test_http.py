"""A tiny run of the HTTP benchmark, so that it keeps working (the real one: wrk, 8k objects)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.bench import run_bench


def test_a_tiny_http_run_compares_both_servers_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "http.json"
    result = run_bench(
        "http", "--objects", "300", "--seconds", "1",
        "--rounds", "2", "--models", "gthread:2x2,sync:1x1:ka0", "--client", "python",
        "--connections", "2", "--json", str(out), timeout=300,
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
    result = run_bench(
        "http", "--models", "tornado:2x2", timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert "expected CLASS:WORKERSxTHREADS" in result.stderr


def test_a_tiny_churn_run_enforces_every_change_on_every_worker(tmp_path: Path) -> None:
    out = tmp_path / "churn.json"
    result = run_bench(
        "http", "--churn", "--objects", "300", "--seconds", "1",
        "--rounds", "2", "--rate", "50", "--client", "python", "--connections", "2",
        "--json", str(out), timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "p99 ratio" in result.stdout and "enforced p50 ms" in result.stdout
    (row,) = json.loads(out.read_text())
    # The default serving model, both of its workers synced from the loopback API server.
    assert (row["objects"], row["model"], row["workers"]) == (300, "staged:2x4:ka75", 2)
    for phase in ("quiet", "churn"):
        assert len(row[phase]) == 2  # one of each per round
        for run in row[phase]:
            assert run["rps"] > 0 and run["p99_ms"] >= run["p50_ms"] > 0
            assert run["non_2xx"] == 0 and run["cpu_ms_per_request"] > 0
    assert row["throughput_ratio"] > 0 and row["p99_ratio"] > 0 and row["cpu_ratio"] > 0
    # Two seconds of churn at 50 changes/s, every change shown by every worker over HTTPS.
    assert row["changes"] == row["enforced"] == 100 and row["missed"] == {}
    enforced = [row[f"enforced_{q}_ms"] for q in ("p50", "p99", "max")]
    assert 0 < enforced[0] <= enforced[1] <= enforced[2] < 15_000
