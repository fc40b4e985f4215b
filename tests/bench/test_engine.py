"""A tiny run of the engine benchmark, so that it keeps working (the real one: 2,000 namespaces)."""

from __future__ import annotations

import re

from tests.bench import run_bench

NUMBER = r"(-?[\d,.]+)"


def figures(out: str, names: list[str]) -> dict[str, list[float]]:
    """The numbers of each named row of a table."""
    found = {}
    for line in out.splitlines():
        words = line.split()
        if words and words[0] in names:
            found[words[0]] = [float(w.strip("x%").replace(",", "")) for w in words[1:]
                               if re.fullmatch(NUMBER + "[x%]?", w)]  # fmt: skip
    return found


def test_a_tiny_engine_run_measures_every_review_against_its_baselines() -> None:
    result = run_bench("engine", "--namespaces", "20", "--seconds", "0.05", "--pods", "200",
                       "--nodes", "10", timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert re.search(r"snapshot: \d+ objects, \d+ roles", out)
    admission = ["tenant-allowed", "tenant-denied", "tenant-update", "admin", "deploy-tenant",
                 "deploy-admin", "pod-tenant"]  # fmt: skip
    # Both tables have an ``admin`` row: each is read on its own.
    admission_table, reads_table = out.split("read request", 1)
    rows = figures(admission_table, admission)
    assert sorted(rows) == sorted(admission)
    for name, row in rows.items():
        decide, parse, ratio, linear, speedup, _, _, whole = row
        assert decide > 0 and parse > 0 and linear > 0 and whole > 0, name
        assert abs(ratio - decide / parse) < 0.01 and speedup > 0, name
    reads = figures(reads_table, ["list-own-bucket", "list-denied", "get-by-name",
                                  "list-two-buckets", "admin"])  # fmt: skip
    assert len(reads) == 5
    for name, row in reads.items():
        decide, parse, ratio, whole, vs_admission = row
        assert decide > 0 and parse > 0 and whole > 0 and vs_admission > 0, name
        assert abs(ratio - decide / parse) < 0.01, name  # (printed rounded)
    placement = figures(out, ["pinned-pod", "pinned-deploy"])
    assert sorted(placement) == ["pinned-deploy", "pinned-pod"]
    for name, (placed, unplaced, ratio, all_rounds) in placement.items():
        assert placed > 0 and unplaced > 0 and ratio > 0 and all_rounds > 0, name
    assert re.search(r"a whole tenant AdmissionReview: [\d,]+/s in the same run", out)
    assert re.search(r"node graph: 200 pods on 10 nodes, \d+ objects reached", out)
    assert "(Allow)" in out and "(Deny)" in out
    assert re.search(r"decision logging, 4 threads into a pipe: locked StreamHandler [\d,]+/s", out)


def test_the_reverse_questions_are_measured_against_one_decision() -> None:
    result = run_bench("engine", "--reverse", "--namespaces", "20", timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    audit = re.search(r"audit: 200 configmaps in [\d.]+ s .* (\d+) orphans", result.stdout)
    # One in ten objects is labelled for no bucket.
    assert audit is not None and int(audit[1]) == 20, result.stdout
    assert re.search(r"who-can: \d+ subjects in \d+ ms", result.stdout)
