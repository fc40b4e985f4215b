"""HTTP benchmark: label-rbac against a no-op Flask webhook served the same way.

Run with ``.venv/bin/python -m bench http`` (needs ``wrk``: ``apt-get install wrk``).

Two servers run side by side on loopback, both through ``app.webhook.serve.WebhookServer`` (the same
gunicorn configuration, TLS context, JSON logger and draining wrapper):

- **label-rbac**: the real app over a static RBAC directory of ``--objects`` objects (the layout
  of ``bench.core.layout``: tenant namespaces with Roles and RoleBindings, wildcard ClusterRoles);
- **no-op**: a Flask app that parses each review and answers it without deciding anything
  (``allowed: true`` for an AdmissionReview, no opinion for a SubjectAccessReview). With
  ``--baseline wsgi`` the no-op is a plain WSGI callable instead, as label-rbac serves its two
  review endpoints: the ratio then shows what deciding costs on top of parsing and answering.

wrk drives each with the same mix of 64 reviews — tenants creating ConfigMaps in their own
namespaces, half of them with another bucket's label (denied) — for ``POST /validate``, and a
mix of label-scoped lists (half without a selector, denied) for ``POST /authorize``. Rounds
alternate between the two servers so that a machine busy with other work weighs on both alike;
each ratio is label-rbac's figure over the no-op's, per round, and the median of the rounds is
reported (throughput: higher is better, p99: lower is better).

``--churn`` serves label-rbac from the loopback API server of the tests instead, quiet against
RBAC changes streaming in through the watch (``bench/http_churn.py``).

``--models`` compares serving models (gunicorn worker class, workers and threads per worker,
keep-alive on or off), each against the no-op served the same way. The table is printed and
the figures written as JSON (``--json``, default bench-http.json). ``--client python`` drives
the servers from Python threads where wrk is not installed (slower: compare ratios only).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.core.layout import write_dir
from bench.core.load import Plan, load, lua_script, review_mix, verdicts
from bench.core.processes import cpu_seconds
from bench.core.servers import BASELINES, Model, server
from bench.core.stats import med, median_ratio


def compare(model: Model, rbac_dir: Path, tmp: Path, plan: Plan) -> list[dict[str, Any]]:
    """Alternating rounds of both servers, each path; one row per path."""
    certs, log = tmp / "certs", tmp / "servers.log"
    rounds: dict[str, dict[str, list[dict[str, float]]]] = {
        path: {"noop": [], "label-rbac": []} for path in plan.mix
    }
    with (
        server("noop", model, rbac_dir, certs, log, plan.log_level, plan.baseline) as noop,
        server("label-rbac", model, rbac_dir, certs, log, plan.log_level) as real,
    ):
        for path in plan.mix:
            allowed = verdicts(real, certs / "ca.crt", path, plan.mix[path])
            if path == "/validate" and sum(allowed) != len(allowed) // 2:
                raise SystemExit(f"expected half of the reviews denied, got {allowed}")
        for running in (noop, real):  # warm up: TLS sessions, first imports
            for path in plan.mix:
                load(running, path, plan, min(2, plan.seconds))
        for _ in range(plan.rounds):
            for path in plan.mix:
                for running in (noop, real):
                    cpu = cpu_seconds(running.process.pid)
                    figures = load(running, path, plan, plan.seconds)
                    used = cpu_seconds(running.process.pid) - cpu
                    figures["cpu_ms_per_request"] = 1e3 * used / (figures["rps"] * plan.seconds)
                    rounds[path][running.name].append(figures)
    rows = []
    for path, by_app in rounds.items():
        pairs = list(zip(by_app["noop"], by_app["label-rbac"], strict=True))
        rows.append({
            "model": str(model), **asdict(model), "path": path, "baseline": plan.baseline,
            "noop": by_app["noop"], "label_rbac": by_app["label-rbac"],
            "throughput_ratio": median_ratio(pairs, "rps"),
            "p99_ratio": median_ratio(pairs, "p99_ms"),
            "cpu_ratio": median_ratio(pairs, "cpu_ms_per_request"),
        })  # fmt: skip
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    header = ("| model | path | no-op | no-op req/s | label-rbac req/s | throughput ratio "
              "| no-op p99 ms | label-rbac p99 ms | p99 ratio | CPU/request ratio |")  # fmt: skip
    lines = [header, "|" + "---|" * 10]

    for row in rows:
        lines.append(
            f"| {row['model']} | {row['path']} | {row['baseline']} "
            f"| {med(row['noop'], 'rps'):,.0f} "
            f"| {med(row['label_rbac'], 'rps'):,.0f} | {row['throughput_ratio']:.2f} "
            f"| {med(row['noop'], 'p99_ms'):.1f} | {med(row['label_rbac'], 'p99_ms'):.1f} "
            f"| {row['p99_ratio']:.2f} | {row['cpu_ratio']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rbac-dir", type=Path, help="reuse a directory the scale benchmark wrote")
    parser.add_argument("--objects", type=int, default=8400, help="RBAC objects to serve")
    parser.add_argument(
        "--models",
        type=lambda s: [Model.parse(m) for m in s.split(",")],
        default=[Model()],
        help="e.g. gthread:2x4,gthread:2x8,sync:4x1",
    )
    parser.add_argument("--seconds", type=float, default=10, help="per wrk run")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per server")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--paths", default="/validate,/authorize")
    parser.add_argument(
        "--baseline",
        choices=tuple(BASELINES),
        default="flask",
        help="the no-op: a Flask view (default) or plain WSGI, as label-rbac serves reviews",
    )
    parser.add_argument("--log-level", default="info", help="the servers' (serve's default: info)")
    parser.add_argument("--json", type=Path, default=Path("bench-http.json"))
    parser.add_argument(
        "--churn",
        action="store_true",
        help="label-rbac over the loopback API server, quiet against RBAC "
        "changes streaming in (see bench/http_churn.py)",
    )
    parser.add_argument("--rate", type=float, default=50.0, help="--churn: changes per second")
    parser.add_argument(
        "--lists", type=Path, help="--churn: write (once) and reuse the API server's lists here"
    )
    parser.add_argument(
        "--client",
        choices=("wrk", "python"),
        default="wrk" if shutil.which("wrk") else "python",
        help="load generator (python: threads, where wrk is not installed)",
    )
    args = parser.parse_args(argv)
    if args.client == "wrk" and shutil.which("wrk") is None:
        raise SystemExit("bench http: wrk not found (apt-get install wrk, or --client python)")
    from app.webhook.certs import generate

    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        generate(tmp / "certs", ["localhost", "127.0.0.1"])
        # Under churn only /validate is measured (the changes alter admission decisions).
        paths = ["/validate"] if args.churn else args.paths.split(",")
        mix = review_mix(args.objects)
        scripts = {path: tmp / f"{path.strip('/')}.lua" for path in paths}
        for path in paths:
            lua_script(scripts[path], mix[path])
        plan = Plan({path: mix[path] for path in paths}, scripts, tmp / "certs" / "ca.crt",
                    args.client, args.connections, args.seconds, args.rounds,
                    args.log_level, args.baseline)  # fmt: skip
        rows = churn(args, plan, tmp) if args.churn else against_noop(args, plan, tmp)
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    args.json.write_text(json.dumps(rows, indent=1))


def against_noop(args: argparse.Namespace, plan: Plan, tmp: Path) -> list[dict[str, Any]]:
    """Every serving model against the no-op served the same way, over a static directory."""
    rbac_dir = args.rbac_dir
    if rbac_dir is None:
        rbac_dir = tmp / "rbac"
        objects = write_dir(rbac_dir, args.objects)
        print(f"{objects:,} RBAC objects; {os.cpu_count()} CPUs; {args.client} "
              f"-c{args.connections}, "
              f"{args.rounds} rounds of {args.seconds:g} s per server and path")  # fmt: skip
    rows: list[dict[str, Any]] = []
    for model in args.models:
        rows += compare(model, rbac_dir, tmp, plan)
        print(table(rows), flush=True)
    return rows


def churn(args: argparse.Namespace, plan: Plan, tmp: Path) -> list[dict[str, Any]]:
    """Every serving model over the cluster source, quiet against churn (bench.http_churn)."""
    from bench import http_churn
    from bench.core.apiserver import write_lists

    lists = args.lists or tmp / "lists"
    if not (lists / "list-roles.json").exists():
        write_lists(lists, args.objects)
    print(f"{args.objects:,} RBAC objects from the API server; {os.cpu_count()} CPUs; "
          f"{args.client} -c{args.connections}, {args.rounds} rounds of {args.seconds:g} s "
          f"quiet and churning at {args.rate:g} changes/s")  # fmt: skip
    rows = []
    for model in args.models:
        rows.append(http_churn.measure(args.objects, lists, model, plan, args.rate, tmp))
        print(http_churn.table(rows), flush=True)
    return rows
