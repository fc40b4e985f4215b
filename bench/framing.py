"""Framing fuzz: request streams against the real server, h11 as the reference parser.

Run with ``.venv/bin/python -m bench framing --examples 5000``.

The long run of tests/webhook/test_framing_fuzz.py: ``python -m app serve`` in its shipped model
(2 workers x 4 threads) over ``manifests/examples``, and ``--examples`` fresh random streams
from ``tests.webhook.framing.streams`` (pipelined reviews framed well and badly: chunk sizes with
signs, prefixes, whitespace, extensions and huge values, every Transfer-Encoding list and
repetition, Content-Length with Transfer-Encoding, obsolete line folding), each on a new HTTPS
connection and checked by ``tests.webhook.framing.check``. hypothesis stops at the first stream
the server answers otherwise than h11 parses it and prints it, shrunk. Reported: examples run,
how the reference ended them, seconds, the workers' restarts and their CPU over an idle second
afterwards.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections import Counter
from pathlib import Path

from hypothesis import HealthCheck, given, seed, settings

from tests.process import serve
from tests.webhook.framing import check, expect, streams
from tests.webhook.test_connections import address
from tests.webhook.test_framing import cpu_seconds, workers


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=2000, help="random streams to try")
    parser.add_argument("--seed", type=int, help="repeat a run (default: fresh randomness)")
    args = parser.parse_args(argv)
    outcomes: Counter[str] = Counter()
    with tempfile.TemporaryDirectory() as tmp, serve(Path(tmp), "--rbac-dir",
                                                     "manifests/examples") as server:  # fmt: skip
        before = workers(server)
        context = server.context()

        @settings(max_examples=args.examples, database=None, deadline=None, derandomize=False,
                  suppress_health_check=list(HealthCheck))  # fmt: skip
        @given(streams())
        def frames_as_h11(stream: bytes) -> None:
            expected = expect(stream)
            outcomes[f"{len(expected.requests)} whole, then {expected.end}"] += 1
            check(address(server), context, stream)

        if args.seed is not None:
            frames_as_h11 = seed(args.seed)(frames_as_h11)
        started = time.monotonic()
        frames_as_h11()
        took = time.monotonic() - started
        after = workers(server)
        used = cpu_seconds(after)
        time.sleep(1.0)
        idle = cpu_seconds(after) - used
    print(
        f"{sum(outcomes.values()):,} streams in {took:.0f} s, every one answered as h11 parses it"
    )
    for outcome, count in sorted(outcomes.items()):
        print(f"  {count:6,}  {outcome}")
    print(f"worker restarts: {len(after - before)}; workers' CPU over an idle second: {idle:.2f} s")
    return 0 if after == before else 1
