"""A tiny run of the failure-domain benchmark, so that it keeps working."""

from __future__ import annotations

import re

from tests.bench import run_bench


def test_a_tiny_domain_run_reports_each_size_against_its_floor_and_the_fence() -> None:
    result = run_bench("domain", "--sizes", "100,1000", "--seconds", "0.2", timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    sizes = [
        re.fullmatch(
            r"roles +([\d,]+): (\d+) of 200 served left out; first computation +([\d,]+) µs "
            r"\(reading every role +([\d,]+) µs, ratio +([\d.]+)\); then per role change "
            r"+([\d,]+) µs",
            line,
        )
        for line in lines[:2]
    ]
    assert [m[1] for m in sizes if m] == ["100", "1,000"]
    for m in sizes:
        assert m is not None
        # configmaps, the 20 widget kinds and the 6 gadgets are restricted: 173 left out.
        ours, floor = (int(m[i].replace(",", "")) for i in (3, 4))
        assert int(m[2]) == 173 and ours > floor >= 0
    assert re.fullmatch(
        r"fence: a RoleBinding with 1,000 resources left out costs [+-]\d+% CPU over the same "
        r"review in static mode",
        lines[2],
    )
