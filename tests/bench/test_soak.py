"""A very short run of the soak script, so that it keeps working (the real run is minutes long)."""

from __future__ import annotations

from tests.bench import run_bench


def test_a_short_soak_runs_clean() -> None:
    result = run_bench(
        "soak", "--minutes", "0.1", "--interval", "2",
        "--concurrency", "2", "--workers", "1", "--churn", "10", timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    summary = [line for line in result.stdout.splitlines() if line.startswith("total:")]
    assert summary and ", errors 0," in summary[0], result.stdout
    requests = int(summary[0].split()[1])
    changes = int(summary[0].rsplit(maxsplit=1)[1])
    assert requests > 50 and changes > 10, summary
    assert "p99 first/last interval" in result.stdout
