"""Tiny runs of the benchmarks through their entry point, so that they keep working."""

from __future__ import annotations

import subprocess
import sys

from tests.support import ROOT


def run_bench(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``python -m bench ARGS`` from the repository root, as the README runs it."""
    return subprocess.run(
        [sys.executable, "-m", "bench", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
