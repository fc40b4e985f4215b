"""Benchmark of glob matching against the regular expressions globs used to be compiled to.

Run with ``.venv/bin/python -m bench globs``. Everyday globs are compared with the
regular expression in the same run (a ratio; absolute numbers on a shared machine mean little);
near misses are timed one match each, the regular expression growing tenfold with every star.
"""

from __future__ import annotations

import argparse
import re
import time

from app.engine.glob import Glob
from bench.core.stats import rate


def regex_glob(text: str) -> re.Pattern[str]:
    """Baseline: the backtracking translation (``*`` → ``.*``) globs used to be matched with."""
    parts = (".*" if ch == "*" else "." if ch == "?" else re.escape(ch) for ch in text)
    return re.compile("".join(parts), re.DOTALL)


def glob_bench(seconds: float, most_stars: int = 7) -> None:
    """Everyday globs: cost against the regex. Near misses: one match each, the regex growing."""
    everyday = [("staging-*", "staging-eu-1"), ("*-dev-*", "team-a-dev-7"), ("v?.?", "v1.2")]
    for text, value in everyday:
        glob, regex = Glob.compile(text), regex_glob(text)
        ours = rate(lambda g=glob, v=value: g.matches(v), seconds)
        theirs = rate(lambda r=regex, v=value: r.fullmatch(v), seconds)
        print(f"{text:12} {ours:12,.0f}/s  regex {theirs:12,.0f}/s  ratio {ours / theirs:.2f}")
    value = "a" * 63
    for stars in range(3, most_stars + 1):
        text = "*a" * stars + "*b"
        glob, regex = Glob.compile(text), regex_glob(text)
        started = time.perf_counter()
        regex.fullmatch(value)
        theirs = time.perf_counter() - started
        ours = 1 / rate(lambda g=glob: g.matches(value), seconds / 3)
        print(f"{text:18} vs 63 a: {ours * 1e6:8.1f} µs  regex {theirs * 1e6:14,.0f} µs")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.5, help="per measurement")
    parser.add_argument(
        "--stars",
        type=int,
        default=7,
        help="near misses up to this many stars (the regex takes ~10x per star)",
    )
    args = parser.parse_args(argv)
    glob_bench(args.seconds, args.stars)
