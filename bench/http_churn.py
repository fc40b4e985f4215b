"""HTTP benchmark under churn: the served request path while RBAC changes stream in by the watch.

Run with ``.venv/bin/python -m bench http --churn --objects 100000`` (``--rate``
changes per second, default 50; ``--seconds`` per phase; ``--rounds``; ``--lists DIR`` writes
the API server's lists there once and reuses them).

- **API server**: the loopback API server of the tests (``tests/kubeapi.py``) in a process of its
  own, serving the objects of the generated layout (``bench.core.layout``); the same process
  makes the changes of ``bench.core.apiserver`` on a schedule (per ten: three Role annotation
  edits, three RoleBinding subject edits — every 500th change a ClusterRole annotation edit
  instead — two RoleBindings created and one of them deleted again).
- **label-rbac**: served as the HTTP benchmark serves it (``app.webhook.serve.WebhookServer``, the
  ``--models`` serving model, TLS, keep-alive, JSON log at ``info``), its source the cluster:
  every worker lists and watches the API server and applies the changes to its snapshot.
- **load**: the HTTP benchmark's ``/validate`` mix (tenants creating ConfigMaps, half of them
  denied) from wrk (or ``--client python``), in rounds of a quiet phase (no changes) and a churn
  phase (the changes streaming in), the order alternating between rounds so that what else the
  machine does falls on both alike. Each ratio is churn over quiet within a round, the median of
  the rounds: throughput, p50, p99, and the workers' CPU per request.
- **enforced**: a prober holds one keep-alive connection to each worker (workers are told apart
  by the ``X-Worker`` header the benchmark's server adds) and sends one review per connection
  every ``PROBE_EVERY`` seconds in both phases: the review of the latest change of one kind that
  the API server has made and that worker not yet shown (a user whose decision the change
  alters), else a review of the mix. A worker applies each kind's changes in the order they were
  made, so the new decision for a change shows the earlier ones of its kind too, noted as seen
  then (at the latest). A change is enforced once every worker answered with the new decision;
  the latency runs from the moment the API server made the change to the arrival of that last
  answer.
"""

from __future__ import annotations

import http.client
import json
import multiprocessing
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench.core.apiserver import Step, steps
from bench.core.apiserver import serve as serve_api
from bench.core.load import Plan, load, verdicts
from bench.core.processes import cpu_seconds, process_cpu
from bench.core.servers import Model, Running, server
from bench.core.stats import med, median_ratio, percentile
from tests.support import make_review

PATH = "/validate"
PROBE_EVERY = 0.01  # seconds between two reviews of the prober, per worker, in both phases
ENFORCE_WAIT = 15.0  # after a churn phase, how long its changes may take to show
# The most a review looks back: a change a worker never shows by itself (a binding created and
# deleted again within one batch of the worker's changes) must not hold up the reviews of its
# kind; one made later shows it too.
MAX_LAG = 1.0
READY_WAIT = 600.0  # every worker synced from the API server (100k objects: about a minute)


@dataclass(frozen=True)
class Probe:
    """A review whose decision the change alters, and the decision once it is enforced."""

    body: bytes
    after: bool
    before: bool | None  # the decision before the change (None: it depends on an earlier one)


def probe(step: Step) -> Probe:
    """The review that tells whether ``step`` is enforced. A user bound to no role is RBAC's
    to refuse, so the webhook allows them (``NoGrantingRole``): a new subject or binding shows
    as a denial of a label outside the shared role's bucket, a deleted one as that denial gone."""
    i = step.namespace.removeprefix("tenant-")
    user, namespace, labels, after = {
        "role": (f"user-{i}-3", step.namespace, {"team": f"c{step.k}"}, True),
        "clusterrole": (f"operator-{step.cluster_role}", "tenant-0", {"env": f"p{step.k}"}, True),
        "subjects": (f"churn-{step.k}", step.namespace, {"team": "z"}, False),
        "add": (f"new-{step.k}", step.namespace, {"team": "z"}, False),
        "delete": (f"new-{step.k - 12}", step.namespace, {"team": "z"}, True),
    }[step.action]
    review = make_review(user, "CREATE", "configmaps", namespace=namespace, labels=labels)
    before = None if step.action == "delete" else not after
    return Probe(json.dumps(review).encode(), after, before)


