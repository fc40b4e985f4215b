"""Scale benchmark: load time, memory and decisions/s of N RBAC objects, from files and the API.

Run with ``.venv/bin/python -m bench scale --watch`` (default sizes 1k, 10k and 100k objects;
``--sizes 1000,10000`` for fewer). Each size is written once as YAML files
(``bench.core.layout``), like a cluster's exported RBAC: per namespace a Namespace, three Roles
(one with an annotation shared by every namespace, one with its own, one without) and four
RoleBindings with users, groups and service accounts; cluster-wide, ClusterRoles with wildcard
annotations and their bindings.

Every size is loaded in a fresh process (so its memory is its own) and measured against
baselines taken in that same process:

- load: ``StaticSource.start()`` against parsing the same files with PyYAML's libyaml loader
  only (what loading cost before the faster loader); in CPU seconds of this process, which a
  busy machine inflates far less than wall time (printed too). The same objects as JSON files
  (each YAML file as one ``kind: List``, as ``kubectl get -o json`` writes) are loaded too (code
  ``json``; its baseline is ``json.loads`` of the files);
- memory: resident set after the load, and what the process held before it (imports done);
- decisions per CPU second: ``evaluate`` for an allowed and a denied review against
  ``json.loads`` of the review.

``--watch`` serves the same objects from the loopback API server of the tests (its own process)
and syncs a ``ClusterSource`` from it in a fresh process: CPU and wall time to the first
snapshot, the server's CPU meanwhile, memory, decisions/s.

Flatness of decisions/s is measured in one process holding every size's snapshot, in
``--rounds`` rounds alternating the order of sizes: per round each size's rate over the smallest
size's (measured moments apart), the median of the rounds.

The tables are printed and the figures written as JSON (``--json``, default bench-scale.json).
``--against DIR`` loads with the ``app`` package under DIR too, each size right after this one's
(``mkdir /tmp/prev && git archive v1 app | tar -x -C /tmp/prev`` for a previous version).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from bench.core.layout import ANNOTATION, LOADER, write_dir, write_json_dir
from bench.core.processes import child_env, module_command, rss_mb
from bench.core.stats import cpu_rate


def requests_for(snapshot: Any) -> list[tuple[str, Any, dict[str, Any]]]:
    """(name, parsed request, review) of a tenant's allowed and denied ConfigMap create, in the
    middle namespace of the snapshot."""
    from app.webhook.wire import parse_review
    from tests.support import make_review

    namespaces = len(snapshot.namespaces)
    ns, user = f"tenant-{namespaces // 2}", f"user-{namespaces // 2}-0"
    found = []
    for name, labels in (("allowed", {"team": "a"}), ("denied", {"team": "z"})):
        review = make_review(user, "CREATE", "configmaps", namespace=ns, labels=labels)
        found.append((name, parse_review(review).request, review))
    return found


def decision_figures(snapshot: Any, compiler: Any, seconds: float) -> dict[str, Any]:
    """Decisions per CPU second against ``json.loads`` of the same review, in this process."""
    from app.engine.context import Context, Options
    from app.engine.decide import evaluate

    ctx = Context(snapshot, Options(compiler=compiler))
    figures: dict[str, Any] = {}
    for name, request, review in requests_for(snapshot):
        decision = evaluate(request, ctx)
        assert decision.allowed == (name == "allowed"), (name, decision)
        body = json.dumps(review)
        figures[f"{name}_per_s"] = cpu_rate(lambda r=request: evaluate(r, ctx), seconds)
        figures[f"{name}_parse_per_s"] = cpu_rate(lambda b=body: json.loads(b), seconds)
    return figures


def _parse_all(directory: Path) -> int:
    """Parse every file with the format's own parser only (the baseline); the object count."""
    parsed = 0
    for path in sorted(directory.glob("*.yaml")):  # one object per document
        parsed += len(list(yaml.load_all(path.read_text(), Loader=LOADER)))
    for path in sorted(directory.glob("*.json")):
        parsed += len(json.loads(path.read_text())["items"])
    return parsed


def measure(directory: Path, seconds: float) -> dict[str, Any]:
    """In this (fresh) process: load ``directory`` and measure it against its baselines."""
    from app.engine.rbac import Compiler
    from app.source.static import StaticSource

    compiler = Compiler((ANNOTATION,))
    before = rss_mb()
    started, cpu = time.perf_counter(), time.process_time()
    source = StaticSource(directory, compiler)
    source.start()
    load_wall_s, load_s = time.perf_counter() - started, time.process_time() - cpu
    after = rss_mb()
    snapshot = source.snapshot()
    assert snapshot is not None
    cpu = time.process_time()
    parsed = _parse_all(directory)
    parse_s = time.process_time() - cpu
    return {
        "objects": parsed, "roles": len(snapshot.roles), "load_s": load_s,
        "load_wall_s": load_wall_s, "parse_s": parse_s,
        "rss_before_mb": before, "rss_after_mb": after,
        **decision_figures(snapshot, compiler, seconds),
    }  # fmt: skip


