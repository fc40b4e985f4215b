"""Churn benchmark: RBAC changes at a steady rate, through the watch, into a live ClusterSource.

Run with ``.venv/bin/python -m bench churn`` (sizes as for the scale benchmark,
``--sizes 100000``; ``--rate`` changes per second, default 50; ``--seconds`` per phase). The RBAC
objects are the generated layout of the scale benchmark, served by the loopback API server of
the tests (``tests/kubeapi.py``) in a process of its own (as the API server is), which also makes
the changes (``bench.core.apiserver``): per ten, three Role annotation edits, three RoleBinding
subject edits (one in ten seconds of them a ClusterRole annotation edit instead), two
RoleBindings created and one of them deleted again. This process runs a real ``ClusterSource``
synced from that server, and measures:

- enforced: from the moment the server makes a change to the moment a decision (``evaluate``, or
  for a deletion the user's bindings) taken on the source's current snapshot reflects it —
  p50, p99 and max over every change;
- decisions: the latency of ``evaluate`` on a thread deciding without pause, as the request path
  does, while the changes stream in against the same thread with no changes, in four alternating
  rounds of each (so that what else the machine does falls on both alike); the ratio is churn
  p99 over quiet p99;
- the same with the previous builder (``whole``: the whole snapshot built again after every
  batch of changes) and with none (``frozen``: the informers follow the changes, the snapshot
  stays as first built), each with changes of its own against the same server: the first is the
  baseline, the second the floor that reading and compiling the watch events alone sets;
- CPU per change: the CPU time of the snapshot builder thread over the changes it applied,
  against the CPU time of one whole rebuild (``build_snapshot`` from every informer's objects),
  which is what every change cost before snapshots were updated incrementally; and, for scale,
  the CPU time the informer threads spent per change (reading and compiling the watch events,
  the same whichever way the snapshot follows).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import tempfile
import threading
import time
from array import array
from collections.abc import Callable
from dataclasses import replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from app.engine.context import Context, Options
from app.engine.decide import evaluate
from app.engine.kinds import KINDS, build_snapshot
from app.engine.model import Request, UserInfo
from app.engine.rbac import Compiler, Snapshot
from app.source.api import KubeClient
from app.source.cluster import ClusterSource
from app.source.informer import Tuning
from app.webhook.wire import parse_review
from bench.core.apiserver import Step, serve, steps, write_lists
from bench.core.layout import ANNOTATION, layout
from bench.core.processes import child_env, module_command, thread_cpu
from bench.core.stats import percentile
from tests.support import make_review

PROBE_EVERY = 0.002  # how often the prober looks for a new snapshot (both phases)
ENFORCE_WAIT = 15.0  # after the last change of a round, how long changes may take to show
ROUNDS = 4  # quiet and churning stretches alternate this many times


def probe(step: Step, options: Options) -> Callable[[Snapshot], bool]:
    """True once a decision on the snapshot reflects ``step`` (False before it)."""
    if step.action == "delete":
        gone = UserInfo(f"new-{step.k - 12}")
        return lambda snap: not any(True for _ in snap.roles_for(gone, step.namespace))
    i = step.namespace.removeprefix("tenant-")
    user, namespace, labels = {
        "role": (f"user-{i}-3", step.namespace, {"team": f"c{step.k}"}),
        "subjects": (f"churn-{step.k}", step.namespace, {"team": "a"}),
        "add": (f"new-{step.k}", step.namespace, {"team": "a"}),
        "clusterrole": (f"operator-{step.cluster_role}", "tenant-0", {"env": f"p{step.k}"}),
    }[step.action]
    request = review_request(user, namespace, labels)
    if step.action in ("subjects", "add"):
        # Bound at all (a user bound to nothing is RBAC's to refuse), and allowed.
        who = request.user
        return lambda snap: (
            any(True for _ in snap.roles_for(who, namespace))
            and evaluate(request, Context(snap, options)).allowed
        )
    return lambda snap: evaluate(request, Context(snap, options)).allowed


def review_request(user: str, namespace: str, labels: dict[str, str]) -> Request:
    review = make_review(user, "CREATE", "configmaps", namespace=namespace, labels=labels)
    return parse_review(review).request


# This process: the source, a deciding thread, a prober.


class Decider(threading.Thread):
    """Decides without pause on the source's current snapshot; keeps each latency."""

    def __init__(self, source: ClusterSource, requests: list[Request], options: Options) -> None:
        super().__init__(name="decider", daemon=True)
        self.source, self.requests, self.options = source, requests, options
        self.latencies = array("d")
        self.stop = threading.Event()

    def run(self) -> None:
        clock, out, requests = time.perf_counter, self.latencies, self.requests
        while not self.stop.is_set():
            for request in requests:
                started = clock()
                snapshot = self.source.snapshot()
                assert snapshot is not None
                evaluate(request, Context(snapshot, self.options))
                out.append(clock() - started)


