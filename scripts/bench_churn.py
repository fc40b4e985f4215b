"""Churn benchmark: RBAC changes at a steady rate, through the watch, into a live ClusterSource.

Run with ``.venv/bin/python scripts/bench_scale.py --churn`` (sizes as for the scale benchmark,
``--sizes 100000``; ``--rate`` changes per second, default 50; ``--seconds`` per phase). The RBAC
objects are those of ``bench_scale.py``, served by the loopback API server of the tests
(``tests/kubeapi.py``) in a process of its own (as the API server is), which also makes the
changes: per ten, three Role annotation edits, three RoleBinding subject edits (one in ten
seconds of them a ClusterRole annotation edit instead), two RoleBindings created and one of them
deleted again. This process runs a real ``ClusterSource`` synced from that server, and measures:

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

import copy
import gc
import json
import multiprocessing
import sys
import tempfile
import threading
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_scale import ANNOTATION, layout  # noqa: E402

from app.engine.context import Context, Options  # noqa: E402
from app.engine.decide import evaluate  # noqa: E402
from app.engine.kinds import KINDS, build_snapshot  # noqa: E402
from app.engine.model import Request, UserInfo  # noqa: E402
from app.engine.rbac import Compiler, Snapshot  # noqa: E402
from app.source.api import KubeClient  # noqa: E402
from app.source.cluster import ClusterSource  # noqa: E402
from app.source.informer import Tuning  # noqa: E402
from app.wire import parse_review  # noqa: E402
from tests.support import make_review  # noqa: E402

RBAC = "rbac.authorization.k8s.io"
PROBE_EVERY = 0.002  # how often the prober looks for a new snapshot (both phases)
ENFORCE_WAIT = 15.0  # after the last change of a round, how long changes may take to show
ROUNDS = 4  # quiet and churning stretches alternate this many times


@dataclass(frozen=True)
class Step:
    """Change number ``k``: what the server changes, and who can tell it happened."""

    k: int
    action: str  # role | subjects | clusterrole | add | delete
    namespace: str
    name: str
    cluster_role: int = 0
    deletes: int = -1  # for a deletion: the position in the plan of the creation it undoes


def steps(count: int, objects: int, first: int = 0) -> list[Step]:
    """The changes, numbered from ``first``, in order: spread over the namespaces so that no
    object changes twice in a row."""
    namespaces, cluster_roles = layout(objects)
    out: list[Step] = []
    for k in range(first, first + count):
        ns = f"tenant-{(k * 7919) % namespaces}"
        kind = k % 10
        if kind < 3:
            out.append(Step(k, "role", ns, "team-own"))
        elif kind < 6:
            if kind == 5 and k % 500 == 5:  # ten seconds at 50/s
                out.append(Step(k, "clusterrole", "", "", (k // 500) % cluster_roles))
            else:
                out.append(Step(k, "subjects", ns, "team-shared"))
        elif kind < 8:
            out.append(Step(k, "add", ns, f"churn-{k}"))
        elif kind == 8 and len(out) >= 12:
            # The binding created ten changes (200 ms at 50/s) before: it has shown by now.
            added = out[-12]
            out.append(Step(k, "delete", added.namespace, added.name, deletes=len(out) - 12))
        else:
            out.append(Step(k, "subjects", ns, "team-shared"))
    return out


def permissions(step: Step) -> str:
    if step.action == "clusterrole":
        return json.dumps({"*": {"team": ["*"]}, "configmaps": {"env": [f"p{step.k}"]}})
    i = step.namespace.removeprefix("tenant-")
    return json.dumps({"configmaps": {"team": [f"t{i}-*", f"c{step.k}"]},
                       "pods": {"team": [f"t{i}-*"]}})  # fmt: skip


def make_change(api: Any, step: Step) -> None:
    """Make ``step`` on the server (in the server's process)."""
    if step.action == "delete":
        api.delete("rolebindings", step.name, step.namespace)
        return
    if step.action == "add":
        api.apply("rolebindings", {
            "apiVersion": f"{RBAC}/v1", "kind": "RoleBinding",
            "metadata": {"name": step.name, "namespace": step.namespace},
            "roleRef": {"apiGroup": RBAC, "kind": "Role", "name": "team-shared"},
            "subjects": [{"apiGroup": RBAC, "kind": "User", "name": f"new-{step.k}"}],
        })  # fmt: skip
        return
    resource = {"role": "roles", "subjects": "rolebindings", "clusterrole": "clusterroles"}
    name = f"platform-{step.cluster_role}" if step.action == "clusterrole" else step.name
    collection = api.collections[resource[step.action]]
    obj = copy.deepcopy(collection.items[(step.namespace, name)])
    if step.action == "subjects":
        kept = [s for s in obj["subjects"] if not s["name"].startswith("churn-")]
        obj["subjects"] = [*kept, {"apiGroup": RBAC, "kind": "User", "name": f"churn-{step.k}"}]
    else:
        obj["metadata"].setdefault("annotations", {})[ANNOTATION] = permissions(step)
    api.apply(resource[step.action], obj)


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
        return lambda snap: any(True for _ in snap.roles_for(who, namespace)) and evaluate(
            request, Context(snap, options)
        ).allowed
    return lambda snap: evaluate(request, Context(snap, options)).allowed


def review_request(user: str, namespace: str, labels: dict[str, str]) -> Request:
    review = make_review(user, "CREATE", "configmaps", namespace=namespace, labels=labels)
    return parse_review(review).request


# The API server's process.


def serve(
    lists: str, kubeconfig: str, conn: Connection, made: Any = None, made_at: Any = None
) -> None:
    """Serve ``lists``; make each plan received on ``conn`` at its rate, then send back when
    each change was made. If given, ``made`` (a shared integer) counts the changes made so far
    and ``made_at`` (a shared array) receives when each was made, as they are made."""
    from tests.kubeapi import FakeKubeAPI

    api = FakeKubeAPI(Path(lists)).start()
    api.write_kubeconfig(Path(kubeconfig))
    # The objects served live as long as the server: out of its collector's sight, else each
    # whole collection (0.4 s at 100k objects) would hold back the watch events, a pause
    # kube-apiserver's concurrent collector does not make.
    gc.freeze()
    conn.send("ready")
    while True:
        message = conn.recv()
        if message == "stop":
            api.stop()
            return
        rate, plan = message
        started = time.monotonic()
        sent = []
        for n, step in enumerate(plan):
            delay = started + n / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            sent.append(time.monotonic())
            make_change(api, step)
            if made is not None:
                made_at[made.value] = sent[-1]
                made.value += 1  # after the time: a reader of the count finds the times there
        conn.send(sent)


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


def percentile(values: Any, q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def thread_cpu(name: str) -> Callable[[], float]:
    thread = next(t for t in threading.enumerate() if t.name == name)
    assert thread.ident is not None
    clock = time.pthread_getcpuclockid(thread.ident)
    return lambda: time.clock_gettime(clock)


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
    "incremental": ClusterSource, "whole": WholeRebuildSource, "frozen": FrozenSource,
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
    import subprocess

    from bench_traffic import write_lists

    results = []
    with tempfile.TemporaryDirectory() as tmp:
        base = keep or Path(tmp)
        for size in sizes:
            lists = base / f"lists-{size}"
            if not (lists / "list-roles.json").exists():
                write_lists(lists, size)
            out = subprocess.run(
                [sys.executable, __file__, str(lists), str(size), str(seconds), str(rate),
                 ",".join(modes)],
                capture_output=True, text=True, check=True,
            ).stdout  # fmt: skip
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


if __name__ == "__main__":
    lists_dir, size, phase_seconds, per_second, which = sys.argv[1:6]
    figures = measure(Path(lists_dir), int(size), float(phase_seconds), float(per_second),
                      which.split(","))  # fmt: skip
    print(json.dumps(figures))
