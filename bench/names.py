"""Rendering one namespace whose Role lists many resourceNames: time, units of work, per name.

A Role granting ``get update delete`` on configmaps and secrets by name, restricted by labels, is
bound in namespace ``t1``; 22 resources are served. For each size the namespace is rendered with
``app.engine.params.render`` (no work budget, no size limit) and the time, the parameters'
bytes and the units of ``Work`` it took are printed, with the time per name and per unit: linear
rendering keeps both flat as the names grow, against the smallest size of the same run.
``--per-rule`` spreads the names over rules of that many names (0: one rule listing them all).

    python -m bench names --names 1000,4000,16000,64000 --per-rule 100
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

from app.engine.context import Options
from app.engine.model import Resource
from app.engine.params import Rendered, Target, render
from app.engine.rbac import Snapshot
from tests.support import binding, role, snapshot

SERVED = (
    Resource("", "configmaps"),
    Resource("", "secrets"),
    *(Resource("example.com", f"widgets{i}") for i in range(20)),
)


def layout(names: int, per_rule: int) -> Snapshot:
    """``names`` names over rules of ``per_rule`` names each (all in one rule when 0)."""
    per_rule = per_rule or names
    rules = [
        {
            "verbs": ["get", "update", "delete"],
            "apiGroups": [""],
            "resources": ["configmaps", "secrets"],
            "resourceNames": [f"n{start}-{i}" for i in range(start, min(names, start + per_rule))],
        }
        for start in range(0, names, per_rule)
    ]
    named = role("named", "t1", rules, {"configmaps": {"team": ["a"]}})
    return snapshot(named, binding("n", "named", "User:alice", namespace="t1"))


def measure(names: int, per_rule: int) -> tuple[float, Rendered]:
    state = layout(names, per_rule)
    target = Target.of(SERVED, Options(), max_bytes=10**12, max_work=10**15)
    started = time.perf_counter()
    rendered = render(state, "t1", target)
    return time.perf_counter() - started, rendered


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--names", default="1000,4000,16000,64000", help="sizes, comma-separated")
    parser.add_argument(
        "--per-rule", type=int, default=100, help="names per rule (0: one rule with them all)"
    )
    args = parser.parse_args(argv)
    sizes = [int(n) for n in args.names.split(",")]
    print(f"{'names':>8} {'rules':>6} {'ms':>9} {'bytes':>9} {'work':>9} {'µs/name':>8} "
          f"{'µs/unit':>8} {'vs first':>9}")  # fmt: skip
    first = 0.0
    for names in sizes:
        seconds, rendered = measure(names, args.per_rule)
        per_name = seconds / names * 1e6
        first = first or per_name
        rules = -(-names // (args.per_rule or names))
        print(
            f"{names:>8} {rules:>6} {seconds * 1000:>9.1f} {rendered.size:>9} "
            f"{rendered.work:>9} {per_name:>8.2f} {seconds / rendered.work * 1e6:>8.3f} "
            f"{per_name / first:>8.2f}x"
        )
    return 0