class Prober(threading.Thread):
    """Looks at each new snapshot for the changes made by now and not seen yet; notes when each
    showed. Only changes already due are looked for (the server makes them on a schedule), so
    probing costs a few decisions per snapshot, not one per change of the run."""

    def __init__(self, source: ClusterSource, plan: list[Step], options: Options) -> None:
        super().__init__(name="prober", daemon=True)
        self.source, self.plan, self.options = source, plan, options
        self.pending: dict[int, Callable[[Snapshot], bool]] = {}
        self.seen: dict[int, float] = {}
        self.rate = 0.0
        self.started = 0.0
        self.first, self.last = 0, 0
        self.stop = threading.Event()

    def churn(self, rate: float, first: int, last: int) -> None:
        """The server starts making ``plan[first:last]`` now."""
        self.started, self.rate, self.first, self.last = time.monotonic(), rate, first, last

    def run(self) -> None:
        last, armed = None, 0
        while not self.stop.wait(PROBE_EVERY):
            if self.rate:
                # Due by now, with a margin for the server's schedule starting a little later.
                elapsed = time.monotonic() - self.started
                due = min(self.last, self.first + int(elapsed * self.rate) + 5)
                for n in range(armed, due):
                    self.pending[n] = probe(self.plan[n], self.options)
                armed = max(armed, due)
            snapshot = self.source.snapshot()
            if snapshot is None or (snapshot is last and not self.pending):
                continue
            last, now = snapshot, time.monotonic()
            for n, check in list(self.pending.items()):
                # A deletion shows only once the binding it deletes has shown.
                if self.plan[n].action == "delete" and self.plan[n].deletes not in self.seen:
                    continue
                if check(snapshot):
                    self.seen[n] = now
                    del self.pending[n]

    def missed(self) -> dict[str, int]:
        found: dict[str, int] = {}
        for n, step in enumerate(self.plan):
            if n not in self.seen:
                found[step.action] = found.get(step.action, 0) + 1
        return found


def decide_for(seconds: float, source: ClusterSource, requests: list[Request],
               options: Options) -> array:  # fmt: skip
    decider = Decider(source, requests, options)
    decider.start()
    time.sleep(seconds)
    decider.stop.set()
    decider.join()
    return decider.latencies


class WholeRebuildSource(ClusterSource):
    """The baseline: the previous builder, which built the whole snapshot after every batch."""

    def _build(self) -> Snapshot:
        self._changes.clear()  # (reported changes are not needed: everything is read again)
        return build_snapshot({spec.kind: _informer(self, spec.kind).values() for spec in KINDS})


class FrozenSource(ClusterSource):
    """The floor: informers follow the changes, but the snapshot stays the first one. What the
    request path loses to reading and compiling watch events alone, whatever the builder."""

    def _build(self) -> Snapshot:
        if self._snapshot is None:
            return super()._build()
        self._changes.clear()
        return self._snapshot


def _informer(source: ClusterSource, kind: str) -> Any:
    return next(i for i in source.informers if i.kind == kind)


MODES: dict[str, type[ClusterSource]] = {
    "incremental": ClusterSource,
    "whole": WholeRebuildSource,
    "frozen": FrozenSource,
}


