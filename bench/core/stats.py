"""Rates, the same-run baseline and the figures drawn from rounds: ratios, medians, percentiles.

Absolute numbers on a shared machine mean little, so every benchmark reports a figure next to
a baseline measured in the same run: either in alternating rounds (``cost``; the HTTP and churn
benchmarks alternate whole servers or phases) or moments apart (``rate`` of each).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any


def rate(fn: Callable[[], object], seconds: float) -> float:
    """Calls per second of ``fn`` over about ``seconds`` (best of three rounds)."""
    best = 0.0
    for _ in range(3):
        calls, start = 0, time.perf_counter()
        deadline = start + seconds / 3
        while True:
            for _ in range(200):
                fn()
            calls += 200
            now = time.perf_counter()
            if now >= deadline:
                break
        best = max(best, calls / (now - start))
    return best


def cpu_rate(fn: Callable[[], object], seconds: float, tries: int = 3) -> float:
    """Calls per CPU second of ``fn``, best of ``tries`` rounds of ``seconds / tries``."""
    best = 0.0
    for _ in range(tries):
        calls, start = 0, time.process_time()
        while True:
            for _ in range(100):
                fn()
            calls += 100
            now = time.process_time()
            if now - start >= seconds / tries:
                break
        best = max(best, calls / (now - start))
    return best


def cost(fn: Callable[[], object], baseline: Callable[[], object], seconds: float) -> float:
    """Extra CPU time ``fn`` takes over ``baseline`` (0.1 = 10% more).

    The two run in alternating short rounds (ABBA, so neither always runs first), timed by this
    process's CPU clock: a machine shared with other work slows both alike instead of whichever
    ran while it was busy.
    """
    spent = {fn: 0.0, baseline: 0.0}
    deadline = time.perf_counter() + seconds
    rounds = 0
    while time.perf_counter() < deadline or rounds < 4:
        order = (fn, baseline) if rounds % 2 == 0 else (baseline, fn)
        for f in order:
            start = time.process_time()
            for _ in range(200):
                f()
            spent[f] += time.process_time() - start
        rounds += 1
    return spent[fn] / spent[baseline] - 1


def percentile(values: Iterable[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank below), NaN when there are none."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def med(runs: Sequence[Mapping[str, float]], key: str) -> float:
    """The median of one figure over a server's (or a phase's) rounds."""
    return statistics.median(r[key] for r in runs)


def median_ratio(pairs: Iterable[tuple[Mapping[str, Any], Mapping[str, Any]]], key: str) -> float:
    """Per round, the second figure over the first (baseline); the median of the rounds."""
    return statistics.median(measured[key] / baseline[key] for baseline, measured in pairs)