def measure_watch(kubeconfig: Path, seconds: float) -> dict[str, Any]:
    """In this (fresh) process: list and watch every kind from the API server in
    ``kubeconfig`` until the first snapshot is built, as a worker starts."""
    from app.engine.rbac import Compiler
    from app.source.api import KubeClient
    from app.source.cluster import ClusterSource
    from app.source.informer import Tuning

    compiler = Compiler((ANNOTATION,))
    before = rss_mb()
    started, cpu = time.perf_counter(), time.process_time()
    source = ClusterSource(KubeClient.connect(kubeconfig), compiler, tuning=Tuning())
    source.start()
    assert source.wait_synced(1800), source.status()
    sync_wall_s, sync_s = time.perf_counter() - started, time.process_time() - cpu
    after = rss_mb()
    snapshot = source.snapshot()
    assert snapshot is not None
    objects = sum(len(i) for i in source.informers if i.kind != "Node")
    source.stop()
    return {
        "objects": objects, "roles": len(snapshot.roles), "sync_s": sync_s,
        "sync_wall_s": sync_wall_s, "rss_before_mb": before, "rss_after_mb": after,
        **decision_figures(snapshot, compiler, seconds),
    }  # fmt: skip


def measure_flat(directories: list[Path], seconds: float, rounds: int) -> dict[str, Any]:
    """Decisions/s of every directory's snapshot in this one process, in alternating rounds:
    per round each size's rate over the smallest's (measured moments apart), median of rounds."""
    from app.engine.context import Context, Options
    from app.engine.decide import evaluate
    from app.engine.rbac import Compiler
    from app.source.static import StaticSource

    compiler = Compiler((ANNOTATION,))
    calls: list[dict[str, Any]] = []
    for directory in directories:
        source = StaticSource(directory, compiler)
        source.start()
        snapshot = source.snapshot()
        ctx = Context(snapshot, Options(compiler=compiler))
        calls.append({name: (lambda r=request, c=ctx: evaluate(r, c))
                      for name, request, _ in requests_for(snapshot)})  # fmt: skip
    window = seconds / rounds
    ratios: dict[str, list[list[float]]] = {"allowed": [], "denied": []}
    for turn in range(rounds):
        order = list(range(len(calls)))[:: 1 if turn % 2 == 0 else -1]
        for name, per_size in ratios.items():
            rates = dict.fromkeys(order, 0.0)
            for i in order:
                rates[i] = cpu_rate(calls[i][name], window, tries=1)
            per_size.append([rates[i] / rates[0] for i in range(len(calls))])
    return {
        f"{name}_vs_smallest": [statistics.median(r[i] for r in rows) for i in range(len(calls))]
        for name, rows in ratios.items()
    }