def measure(
    lists: Path, objects: int, seconds: float, rate: float, modes: list[str]
) -> list[dict[str, Any]]:
    """Against a server of ``objects`` objects, for each mode: sync a source, then rounds of quiet
    and churn (each mode with changes of its own)."""
    compiler = Compiler((ANNOTATION,))
    options = Options(compiler=compiler)
    namespaces, _ = layout(objects)
    mid = namespaces // 2
    requests = [review_request(f"user-{mid}-0", f"tenant-{mid}", {"team": team})
                for team in ("a", "z")]  # fmt: skip
    count = int(seconds * rate)
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        kubeconfig = Path(tmp) / "kubeconfig"
        server = context.Process(target=serve, args=(str(lists), str(kubeconfig), theirs))
        server.start()
        assert ours.recv() == "ready"
        try:
            for turn, mode in enumerate(modes):
                source = MODES[mode](KubeClient.connect(kubeconfig), compiler,
                                     tuning=replace(Tuning(), resync_interval=0))  # fmt: skip
                try:
                    started = time.monotonic()
                    source.start()
                    assert source.wait_synced(900), source.status()
                    sync_s = time.monotonic() - started
                    synced = sum(len(i) for i in source.informers)
                    plan = steps(count, objects, first=turn * count)
                    wait = 0.0 if mode == "frozen" else ENFORCE_WAIT
                    figures = _phases(source, ours, plan, rate, seconds, requests, options, wait)
                finally:
                    source.stop()
                results.append({"size": objects, "mode": mode, "objects": synced,
                                "sync_s": sync_s, **figures})  # fmt: skip
        finally:
            ours.send("stop")
            server.join(30)
    return results


