"""A tiny run of the freshness benchmark through a real kube-apiserver, to keep it working."""

from __future__ import annotations

import json
from pathlib import Path

from tests.bench import run_bench
from tests.kube.conftest import require_control_plane


def test_a_tiny_freshness_run_measures_both_changes_for_the_policy_and_the_webhook(
    tmp_path: Path,
) -> None:
    require_control_plane()
    out = tmp_path / "freshness.json"
    result = run_bench(
        "freshness", "--objects", "120", "--rate", "5", "--seconds", "3", "--every", "1",
        "--json", str(out), timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    figures = json.loads(out.read_text())
    # The layout: namespaces of eight objects and the cluster-wide roles and bindings kept.
    assert figures["objects"] == 14 * 8 + 2 * 2
    assert figures["load_s"] > 0 and figures["compiled_s"] > 0 and figures["changes"] == 15
    assert figures["compiler_peak_mb"] > 10  # a Python process with its RBAC cache
    assert figures["failures"] == []
    rows = {(row["kind"], row["setup"]): row for row in figures["rows"]}
    assert set(rows) == {(k, s) for k in ("bound", "narrowed") for s in ("compiled", "webhook")}
    for row in rows.values():
        assert row["count"] >= 1 and 0 < row["p50_ms"] <= row["p99_ms"] <= row["max_ms"]
    # Where the compiled policy's time went, from the API server's audit log.
    assert set(figures["compiled_hops"]) == {"to_write", "write", "after_write"}
