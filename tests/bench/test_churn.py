"""A tiny run of the churn benchmark, so that it keeps working (the real run: 10k and 100k)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.bench import run_bench


def test_a_tiny_churn_run_enforces_every_change_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "churn.json"
    result = run_bench(
        "churn", "--sizes", "300", "--seconds", "1",
        "--rate", "50", "--json", str(out), timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "whole/incr" in result.stdout and "decide p99 quiet" in result.stdout
    incremental, whole, frozen = json.loads(out.read_text())
    # The incremental builder, the baseline that rebuilds the whole snapshot per batch, and the
    # floor that does not update it at all.
    assert [f["mode"] for f in (incremental, whole, frozen)] == ["incremental", "whole", "frozen"]
    assert frozen["enforced"] == 0 and frozen["decide_churn_p99_us"] > 0
    namespaces = (300 - 4) // 8
    for figures in (incremental, whole):
        # The generated objects (the second source also sees the first's added bindings).
        assert figures["objects"] >= namespaces * 8 + 4
        assert figures["changes"] == 50
        enforced = [figures[f"enforced_{q}_ms"] for q in ("p50", "p99", "max")]
        assert 0 < enforced[0] <= enforced[1] <= enforced[2]
        assert figures["decide_quiet_p99_us"] > 0 and figures["decide_churn_p99_us"] > 0
        assert figures["builder_cpu_per_change_ms"] > 0 and figures["whole_rebuild_cpu_ms"] > 0
    # One second at 50 changes/s: every change made on the server shows in a decision. (A whole
    # rebuild may fold a binding's creation and deletion into one snapshot: neither shows.)
    assert incremental["enforced"] == 50 and incremental["missed"] == {}
    assert set(whole["missed"]) <= {"add", "delete"}