class Worker:
    """One keep-alive HTTPS connection, held by one server worker."""

    def __init__(self, pid: str, conn: http.client.HTTPSConnection) -> None:
        self.pid, self.conn = pid, conn

    def allowed(self, body: bytes) -> bool:
        self.conn.request("POST", PATH, body, {"Content-Type": "application/json"})
        response = self.conn.getresponse()
        answer = json.loads(response.read())
        if response.status != 200:
            raise RuntimeError(f"worker {self.pid}: HTTP {response.status}: {answer}")
        return bool(answer["response"]["allowed"])


def connect_workers(url: str, ca: Path, count: int, timeout: float = READY_WAIT) -> list[Worker]:
    """A connection to each of ``count`` workers, once each is ready. Connections are opened
    until every worker has answered ``/readyz`` on one: the kernel hands a new connection to
    whichever worker accepts first."""
    import ssl

    context = ssl.create_default_context(cafile=str(ca))
    parts = urlsplit(url)
    found: dict[str, http.client.HTTPSConnection] = {}
    deadline = time.monotonic() + timeout
    while len(found) < count:
        if time.monotonic() > deadline:
            raise SystemExit(f"{count - len(found)} of {count} workers not ready after {timeout}s")
        conn = http.client.HTTPSConnection(parts.hostname or "", parts.port, context=context,
                                           timeout=60)  # fmt: skip
        conn.request("GET", "/readyz")
        response = conn.getresponse()
        response.read()
        pid = response.getheader("X-Worker") or ""
        if response.status == 200 and pid not in found:
            found[pid] = conn
        else:
            conn.close()
            time.sleep(0.05)
    return [Worker(pid, conn) for pid, conn in found.items()]


# What a change changes at the API server: each kind's changes reach a worker's snapshot in the
# order they were made (one informer per kind, its changes applied in order, the snapshot swapped
# whole), so a worker that shows a change shows every earlier change of the same kind.
KIND_OF = {"role": "roles", "clusterrole": "clusterroles", "subjects": "rolebindings",
           "add": "rolebindings", "delete": "rolebindings"}  # fmt: skip


@dataclass
class Prober:
    """Per worker, a thread sending one review every ``PROBE_EVERY`` seconds, in both phases:
    if the API server made changes the worker has not shown yet, the review of one of them
    (the kinds in turn), else one of ``fillers``. A review answered with the new decision shows
    that change and the earlier ones of its kind, which are noted as seen then (at the latest):
    under load a review takes as long as any, and one per change could not keep up with 50
    changes/s. Which change is asked about: the latest made at least ``lag`` ago, where ``lag``
    follows how far behind the worker is (a review still answered the old way raises it, one
    answered the new way lowers it), so that a review neither asks about a change too recent to
    show yet nor lets those that showed wait to be noted."""

    workers: list[Worker]
    plan: list[Step]
    probes: list[Probe]
    fillers: list[bytes]
    made: Any  # the API server's count of changes made (a shared integer)
    made_at: Any  # and when each was made (a shared array of monotonic times)
    seen: list[dict[int, float]] = field(init=False)
    sent: list[int] = field(init=False)  # reviews sent, per worker
    first: int = 0
    last: int = 0

    def __post_init__(self) -> None:
        self.seen = [{} for _ in self.workers]
        self.sent = [0 for _ in self.workers]
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(w,), daemon=True)
                         for w in range(len(self.workers))]  # fmt: skip
        self.errors: list[BaseException] = []

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()
        if self.errors:
            raise self.errors[0]

    def churn(self, first: int, last: int) -> None:
        """The API server starts making ``plan[first:last]`` now."""
        self.first, self.last = first, last

    def enforced(self, n: int) -> bool:
        return all(n in seen for seen in self.seen)

    def _due(self) -> tuple[int, int]:
        """The changes of this phase made by now."""
        return self.first, min(self.last, self.made.value)

    def _run(self, w: int) -> None:
        try:
            self._probe(w)
        except BaseException as exc:  # reported by stop()
            self.errors.append(exc)

    def _probe(self, w: int) -> None:
        worker, seen = self.workers[w], self.seen[w]
        pending: dict[str, list[int]] = {kind: [] for kind in dict.fromkeys(KIND_OF.values())}
        lag = dict.fromkeys(pending, 0.0)
        armed = turn = fill = 0
        tick = time.monotonic()
        while not self._stop.is_set():
            first, due = self._due()
            for n in range(max(armed, first), due):
                pending[KIND_OF[self.plan[n].action]].append(n)
            armed = max(armed, due)
            asked = time.monotonic()
            chosen = {}
            for kind, queue in pending.items():
                found = self._choose(queue, seen, asked - lag[kind])
                if found is not None:
                    chosen[kind] = found
            if chosen:
                kind = sorted(chosen)[turn % len(chosen)]
                turn += 1
                n = chosen[kind]
                if worker.allowed(self.probes[n].body) == self.probes[n].after:
                    now = time.monotonic()
                    queue = pending[kind]
                    for m in queue[: queue.index(n) + 1]:
                        seen[m] = now
                    del queue[: queue.index(n) + 1]
                    lag[kind] *= 0.75
                else:
                    lag[kind] = min(MAX_LAG, 1.25 * (asked - self.made_at[n]) + PROBE_EVERY)
            else:
                worker.allowed(self.fillers[fill % len(self.fillers)])
                fill += 1
            self.sent[w] += 1
            tick += PROBE_EVERY
            delay = tick - time.monotonic()
            if delay > 0:
                self._stop.wait(delay)
            else:
                tick = time.monotonic()

    def _choose(self, queue: list[int], seen: dict[int, float], before: float) -> int | None:
        """The latest change of ``queue`` made by ``before`` whose review tells, else the
        earliest whose review tells. A deletion's review tells only once the binding's
        creation has shown (before it, the user was bound to nothing either)."""
        telling = [n for n in queue if self.plan[n].deletes < 0 or self.plan[n].deletes in seen]
        old = [n for n in telling if self.made_at[n] <= before]
        return old[-1] if old else telling[0] if telling else None


