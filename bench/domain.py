"""Failure-domain benchmark: the compiler's coverage per role change, the fence per RBAC write.

Run with ``.venv/bin/python -m bench domain``. At each size, roles repeat a hundredth as many
distinct annotations (tenants' roles are copies), and 200 namespaced resources are served. The
coverage (``app.engine.coverage.unjudged``) is timed the first time, over every role, against
reading every role's annotation once, the least any computation over the roles costs (a ratio,
same run); then after one role's change, as the compiler computes it for each batch of the watch
that changes roles (the snapshot's restrictions updated by that change alone). The fence is the
admission pipeline's extra CPU time for a RoleBinding when 1,000 resources are left out, against
the same review with no registration (static mode).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable

from app.engine.context import Context, Registration
from app.engine.coverage import unjudged
from app.engine.decide import evaluate
from app.engine.model import Resource
from app.engine.rbac import Restrictions, RoleChange, RoleRef, Snapshot
from app.webhook.wire import parse_review
from bench.core.stats import cost
from tests.support import binding, make_review, role, rule, snapshot


def roles(count: int) -> Snapshot:
    """``count`` roles over ``count // 100`` distinct annotations: two literal patterns, a glob."""
    kinds = max(1, count // 100)
    return snapshot(
        *(
            role(
                f"r{i}",
                f"t{i % 1000}",
                [rule("*", "configmaps"), rule("*", f"w{i % 20}", "example.com")],
                {
                    "configmaps": {"team": [f"a{i % kinds}"]},
                    f"w{i % 20}.example.com": {"team": ["x"]},
                    "gadget*": {"team": ["y"]},
                },
            )
            for i in range(count)
        )
    )


SERVED = [
    *(Resource("example.com", f"w{i}") for i in range(190)),
    *(Resource("", name) for name in ("configmaps", "secrets", "services", "endpoints")),
    *(Resource("example.com", f"gadget{i}") for i in range(6)),
]


def timed(fn: Callable[[], object]) -> float:
    """Median wall time of five calls, in microseconds."""
    runs = []
    for _ in range(5):
        started = time.perf_counter()
        fn()
        runs.append((time.perf_counter() - started) * 1e6)
    return statistics.median(runs)


def after(known: Restrictions, change: RoleChange) -> tuple[str, ...]:
    """The coverage once ``change`` is applied to ``known``."""
    return unjudged(known.changed([change]), SERVED)


def coverage_bench(sizes: list[int]) -> None:
    for size in sizes:
        state = roles(size)
        found = unjudged(state.restrictions(), SERVED)
        first = timed(lambda s=state: unjudged(Restrictions.of(s.roles.values()), SERVED))
        floor = timed(lambda s=state: [r.permissions for r in s.roles.values()])
        # One role's annotation edited to one no other role has, as a role-changing batch of
        # the watch leaves the snapshot's restrictions (``Snapshot.restrictions_after``).
        old = state.roles[RoleRef("t0", "r0")]
        edited = role("r0", "t0", [rule("*", "configmaps")], {"configmaps": {"team": ["new"]}})
        new = snapshot(edited).roles[RoleRef("t0", "r0")]
        change = timed(functools.partial(after, state.restrictions(), (old, new)))
        print(
            f"roles {size:>9,}: {len(found)} of {len(SERVED)} served left out; first "
            f"computation {first:10,.0f} µs (reading every role {floor:10,.0f} µs, ratio "
            f"{first / floor:5.1f}); then per role change {change:7,.0f} µs"
        )


def fence_bench(seconds: float) -> None:
    tenant = role(
        "tenant", "t1", [rule("*", "configmaps widgets", "example.com")], {"widgets": {"t": ["a"]}}
    )
    state = snapshot(tenant)
    _, body = binding("b", "tenant", "User:bob", namespace="t1")
    review = make_review(
        "admin", "CREATE", "rolebindings.rbac.authorization.k8s.io", namespace="t1", name="b",
        kind="RoleBinding",
    )  # fmt: skip
    review["request"]["object"] = {**body, "apiVersion": "rbac.authorization.k8s.io/v1"}
    request = parse_review(review).request
    left_out = frozenset(f"r{i}.example.org" for i in range(1000))
    fenced = Context(state, registration=Registration(left_out, frozenset({tenant_ref()})))
    static = Context(state)
    extra = cost(lambda: evaluate(request, fenced), lambda: evaluate(request, static), seconds)
    print(
        f"fence: a RoleBinding with 1,000 resources left out costs {extra * 100:+.0f}% CPU over "
        "the same review in static mode"
    )


def tenant_ref() -> RoleRef:
    return RoleRef("t1", "tenant")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000", help="role counts, comma-separated")
    parser.add_argument("--seconds", type=float, default=2.0, help="for the fence's measurement")
    args = parser.parse_args(argv)
    coverage_bench([int(size) for size in args.sizes.split(",")])
    fence_bench(args.seconds)
