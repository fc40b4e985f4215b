"""A tiny run of the connections benchmark, so that it keeps working."""

from __future__ import annotations

import json
from pathlib import Path

from tests.bench import run_bench


def test_a_tiny_run_measures_honest_reviews_with_and_without_hostile_connections(
    tmp_path: Path,
) -> None:
    out = tmp_path / "connections.json"
    result = run_bench(
        "connections", "--objects", "300", "--hostile", "40", "--seconds", "1",
        "--rounds", "2", "--json", str(out), timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "p99 ratio" in result.stdout
    (row,) = json.loads(out.read_text())
    assert (row["model"], row["hostile"]) == ("staged:2x4:ka75", 40)
    for phase in ("none", "held"):
        assert len(row[phase]) == 2  # one of each per round, alternating
        for run in row[phase]:
            assert run["reviews"] > 0 and run["failed"] == 0
            assert run["max_ms"] >= run["p99_ms"] >= run["p50_ms"] > 0
    # Every hostile connection was open and still held by the server when the phase ended.
    assert all(run["opened"] == run["held"] == 40 for run in row["held"])
    assert row["p50_ratio"] > 0 and row["p99_ratio"] > 0
