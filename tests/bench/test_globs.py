"""A tiny run of the glob benchmark, so that it keeps working (the real one: up to seven stars)."""

from __future__ import annotations

import re

from tests.bench import run_bench


def test_a_tiny_glob_run_compares_with_the_regex_and_shows_it_blow_up() -> None:
    result = run_bench("globs", "--seconds", "0.1", "--stars", "4", timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    # Everyday globs: both rates in the same run, and their ratio.
    everyday = [re.fullmatch(r"(\S+) +([\d,]+)/s  regex +([\d,]+)/s  ratio ([\d.]+)", ln)
                for ln in lines[:3]]  # fmt: skip
    assert [m[1] for m in everyday if m] == ["staging-*", "*-dev-*", "v?.?"]
    for m in everyday:
        assert m is not None
        ours, theirs = (int(m[i].replace(",", "")) for i in (2, 3))
        assert ours > 0 and theirs > 0 and float(m[4]) > 0
    # Near misses, three and four stars: the regex backtracks, the glob does not.
    misses = [re.fullmatch(r"(\S+) +vs 63 a: +([\d.]+) µs  regex +([\d,]+) µs", ln)
              for ln in lines[3:]]  # fmt: skip
    assert [m[1] for m in misses if m] == ["*a*a*a*b", "*a*a*a*a*b"]
    for m in misses:
        assert m is not None and float(m[2]) * 100 < int(m[3].replace(",", ""))