def _phases(
    source: ClusterSource, server: Connection, plan: list[Step], rate: float, seconds: float,
    requests: list[Request], options: Options, wait: float,
) -> dict[str, Any]:  # fmt: skip
    """Rounds of a quiet stretch and a churning one, so that what else the machine does falls
    on both alike; ``seconds`` of each in all."""
    snapshot = source.snapshot()
    assert snapshot is not None
    for step in plan:
        # Each change is one no decision reflects yet (else its latency would be zero).
        assert step.action == "delete" or not probe(step, options)(snapshot), step
    prober = Prober(source, plan, options)
    prober.start()
    builder = thread_cpu("snapshot-builder")
    informers = [thread_cpu(f"informer-{spec.resource}") for spec in KINDS]
    quiet, churn, sent = array("d"), array("d"), []
    builder_s = watch_s = 0.0
    cut = -(-len(plan) // ROUNDS)
    for first in range(0, len(plan), cut):
        quiet += decide_for(seconds / ROUNDS, source, requests, options)
        cpu, watch_cpu = builder(), sum(clock() for clock in informers)
        decider = Decider(source, requests, options)
        decider.start()
        last = min(len(plan), first + cut)
        prober.churn(rate, first, last)
        server.send((rate, plan[first:last]))
        sent += server.recv()
        decider.stop.set()
        decider.join()
        churn += decider.latencies
        deadline = time.monotonic() + wait
        while any(n not in prober.seen for n in range(first, last)) and (
            time.monotonic() < deadline
        ):
            time.sleep(0.05)
        builder_s += builder() - cpu
        watch_s += sum(clock() for clock in informers) - watch_cpu
    prober.stop.set()
    prober.join()
    enforced = [(seen - sent[n]) * 1000 for n, seen in prober.seen.items()]
    whole = []
    for _ in range(3):
        values = {spec.kind: _informer(source, spec.kind).values() for spec in KINDS}
        cpu = time.process_time()
        build_snapshot(values)
        whole.append(time.process_time() - cpu)
    quiet_p99, churn_p99 = percentile(quiet, 0.99), percentile(churn, 0.99)
    per_change = builder_s / len(plan)
    return {
        "changes": len(plan), "rate": rate, "enforced": len(enforced),
        "missed": prober.missed(),
        "enforced_p50_ms": percentile(enforced, 0.50),
        "enforced_p99_ms": percentile(enforced, 0.99),
        "enforced_max_ms": max(enforced, default=float("nan")),
        "decide_quiet_p50_us": percentile(quiet, 0.5) * 1e6,
        "decide_quiet_p99_us": quiet_p99 * 1e6,
        "decide_churn_p50_us": percentile(churn, 0.5) * 1e6,
        "decide_churn_p99_us": churn_p99 * 1e6,
        "decide_p99_ratio": churn_p99 / quiet_p99,
        "decisions": len(quiet) + len(churn),
        "builder_cpu_per_change_ms": per_change * 1000,
        "watch_cpu_per_change_ms": watch_s / len(plan) * 1000,
        "whole_rebuild_cpu_ms": min(whole) * 1000,
        "whole_over_incremental": min(whole) / per_change if per_change else float("inf"),
    }  # fmt: skip


def run(
    sizes: list[int], seconds: float, rate: float, keep: Path | None, modes: list[str]
) -> list[dict[str, Any]]:
    """Each size in a fresh process, against lists written once (kept in ``keep`` if given)."""
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        base = keep or Path(tmp)
        for size in sizes:
            lists = base / f"lists-{size}"
            if not (lists / "list-roles.json").exists():
                write_lists(lists, size)
            command = module_command(
                "bench", "churn", "--measure", str(lists), "--sizes", str(size),
                "--seconds", str(seconds), "--rate", str(rate), "--builders", ",".join(modes),
            )  # fmt: skip
            out = subprocess.run(command, env=child_env(), capture_output=True, text=True,
                                 check=True).stdout  # fmt: skip
            results += json.loads(out.splitlines()[-1])
    return results


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        f"{'builder':>11} {'objects':>8} {'sync s':>7} {'changes':>8} {'enforced':>9} "
        f"{'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} {'decide p99 quiet us':>20} "
        f"{'churn us':>9} {'ratio':>6} "
        f"{'CPU/change ms':>14} {'whole rebuild ms':>17} {'whole/incr':>11} {'watch ms':>9}"
    ]
    for r in results:
        lines.append(
            f"{r['mode']:>11} {r['objects']:>8,} {r['sync_s']:7.1f} {r['changes']:>8} "
            f"{r['enforced']:>9} "
            f"{r['enforced_p50_ms']:7.1f} {r['enforced_p99_ms']:7.1f} {r['enforced_max_ms']:7.1f} "
            f"{r['decide_quiet_p99_us']:20.0f} {r['decide_churn_p99_us']:9.0f} "
            f"{r['decide_p99_ratio']:5.2f}x {r['builder_cpu_per_change_ms']:14.3f} "
            f"{r['whole_rebuild_cpu_ms']:17.1f} {r['whole_over_incremental']:10.0f}x "
            f"{r['watch_cpu_per_change_ms']:9.3f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000", help="objects, comma-separated")
    parser.add_argument("--seconds", type=float, default=1.5, help="per phase")
    parser.add_argument("--json", type=Path, default=Path("bench-churn.json"))
    parser.add_argument("--keep", type=Path, help="write (and reuse) the API server's lists here")
    parser.add_argument("--rate", type=float, default=50.0, help="changes per second")
    parser.add_argument("--builders", default="incremental,whole,frozen",
                        help="incremental (now), whole (rebuild per batch), frozen "
                             "(no updates: the watch work alone)")  # fmt: skip
    parser.add_argument("--measure", type=Path, help=argparse.SUPPRESS)  # one size, in a child
    args = parser.parse_args(argv)
    modes = args.builders.split(",")
    if args.measure:
        (size,) = (int(s) for s in args.sizes.split(","))
        print(json.dumps(measure(args.measure, size, args.seconds, args.rate, modes)))
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    churned = run(sizes, args.seconds, args.rate, args.keep, modes)
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    print(table(churned))
    args.json.write_text(json.dumps(churned, indent=2) + "\n")
    print(f"written to {args.json}")
