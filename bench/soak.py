"""Soak test: the real server under concurrent load while RBAC changes underneath it.

Everything runs on loopback: the loopback API server of the tests (tests/kubeapi.py, TLS and a
bearer token, the recorded cluster's RBAC) feeds the webhook's watches; the webhook runs as
``python -m app serve --kubeconfig`` (gunicorn, TLS); client threads post AdmissionReviews over
keep-alive HTTPS connections; a churn thread binds and unbinds a user and widens and narrows a
Role's annotation through watch events.

Every answer is checked: HTTP 200, the uid echoed, and the decisions that no churn may change
(alice may create team=a configmaps in ``default``, never team=c). Anything else is an error.
Per interval it prints requests, errors, p50/p99 latency and the server's RSS (arbiter and
workers); at the end a summary. Bounded by ``--minutes`` and ``--max-requests``; exit status 1
when there was any error.

    .venv/bin/python -m bench soak --minutes 2
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import os
import ssl
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.webhook.certs import generate
from bench.core.processes import rss_bytes
from bench.core.stats import percentile
from tests.kubeapi import FakeKubeAPI
from tests.process import Server, serve
from tests.support import make_review

TOKEN = "soak-token"
RBAC = "rbac.authorization.k8s.io"


@dataclass
class Window:
    """What happened in one reporting interval."""

    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class Stats:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._window = Window()
        self.total = 0
        self.errors: list[str] = []

    def ok(self, seconds: float) -> None:
        with self._lock:
            self._window.latencies.append(seconds)
            self.total += 1

    def error(self, what: str) -> None:
        with self._lock:
            self._window.errors.append(what)
            self.errors.append(what)
            self.total += 1

    def take(self) -> Window:
        with self._lock:
            window, self._window = self._window, Window()
            return window


# (user, labels, expected decision or None when churn may change it)
CASES: tuple[tuple[str, dict[str, str], bool | None], ...] = (
    ("alice", {"team": "a"}, True),
    ("alice", {"team": "c"}, False),
    ("bob", {"team": "b"}, None),
    ("bob", {"team": "a"}, None),
)


def client_loop(server: Server, stats: Stats, stop: threading.Event, budget: Any) -> None:
    host, port = server.base_url.removeprefix("https://").split(":")
    context = ssl.create_default_context(cafile=str(server.ca))
    connection: http.client.HTTPSConnection | None = None
    for index in itertools.count():
        if stop.is_set() or next(budget, None) is None:
            return
        user, labels, expected = CASES[index % len(CASES)]
        uid = str(uuid.uuid4())
        review = make_review(
            user, "CREATE", "configmaps", namespace="default", labels=labels, uid=uid
        )
        body = json.dumps(review)
        started = time.perf_counter()
        try:
            if connection is None:
                connection = http.client.HTTPSConnection(
                    host, int(port), context=context, timeout=10
                )
            connection.request("POST", "/validate", body, {"Content-Type": "application/json"})
            response = connection.getresponse()
            data = response.read()
            elapsed = time.perf_counter() - started
        except (OSError, http.client.HTTPException) as exc:
            stats.error(f"{type(exc).__name__}: {exc}")
            if connection is not None:
                connection.close()
            connection = None
            continue
        problem = check(response.status, data, uid, expected)
        if problem:
            stats.error(f"{user} {labels}: {problem}")
        else:
            stats.ok(elapsed)


def check(status: int, data: bytes, uid: str, expected: bool | None) -> str:
    if status != 200:
        return f"HTTP {status}: {data[:200]!r}"
    try:
        answer = json.loads(data)["response"]
    except (ValueError, KeyError, TypeError):
        return f"not a review: {data[:200]!r}"
    if answer.get("uid") != uid:
        return f"uid {answer.get('uid')!r} echoed for {uid!r}"
    if expected is not None and answer.get("allowed") is not expected:
        return f"allowed={answer.get('allowed')}, expected {expected}: {answer.get('status')}"
    return ""


def churn_loop(api: FakeKubeAPI, per_second: float, stop: threading.Event) -> int:
    """Bind/unbind bob and widen/narrow the Role tenant-a, alternately; returns the count."""
    role = json.loads(json.dumps(api.collections["roles"].items[("default", "tenant-a")]))
    annotations = role["metadata"].setdefault("annotations", {})
    widths = itertools.cycle(
        [{"configmaps": {"team": ["a", "b"]}}, {"configmaps": {"team": ["a"]}}]
    )
    binding = {
        "metadata": {"name": "bob-tenant-a", "namespace": "default"},
        "subjects": [{"kind": "User", "apiGroup": RBAC, "name": "bob"}],
        "roleRef": {"apiGroup": RBAC, "kind": "Role", "name": "tenant-a"},
    }
    bound = False
    changes = 0
    while not stop.wait(1 / per_second):
        if changes % 2 == 0:
            if bound:
                api.delete("rolebindings", "bob-tenant-a", "default")
            else:
                api.apply("rolebindings", binding)
            bound = not bound
        else:
            annotations["labelrbac.io/permissions"] = json.dumps(next(widths))
            api.apply("roles", role)
        changes += 1
    return changes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=2.0, help="how long (default 2)")
    parser.add_argument("--max-requests", type=int, default=10_000_000, help="stop after this many")
    parser.add_argument("--concurrency", type=int, default=8, help="client threads (default 8)")
    parser.add_argument("--workers", type=int, default=2, help="server workers (default 2)")
    parser.add_argument("--interval", type=float, default=10.0, help="report every N s (10)")
    parser.add_argument("--churn", type=float, default=5.0, help="RBAC changes per second (5)")
    args = parser.parse_args(argv)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")  # the server's log lines as they happen

    with tempfile.TemporaryDirectory(prefix="label-rbac-soak-") as scratch:
        tmp = Path(scratch)
        certs = generate(tmp / "api-certs", ["127.0.0.1"])
        api = FakeKubeAPI(tls=(certs.ca, certs.cert, certs.key), token=TOKEN).start()
        kubeconfig = api.write_kubeconfig(tmp / "kubeconfig")
        env = {"KUBECONFIG": "", "PROMETHEUS_MULTIPROC_DIR": "", "TMPDIR": str(tmp)}
        serve_args = ("--kubeconfig", str(kubeconfig), "--workers", str(args.workers))
        try:
            with serve(tmp, *serve_args, env=env) as server:
                return run(args, api, server)
        finally:
            api.stop()


def run(args: argparse.Namespace, api: FakeKubeAPI, server: Server) -> int:
    stats, stop = Stats(), threading.Event()
    budget = iter(range(args.max_requests))  # shared: next() is atomic under the GIL
    clients = [
        threading.Thread(target=client_loop, args=(server, stats, stop, budget), daemon=True)
        for _ in range(args.concurrency)
    ]
    churned: list[int] = []
    churner = threading.Thread(
        target=lambda: churned.append(churn_loop(api, args.churn, stop)), daemon=True
    )
    print(
        f"soak: {args.minutes:g} min, {args.concurrency} clients, {args.workers} workers, "
        f"{args.churn:g} RBAC changes/s (loopback API server {api.url}, webhook {server.base_url})"
    )
    columns = ("t(s)", 6), ("requests", 9), ("req/s", 7), ("errors", 6), ("p50 ms", 7)
    print(" ".join(f"{name:>{width}}" for name, width in columns), f"{'p99 ms':>7} {'RSS MB':>7}")
    started = time.monotonic()
    deadline = started + args.minutes * 60
    for thread in (*clients, churner):
        thread.start()
    rows: list[tuple[float, float]] = []  # (p99, rss) per interval
    while not stop.is_set():
        time.sleep(max(0.0, min(args.interval, deadline - time.monotonic())))
        if time.monotonic() >= deadline or not any(t.is_alive() for t in clients):
            stop.set()
            for thread in clients:
                thread.join(15)
        window = stats.take()
        rss = rss_bytes(server.process.pid) / 1e6
        p50, p99 = (percentile(window.latencies, q) * 1e3 for q in (0.5, 0.99))
        count = len(window.latencies) + len(window.errors)
        print(
            f"{time.monotonic() - started:6.0f} {count:9d} {count / args.interval:7.0f} "
            f"{len(window.errors):6d} {p50:7.2f} {p99:7.2f} {rss:7.1f}",
            flush=True,
        )
        for error in window.errors[:5]:
            print(f"  error: {error}")
        if window.latencies:
            rows.append((p99, rss))
    churner.join(5)
    elapsed = time.monotonic() - started
    print(
        f"total: {stats.total} requests in {elapsed:.0f}s ({stats.total / elapsed:.0f}/s), "
        f"errors {len(stats.errors)}, RBAC changes {churned[0] if churned else 0}"
    )
    if rows:
        print(
            f"p99 first/last interval: {rows[0][0]:.2f}/{rows[-1][0]:.2f} ms; "
            f"RSS first/last: {rows[0][1]:.1f}/{rows[-1][1]:.1f} MB"
        )
    return 1 if stats.errors else 0