def _child(*args: str) -> dict[str, Any]:
    """Run this benchmark in a fresh process; the JSON it printed last."""
    out = subprocess.run(module_command("bench", "scale", *args), env=child_env(),
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    return dict(json.loads(out.splitlines()[-1]))


def run_watch(lists: Path, seconds: float, kubeconfig: Path) -> dict[str, Any]:
    """Serve ``lists`` from the loopback API server in one process, sync from it in another."""
    server = subprocess.Popen(
        module_command("bench", "scale", "--serve", str(lists), "--kubeconfig", str(kubeconfig)),
        env=child_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert server.stdin is not None and server.stdout is not None
    try:
        assert server.stdout.readline().strip() == "serving"
        figures = _child("--measure-watch", str(kubeconfig), "--seconds", str(seconds))
        server.stdin.write("done\n")
        server.stdin.flush()
        # The server's CPU seconds while serving (the lists, and the watches opened after).
        return {**figures, **json.loads(server.stdout.readline())}
    finally:
        server.stdin.close()
        server.wait(60)


def run(sizes: list[int], seconds: float, keep: Path | None, against: Path | None,
        watch: bool, rounds: int) -> dict[str, Any]:  # fmt: skip
    """Measure each size in a fresh process (with ``against``, that code too, right after);
    with ``watch``, the same objects through the API server; then flatness in one process."""
    from bench.core.apiserver import write_lists

    results: dict[str, Any] = {"dir": [], "watch": []}
    codes: list[tuple[str, list[str]]] = [("this", [])]
    if against is not None:
        codes.append((str(against), ["--code", str(against)]))
    with tempfile.TemporaryDirectory() as tmp:
        base = keep or Path(tmp)
        directories = []
        for size in sizes:
            directory = base / f"rbac-{size}"
            directories.append(directory)
            if not (directory / "cluster.yaml").exists():
                write_dir(directory, size)
            for code, extra in codes:
                figures = _child("--measure", str(directory), "--seconds", str(seconds), *extra)
                results["dir"].append({"size": size, "code": code, **figures})
            # The same objects as JSON files, with this code.
            json_dir = base / f"json-{size}"
            if not (json_dir / "cluster.json").exists():
                write_json_dir(directory, json_dir)
            figures = _child("--measure", str(json_dir), "--seconds", str(seconds))
            results["dir"].append({"size": size, "code": "json", **figures})
            if watch:
                lists = base / f"lists-{size}"
                if not (lists / "list-roles.json").exists():
                    write_lists(lists, size)
                figures = run_watch(lists, seconds, Path(tmp) / f"kubeconfig-{size}")
                results["watch"].append({"size": size, "code": "this", **figures})
        flat = _child("--measure-flat", ",".join(map(str, directories)),
                      "--seconds", str(seconds * len(sizes)), "--rounds", str(rounds))  # fmt: skip
        results["flat"] = [{"size": size, **{k: v[i] for k, v in flat.items()}}
                           for i, size in enumerate(sizes)]  # fmt: skip
    return results


def table(results: list[dict[str, Any]]) -> str:
    firsts: dict[str, dict[str, Any]] = {}
    lines = [
        f"{'code':>10} {'objects':>8} {'load s':>7} {'(wall)':>7} {'parse s':>8} "
        f"{'load/parse':>10} {'RSS MB':>7} "
        f"{'(before)':>8} {'allowed/s':>10} {'denied/s':>9} {'decide/parse':>12} "
        f"{'vs smallest':>11}"
    ]
    for r in results:
        first = firsts.setdefault(r["code"], r)
        decide_parse = min(r["allowed_per_s"] / r["allowed_parse_per_s"],
                           r["denied_per_s"] / r["denied_parse_per_s"])  # fmt: skip
        flat = min(r["allowed_per_s"] / first["allowed_per_s"],
                   r["denied_per_s"] / first["denied_per_s"])  # fmt: skip
        lines.append(
            f"{Path(r['code']).name[:10]:>10} {r['objects']:>8,} {r['load_s']:7.2f} "
            f"{r['load_wall_s']:7.2f} {r['parse_s']:8.2f} "
            f"{r['load_s'] / r['parse_s']:10.2f} {r['rss_after_mb']:7.0f} "
            f"{r['rss_before_mb']:8.0f} {r['allowed_per_s']:10,.0f} {r['denied_per_s']:9,.0f} "
            f"{decide_parse:12.2f} {flat:10.2f}x"
        )
    return "\n".join(lines)


def watch_table(results: dict[str, Any]) -> str:
    loads = {r["size"]: r for r in results["dir"] if r["code"] == "this"}
    lines = [f"{'objects':>8} {'sync s':>7} {'(wall)':>7} {'server s':>8} {'watch/dir':>9} "
             f"{'RSS MB':>7} {'(before)':>8} {'allowed/s':>10} {'denied/s':>9}"]  # fmt: skip
    for r in results["watch"]:
        lines.append(
            f"{r['objects']:>8,} {r['sync_s']:7.2f} {r['sync_wall_s']:7.2f} {r['server_s']:8.2f} "
            f"{r['sync_s'] / loads[r['size']]['load_s']:9.2f} {r['rss_after_mb']:7.0f} "
            f"{r['rss_before_mb']:8.0f} {r['allowed_per_s']:10,.0f} {r['denied_per_s']:9,.0f}"
        )
    return "\n".join(lines)


def flat_table(results: dict[str, Any]) -> str:
    lines = [f"{'size':>8} {'allowed vs smallest':>19} {'denied vs smallest':>18}"]
    for r in results["flat"]:
        lines.append(f"{r['size']:>8,} {r['allowed_vs_smallest']:18.2f}x "
                     f"{r['denied_vs_smallest']:17.2f}x")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000", help="objects, comma-separated")
    parser.add_argument("--seconds", type=float, default=1.5, help="per decision-rate figure")
    parser.add_argument("--json", type=Path, default=Path("bench-scale.json"))
    parser.add_argument("--keep", type=Path, help="write (and reuse) the RBAC dirs here")
    parser.add_argument("--against", type=Path, help="also measure the app package under DIR")
    parser.add_argument("--watch", action="store_true",
                        help="also sync the same objects from the loopback API server")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=9, help="alternating flatness rounds")
    parser.add_argument("--measure", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--measure-watch", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--measure-flat", help=argparse.SUPPRESS)
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--kubeconfig", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--code", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.code:
        # ``--code DIR``: the ``app`` package of another checkout (e.g. the previous release,
        # unpacked with ``git archive``), measured against the same directories in the same run.
        # First on the path, and before anything has imported ``app`` (nothing here does early).
        assert "app" not in sys.modules, "--code comes too late: app is imported already"
        sys.path.insert(0, str(args.code))
    if args.measure:
        print(json.dumps(measure(args.measure, args.seconds)))
        return
    if args.measure_watch:
        print(json.dumps(measure_watch(args.measure_watch, args.seconds)))
        return
    if args.measure_flat:
        directories = [Path(d) for d in args.measure_flat.split(",")]
        print(json.dumps(measure_flat(directories, args.seconds, args.rounds)))
        return
    if args.serve:
        from bench.core.apiserver import serve_lists

        serve_lists(args.serve, args.kubeconfig)
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    results = run(sizes, args.seconds, args.keep, args.against, args.watch, args.rounds)
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    print(table(results["dir"]))
    if args.watch:
        print("\nfrom the API server (list and watch until the first snapshot):")
        print(watch_table(results))
    print(f"\ndecisions/s in one process, median of {args.rounds} alternating rounds:")
    print(flat_table(results))
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    print(f"written to {args.json}")
