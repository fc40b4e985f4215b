"""``python -m bench names``: a tiny run through the entry point."""

from __future__ import annotations

from tests.bench import run_bench


def test_a_tiny_run_prints_one_line_per_size_with_its_work() -> None:
    result = run_bench("names", "--names", "200,800", "--per-rule", "10", timeout=120)
    assert result.returncode == 0, result.stderr
    header, *rows = result.stdout.splitlines()
    assert header.split()[:5] == ["names", "rules", "ms", "bytes", "work"]
    assert [row.split()[:2] for row in rows] == [["200", "20"], ["800", "80"]]
    assert all(int(row.split()[4]) > 0 for row in rows)
