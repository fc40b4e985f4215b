"""API-server traffic of the live-cluster source: requests and bytes per replica in an hour.

Run with ``.venv/bin/python -m bench traffic`` (default sizes 1k, 10k and 100k objects, two
workers; ``--sizes 1000`` for fewer). The RBAC objects are those of the scale benchmark (per
namespace a Namespace, three Roles, four RoleBindings; wildcard ClusterRoles and their bindings),
served by the loopback API server of the tests (``tests/kubeapi.py``), which speaks list/watch as
kube-apiserver does and counts every request and every response byte. One ``ClusterSource`` per
worker is started against it, each with its own connection, as each gunicorn worker does.

Two behaviours are compared, in the same run and against the same server:

- ``relist``: a periodic re-list of every kind every 10 minutes (the previous default);
- ``watch``: no periodic re-list; watches renewed at their timeout from the last version seen,
  kept recent by bookmarks (the default now).

Time is compressed: one simulated hour takes ``--hour`` real seconds (default 60, so 60 times
faster). Every interval is scaled by the same factor: the watch timeout (300 s, so timeoutSeconds
300 to 450, whole seconds), the re-list interval (600 s), the server's bookmark interval (60 s) and
its compaction of history (every 300 s, to the version of the previous compaction, as the API server
compacts etcd), and a churn of RoleBinding changes (``--churn`` per simulated hour). Counting starts
once every worker has synced; the initial lists are reported apart (``start``), as they happen once
per worker start whatever the behaviour.

A compressed re-list must finish before the next one is due; at large sizes it does not (a list
of 50,000 RoleBindings takes seconds of real time). So ``relist`` is run only up to
``--relist-max`` objects; above that its hour is derived, not measured: the measured initial
lists times 6 re-lists per hour, plus the watch traffic measured for ``watch`` at that size. The
smaller sizes, where both are measured, show how close the derivation is (the ``derived`` row is
printed next to the measured one there too).

The table is printed and the figures written as JSON (``--json``, default bench-traffic.json).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from app.engine.rbac import Compiler
from app.source.api import KubeClient
from app.source.cluster import ClusterSource
from app.source.informer import Tuning
from bench.core.apiserver import write_lists
from bench.core.layout import ANNOTATION
from tests.kubeapi import FakeKubeAPI

HOUR = 3600.0
WATCH_TIMEOUT = 300.0  # Tuning.watch_timeout
RELIST_INTERVAL = 600.0  # the previous default of Tuning.resync_interval
BOOKMARK_INTERVAL = 60.0  # the API server's watch cache
COMPACTION_INTERVAL = 300.0  # kube-apiserver --etcd-compaction-interval


@dataclass
class Counts:
    """Requests and response bytes seen by the server in one phase."""

    lists: int = 0  # first pages: one per list of a kind
    pages: int = 0
    list_bytes: int = 0
    objects_listed: int = 0
    watches: int = 0
    watch_bytes: int = 0
    bookmarks: int = 0

    @classmethod
    def of(cls, api: FakeKubeAPI) -> Counts:
        requests = api.recorded()
        lists = [r for r in requests if r.query.get("watch") != "true"]
        return cls(
            lists=sum(1 for r in lists if not r.query.get("continue")),
            pages=len(lists),
            list_bytes=api.sent_bytes(watch=False),
            objects_listed=sum(api.listed.values()),
            watches=len(requests) - len(lists),
            watch_bytes=api.sent_bytes(watch=True),
            bookmarks=api.bookmarks_sent,
        )

    def __sub__(self, other: Counts) -> Counts:
        return Counts(*(a - b for a, b in zip(self.row(), other.row(), strict=True)))

    def row(self) -> tuple[int, ...]:
        return (self.lists, self.pages, self.list_bytes, self.objects_listed, self.watches,
                self.watch_bytes, self.bookmarks)  # fmt: skip


def churn(api: FakeKubeAPI, interval: float, done: list[int], stop: threading.Event) -> None:
    """Change one RoleBinding's subjects every ``interval`` seconds, round the namespaces; a
    thread that was not scheduled in time catches up, so the count follows the clock."""
    bindings = api.collections["rolebindings"]
    keys = [k for k in bindings.items if k[1] == "team-own"]
    started = time.monotonic()
    while not stop.wait(interval / 4):
        while done[0] < (time.monotonic() - started) / interval:
            obj = copy.deepcopy(bindings.items[keys[done[0] % len(keys)]])
            obj["subjects"] = obj["subjects"][1:] + obj["subjects"][:1]
            api.apply("rolebindings", obj)
            done[0] += 1


def compactor(api: FakeKubeAPI, interval: float, stop: threading.Event) -> None:
    while not stop.wait(interval):
        api.compact()


@contextmanager
def running(*targets: tuple[Any, ...]) -> Iterator[None]:
    stop = threading.Event()
    threads = [threading.Thread(target=t[0], args=(*t[1:], stop), daemon=True) for t in targets]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)


def run_mode(lists: Path, mode: str, workers: int, hour: float, churn_per_hour: int,
             kubeconfig_dir: Path) -> dict[str, Any]:  # fmt: skip
    """Sync ``workers`` sources, then one compressed hour; the counts of each phase."""
    scale = HOUR / hour
    api = FakeKubeAPI(lists)
    api.bookmark_interval = BOOKMARK_INTERVAL / scale
    api.start()
    tuning = replace(
        Tuning(),
        watch_timeout=max(1, round(WATCH_TIMEOUT / scale)),
        resync_interval=RELIST_INTERVAL / scale if mode == "relist" else 0.0,
    )
    sources = [
        ClusterSource(
            KubeClient.connect(api.write_kubeconfig(kubeconfig_dir / f"kubeconfig-{w}")),
            Compiler((ANNOTATION,)),
            tuning=tuning,
        )
        for w in range(workers)
    ]
    try:
        started = time.perf_counter()
        for source in sources:
            source.start()
        for source in sources:
            assert source.wait_synced(1800), source.status()
        sync_s = time.perf_counter() - started
        start = Counts.of(api)
        changes = [0]
        with running((compactor, api, COMPACTION_INTERVAL / scale),
                     (churn, api, hour / churn_per_hour, changes)):  # fmt: skip
            time.sleep(hour)
        end = Counts.of(api)
        # Every worker still follows: the last change reached each of them.
        last = str(api.rv)
        for source in sources:
            informer = next(i for i in source.informers if i.spec.resource == "rolebindings")
            deadline = time.monotonic() + 60
            while int(informer.resource_version or 0) < int(last):
                assert time.monotonic() < deadline, f"{mode}: a worker fell behind"
                time.sleep(0.05)
    finally:
        for source in sources:
            source.stop()
        api.stop()
    return {"mode": mode, "method": "measured", "sync_s": sync_s, "changes": changes[0],
            "start": vars(start), "hour": vars(end - start)}  # fmt: skip


def derived(relist_start: dict[str, int], watch: dict[str, Any]) -> dict[str, Any]:
    """``relist``'s hour: the initial lists times the re-lists per hour, and ``watch``'s hour."""
    times = int(HOUR / RELIST_INTERVAL)
    hour = {k: v * times for k, v in relist_start.items()}
    for key in ("watches", "watch_bytes", "bookmarks"):
        hour[key] = watch["hour"][key]
    return {"mode": "relist", "method": "derived", "sync_s": None, "changes": watch["changes"],
            "start": dict(relist_start), "hour": hour}  # fmt: skip


def run(sizes: list[int], workers: int, hour: float, churn_per_hour: int,
        relist_max: int) -> list[dict[str, Any]]:  # fmt: skip
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in sizes:
            lists = Path(tmp) / f"lists-{size}"
            objects = write_lists(lists, size)
            base = {"size": size, "objects": objects, "workers": workers, "hour_s": hour}
            watch = run_mode(lists, "watch", workers, hour, churn_per_hour, Path(tmp))
            results.append({**base, **watch})
            if size <= relist_max:
                relist = run_mode(lists, "relist", workers, hour, churn_per_hour, Path(tmp))
                results.append({**base, **relist})
            results.append({**base, **derived(watch["start"], watch)})
            print(table(results[-3 if size <= relist_max else -2 :]), flush=True)
    return results


def table(results: list[dict[str, Any]]) -> str:
    mb = 1e6
    lines = [
        f"{'objects':>8} {'mode':>6} {'method':>8} {'start lists':>11} {'start MB':>9} "
        f"{'lists/h':>8} {'objects/h':>10} {'list MB/h':>9} {'watches/h':>9} "
        f"{'watch MB/h':>10} {'changes':>7} {'MB/h/worker':>11}"
    ]
    for r in results:
        s, h = r["start"], r["hour"]
        per_worker = (h["list_bytes"] + h["watch_bytes"]) / r["workers"] / mb
        lines.append(
            f"{r['objects']:>8,} {r['mode']:>6} {r['method']:>8} {s['lists']:>11,} "
            f"{s['list_bytes'] / mb:9.1f} {h['lists']:>8,} {h['objects_listed']:>10,} "
            f"{h['list_bytes'] / mb:9.1f} {h['watches']:>9,} {h['watch_bytes'] / mb:10.2f} "
            f"{r['changes']:>7,} {per_worker:11.2f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000", help="objects, comma-separated")
    parser.add_argument("--workers", type=int, default=2, help="sources per replica")
    parser.add_argument("--hour", type=float, default=60.0, help="real seconds per simulated hour")
    parser.add_argument("--churn", type=int, default=360, help="RoleBinding changes per hour")
    parser.add_argument("--relist-max", type=int, default=10000,
                        help="measure the re-listing behaviour up to this size only")  # fmt: skip
    parser.add_argument("--json", type=Path, default=Path("bench-traffic.json"))
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    load = os.getloadavg()[0]
    print(f"machine: {os.cpu_count()} cores, load average {load:.1f}; {args.workers} workers, "
          f"one hour in {args.hour:g} s, {args.churn} changes/h")  # fmt: skip
    results = run(sizes, args.workers, args.hour, args.churn, args.relist_max)
    print("all sizes, per replica of", args.workers, "workers:")
    print(table(results))
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    print(f"written to {args.json}")
