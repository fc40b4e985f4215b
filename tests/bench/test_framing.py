"""A tiny run of the framing fuzz benchmark, so that it keeps working."""

from __future__ import annotations

from tests.bench import run_bench


def test_a_tiny_run_fuzzes_the_real_server_against_the_reference_parser() -> None:
    result = run_bench("framing", "--examples", "30", "--seed", "1", timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "30 streams in" in result.stdout
    assert "worker restarts: 0" in result.stdout