def check_before(workers: list[Worker], plan: list[Step], probes: list[Probe]) -> None:
    """Every change is one no decision reflects yet (else its latency would be zero)."""

    def check(w: int) -> None:
        for n in range(w, len(plan), len(workers)):
            before = probes[n].before
            if before is not None and workers[w].allowed(probes[n].body) != before:
                raise SystemExit(f"change {plan[n]} already shows before it is made")

    threads = [threading.Thread(target=check, args=(w,)) for w in range(len(workers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def measure(
    objects: int, lists: Path, model: Model, plan: Plan, rate: float, tmp: Path
) -> dict[str, Any]:
    """Serve ``lists`` from the API server process, label-rbac from it; rounds of quiet and
    churn under load."""
    certs, log, kubeconfig = tmp / "certs", tmp / "servers.log", tmp / "kubeconfig"
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    changes = steps(int(plan.seconds * rate) * plan.rounds, objects)
    # Written by the API server only, as it makes each change.
    made = context.Value("i", 0, lock=False)
    made_at = context.Array("d", len(changes), lock=False)
    api = context.Process(target=serve_api,
                          args=(str(lists), str(kubeconfig), theirs, made, made_at))  # fmt: skip
    api.start()
    assert ours.recv() == "ready" and api.pid is not None
    try:
        started = time.monotonic()
        served = server("label-rbac", model, None, certs, log, plan.log_level,
                        kubeconfig=kubeconfig)  # fmt: skip
        with served as real:
            workers = connect_workers(real.url, plan.ca, model.workers)
            ready_s = time.monotonic() - started
            allowed = verdicts(real, plan.ca, PATH, plan.mix[PATH])
            if sum(allowed) != len(allowed) // 2:
                raise SystemExit(f"expected half of the reviews denied, got {allowed}")
            probes = [probe(step) for step in changes]
            check_before(workers, changes, probes)
            fillers = [json.dumps(review).encode() for review in plan.mix[PATH]]
            prober = Prober(workers, changes, probes, fillers, made, made_at)
            prober.start()
            try:
                load(real, PATH, plan, min(2, plan.seconds))  # warm up: TLS sessions, imports
                phases, sent = _rounds(real, ours, api.pid, prober, changes, plan, rate)
            finally:
                prober.stop()
    finally:
        ours.send("stop")
        api.join(30)
    return {
        "objects": objects, "model": str(model), "workers": len(workers),
        "ready_s": ready_s, **summary(phases, prober, changes, sent),
    }  # fmt: skip


def _rounds(
    real: Running, api: Any, api_pid: int, prober: Prober, changes: list[Step], plan: Plan,
    rate: float,
) -> tuple[dict[str, list[dict[str, float]]], list[float]]:  # fmt: skip
    phases: dict[str, list[dict[str, float]]] = {"quiet": [], "churn": []}
    sent: list[float] = []
    per_round = len(changes) // plan.rounds
    for turn in range(plan.rounds):
        for phase in ("quiet", "churn") if turn % 2 == 0 else ("churn", "quiet"):
            cpu, probed = cpu_seconds(real.process.pid), sum(prober.sent)
            api_cpu = process_cpu(api_pid)
            first, last = turn * per_round, (turn + 1) * per_round
            if phase == "churn":
                prober.churn(first, last)
                api.send((rate, changes[first:last]))
            figures = load(real, PATH, plan, plan.seconds)
            used = cpu_seconds(real.process.pid) - cpu
            served = figures["rps"] * plan.seconds + sum(prober.sent) - probed
            figures["cpu_ms_per_request"] = 1e3 * used / served
            # The API server shares the machine here: how much of a core it took meanwhile.
            figures["api_server_cores"] = (process_cpu(api_pid) - api_cpu) / plan.seconds
            figures["load_average"] = os.getloadavg()[0]
            if phase == "churn":
                sent += api.recv()
                deadline = time.monotonic() + ENFORCE_WAIT
                while time.monotonic() < deadline and not all(
                    prober.enforced(n) for n in range(first, last)
                ):
                    time.sleep(0.05)
            phases[phase].append(figures)
    return phases, sent


def summary(
    phases: dict[str, list[dict[str, float]]], prober: Prober, changes: list[Step],
    sent: list[float],
) -> dict[str, Any]:  # fmt: skip
    pairs = list(zip(phases["quiet"], phases["churn"], strict=True))
    enforced = [
        (max(seen[n] for seen in prober.seen) - sent[n]) * 1e3
        for n in range(len(changes))
        if prober.enforced(n)
    ]
    missed: dict[str, int] = {}
    for n, step in enumerate(changes):
        if not prober.enforced(n):
            missed[step.action] = missed.get(step.action, 0) + 1

    return {
        **phases, "throughput_ratio": median_ratio(pairs, "rps"),
        "p50_ratio": median_ratio(pairs, "p50_ms"), "p99_ratio": median_ratio(pairs, "p99_ms"),
        "cpu_ratio": median_ratio(pairs, "cpu_ms_per_request"),
        "changes": len(changes), "enforced": len(enforced), "missed": missed,
        "enforced_p50_ms": percentile(enforced, 0.50),
        "enforced_p99_ms": percentile(enforced, 0.99),
        "enforced_max_ms": max(enforced, default=float("nan")),
        "probe_every_ms": PROBE_EVERY * 1e3,
        # Per change, in order: what it was, and per worker how long it took to show (ms).
        "per_change": [
            {"action": step.action, "made_s": sent[n] - sent[0] if n < len(sent) else None,
             "shown_ms": [round((seen[n] - sent[n]) * 1e3, 1) if n in seen else None
                          for seen in prober.seen]}
            for n, step in enumerate(changes)
        ],
    }  # fmt: skip


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| objects | model | quiet req/s | churn req/s | throughput ratio | quiet p50 ms "
        "| churn p50 ms | p50 ratio | quiet p99 ms | churn p99 ms | p99 ratio | CPU/request ratio "
        "| changes | enforced | enforced p50 ms | p99 ms | max ms |",
        "|" + "---|" * 17,
    ]

    for r in rows:
        lines.append(
            f"| {r['objects']:,} | {r['model']} | {med(r['quiet'], 'rps'):,.0f} "
            f"| {med(r['churn'], 'rps'):,.0f} | {r['throughput_ratio']:.2f} "
            f"| {med(r['quiet'], 'p50_ms'):.1f} | {med(r['churn'], 'p50_ms'):.1f} "
            f"| {r['p50_ratio']:.2f} | {med(r['quiet'], 'p99_ms'):.1f} "
            f"| {med(r['churn'], 'p99_ms'):.1f} | {r['p99_ratio']:.2f} | {r['cpu_ratio']:.2f} "
            f"| {r['changes']} | {r['enforced']} | {r['enforced_p50_ms']:.0f} "
            f"| {r['enforced_p99_ms']:.0f} | {r['enforced_max_ms']:.0f} |"
        )
    return "\n".join(lines)
