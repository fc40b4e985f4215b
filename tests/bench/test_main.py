"""``python -m bench``: one entry point that lists every benchmark and hands each its flags."""

from __future__ import annotations

import pytest

from bench.__main__ import BENCHMARKS
from tests.bench import run_bench

# A flag of each benchmark that the README's commands use, and its default where it has one.
FLAGS = {
    "engine": ("--namespaces", "--reverse", "--logs-only"),
    "http": ("--models", "--baseline", "--churn", "--client", "--lists"),
    "scale": ("--sizes", "--watch", "--against", "--keep"),
    "churn": ("--sizes", "--rate", "--builders", "--keep"),
    "traffic": ("--hour", "--relist-max", "--workers"),
    "globs": ("--seconds", "--stars"),
    "soak": ("--minutes", "--max-requests", "--churn"),
    "vap": ("--bindings", "--connections", "--rounds", "--setups", "--policy", "--json"),
    "ha": ("--steady", "--soak-minutes"),
    "domain": ("--sizes", "--seconds"),
    "compile": ("--sizes", "--rounds", "--sample", "--profile", "--json"),
    "freshness": ("--objects", "--rate", "--seconds", "--every", "--cluster-roles", "--json"),
    "writes": ("--objects", "--writes", "--rounds", "--json"),
    "names": ("--names", "--per-rule"),
    "connections": ("--hostile", "--models", "--trickle", "--rounds", "--json"),
    "framing": ("--examples", "--seed"),
    "layout": (
        "--namespaces",
        "--cluster-grants",
        "--baseline-namespaces",
        "--baseline-ref",
        "--edits",
        "--json",
    ),
    "constants": ("--cluster-grants", "--rounds", "--json"),
}


def test_help_lists_every_benchmark_with_its_summary() -> None:
    result = run_bench("--help", timeout=60)
    assert result.returncode == 0, result.stderr
    listed = result.stdout.split("benchmarks:\n")[1].splitlines()
    summaries = dict(line.split(None, 1) for line in listed if line.startswith("  "))
    assert list(summaries) == list(BENCHMARKS) == list(FLAGS)
    assert summaries["http"].startswith("HTTP benchmark: label-rbac against a no-op")
    assert summaries["scale"].startswith("Scale benchmark: load time, memory")
    assert summaries["compile"].startswith("Compile time and parameter bytes")


@pytest.mark.parametrize("name", [pytest.param(name, id=name) for name in FLAGS])
def test_each_benchmark_shows_its_own_flags(name: str) -> None:
    result = run_bench(name, "--help", timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: python -m bench {name} ")
    for flag in FLAGS[name]:
        assert flag in result.stdout, flag


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param((), "the following arguments are required: NAME", id="no-name"),
        pytest.param(("bench_http",), "invalid choice: 'bench_http'", id="unknown-name"),
        pytest.param(("engine", "--bogus"), "unrecognized arguments: --bogus", id="bad-flag"),
    ],
)
def test_a_wrong_command_line_is_refused_with_usage(args: tuple[str, ...], message: str) -> None:
    result = run_bench(*args, timeout=60)
    assert result.returncode == 2
    assert "usage: python -m bench" in result.stderr and message in result.stderr
