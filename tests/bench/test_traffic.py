"""A tiny run of the API-traffic benchmark, so that it keeps working (the real run: 100k)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.bench import run_bench


def test_a_tiny_traffic_run_counts_lists_and_watches(tmp_path: Path) -> None:
    out = tmp_path / "traffic.json"
    result = run_bench(
        "traffic", "--sizes", "200", "--hour", "6",
        "--workers", "2", "--json", str(out), timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "MB/h/worker" in result.stdout
    rows = {(r["mode"], r["method"]): r for r in json.loads(out.read_text())}
    assert set(rows) == {("watch", "measured"), ("relist", "measured"), ("relist", "derived")}
    watch, relist = rows["watch", "measured"], rows["relist", "measured"]
    for row in (watch, relist):
        # Each of the two workers listed each of the six kinds once to start.
        assert row["start"]["lists"] >= 12 and row["start"]["objects_listed"] >= 2 * row["objects"]
        # Watches were renewed at their (compressed) timeout: several per kind and worker.
        assert row["hour"]["watches"] >= 2 * 6 * 2
        assert row["hour"]["bookmarks"] > 0
    # Watching lists nothing more once synced; re-listing lists every kind again and again.
    assert watch["hour"]["lists"] == 0 and watch["hour"]["list_bytes"] == 0
    assert relist["hour"]["lists"] >= 2 * 6 * 3
    assert relist["hour"]["objects_listed"] >= 3 * relist["start"]["objects_listed"]
    assert relist["hour"]["list_bytes"] >= 3 * relist["start"]["list_bytes"]
