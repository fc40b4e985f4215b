"""HTTP benchmark: label-rbac against a no-op Flask webhook served the same way.

Run with ``.venv/bin/python scripts/bench_http.py`` (needs ``wrk``: ``apt-get install wrk``).

Two servers run side by side on loopback, both through ``app.serve.WebhookServer`` (the same
gunicorn configuration, TLS context, JSON logger and draining wrapper):

- **label-rbac**: the real app over a static RBAC directory of ``--objects`` objects (the layout
  of ``bench_scale.py``: tenant namespaces with Roles and RoleBindings, wildcard ClusterRoles);
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
RBAC changes streaming in through the watch (``scripts/bench_http_churn.py``).

``--models`` compares serving models (gunicorn worker class, workers and threads per worker,
keep-alive on or off), each against the no-op served the same way. The table is printed and
the figures written as JSON (``--json``, default bench-http.json). ``--client python`` drives
the servers from Python threads where wrk is not installed (slower: compare ratios only).
"""

from __future__ import annotations

import sys

if "--serve" in sys.argv and any(arg.startswith("gevent:") for arg in sys.argv):
    # gevent's worker needs the standard library patched before anything imports ssl or
    # threading (the arbiter builds the TLS context before it forks): as gevent's docs say,
    # first thing in the process.
    from gevent import monkey

    monkey.patch_all()

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

REVIEWS = 64
# gunicorn's worker classes measured: the two that need nothing beyond gunicorn, and gevent's
# (``pip install gevent``: not a dependency of label-rbac; measured to see whether it would pay).
WORKER_CLASSES = ("gthread", "sync", "gevent")


@dataclass(frozen=True)
class Model:
    """How gunicorn serves: worker class, processes, threads per process, keep-alive seconds."""

    worker_class: str = "gthread"
    workers: int = 2
    threads: int = 4
    keepalive: int = 75

    @classmethod
    def parse(cls, text: str) -> Model:
        """``gthread:2x4``, ``sync:4x1``, ``gthread:2x4:ka0`` (keep-alive off); for gevent the
        threads are ignored (each worker serves any number of connections)."""
        match = re.fullmatch(r"(\w+):(\d+)x(\d+)(?::ka(\d+))?", text)
        if match is None or match[1] not in WORKER_CLASSES:
            raise argparse.ArgumentTypeError(
                f"{text!r}: expected CLASS:WORKERSxTHREADS[:kaSECONDS], CLASS one of "
                f"{', '.join(WORKER_CLASSES)}"
            )
        keepalive = 75 if match[4] is None else int(match[4])
        return cls(match[1], int(match[2]), int(match[3]), keepalive)

    def __str__(self) -> str:
        return f"{self.worker_class}:{self.workers}x{self.threads}:ka{self.keepalive}"


# --- the servers (run in a child process: ``bench_http.py --serve APP ...``) ---------------------


def noop_app() -> Any:
    """A Flask webhook that parses each review and answers it without a decision."""
    from flask import Flask, jsonify, request

    app = Flask("noop")

    @app.post("/validate")
    def validate() -> Any:
        review = request.get_json()
        return jsonify(
            apiVersion=review["apiVersion"],
            kind="AdmissionReview",
            response={"uid": review["request"]["uid"], "allowed": True},
        )

    @app.post("/authorize")
    def authorize() -> Any:
        review = request.get_json()
        return jsonify(
            apiVersion=review["apiVersion"],
            kind="SubjectAccessReview",
            status={"allowed": False},
        )

    @app.get("/readyz")
    def readyz() -> Any:
        return jsonify(ready=True)

    return app


def noop_wsgi() -> Any:
    """The same no-op as plain WSGI: parse the review, answer it, nothing else."""

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        path = environ["PATH_INFO"]
        if path == "/validate":
            review = json.loads(environ["wsgi.input"].read())
            answer = {"apiVersion": review["apiVersion"], "kind": "AdmissionReview",
                      "response": {"uid": review["request"]["uid"], "allowed": True}}  # fmt: skip
        elif path == "/authorize":
            review = json.loads(environ["wsgi.input"].read())
            answer = {"apiVersion": review["apiVersion"], "kind": "SubjectAccessReview",
                      "status": {"allowed": False}}  # fmt: skip
        else:
            answer = {"ready": True}
        body = json.dumps(answer).encode()
        start_response("200 OK", [("Content-Type", "application/json"),
                                  ("Content-Length", str(len(body)))])  # fmt: skip
        return [body]

    return app


BASELINES = {"flask": noop_app, "wsgi": noop_wsgi}


def tagged(app: Any) -> Any:
    """``app`` answering with the worker's process id in ``X-Worker`` (to tell workers apart)."""
    header = ("X-Worker", str(os.getpid()))

    def call(environ: Any, start_response: Any) -> Any:
        def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            return start_response(status, [*headers, header], exc_info)

        return app(environ, start)

    return call


def run_server(
    app_name: str,
    model: Model,
    rbac_dir: Path | None,
    bind: str,
    certs: Path,
    log_level: str,
    baseline: str = "flask",
    kubeconfig: Path | None = None,
) -> None:
    from app.serve import WebhookServer, draining_readiness
    from app.settings import Settings

    settings = Settings(
        annotation_keys=("labelrbac.io/permissions",),
        rbac_dir=None if kubeconfig else rbac_dir,
        kubeconfig=kubeconfig,
        bind=bind,
        workers=model.workers,
        threads=model.threads,
        tls_cert=certs / "tls.crt",
        tls_key=certs / "tls.key",
        log_level=log_level,
    )

    class BenchServer(WebhookServer):
        def load_config(self) -> None:
            super().load_config()
            self.cfg.set("worker_class", model.worker_class)
            self.cfg.set("keepalive", model.keepalive)

        def load(self) -> Any:
            # (In the worker, after fork: each worker tags its answers with its own pid.)
            if app_name == "noop":
                return tagged(draining_readiness(BASELINES[baseline](), self.draining))
            return tagged(super().load())

    BenchServer(settings).run()


@dataclass
class Running:
    name: str
    url: str
    process: subprocess.Popen[bytes]


@contextmanager
def server(
    app_name: str,
    model: Model,
    rbac_dir: Path | None,
    certs: Path,
    log: Path,
    log_level: str,
    baseline: str = "flask",
    kubeconfig: Path | None = None,
) -> Iterator[Running]:
    """``app_name`` served on a free loopback port, over ``rbac_dir`` or the cluster of
    ``kubeconfig``; ready (one worker answering /readyz) when entered, stopped on exit."""
    from tests.process import free_port, stop

    port = free_port()
    source = ["--kubeconfig", str(kubeconfig)] if kubeconfig else ["--rbac-dir", str(rbac_dir)]
    command = [sys.executable, __file__, "--serve", app_name, "--model", str(model), *source,
               "--bind", f"127.0.0.1:{port}", "--certs", str(certs),
               "--log-level", log_level, "--baseline", baseline]  # fmt: skip
    with log.open("ab") as out:
        process = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=out,
                                   start_new_session=True)  # fmt: skip
    running = Running(app_name, f"https://127.0.0.1:{port}", process)
    try:
        # A worker syncing 100k objects from the API server takes a while to be ready.
        wait_ready(running, certs / "ca.crt", 600 if kubeconfig else 120)
        yield running
    finally:
        stop(process)


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) of a gunicorn arbiter's workers so far (they are its children)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            try:
                stat = Path(f"/proc/{child}/stat").read_text()
            except FileNotFoundError:  # a worker restarting
                continue
            fields = stat[stat.rindex(")") + 2 :].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / ticks


def wait_ready(running: Running, ca: Path, timeout: float = 120) -> None:
    import ssl

    context = ssl.create_default_context(cafile=str(ca))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if running.process.poll() is not None:
            raise SystemExit(f"{running.name} server exited with {running.process.returncode}")
        try:
            with urllib.request.urlopen(running.url + "/readyz", context=context, timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"{running.name} server not ready after {timeout:.0f} s")


# --- the load ------------------------------------------------------------------------------------


def review_mix(objects: int) -> dict[str, list[dict[str, Any]]]:
    """64 AdmissionReviews and 64 SubjectAccessReviews from tenants of the generated layout,
    every other one denied."""
    from bench_scale import layout

    from tests.support import make_access_review, make_review

    namespaces, _ = layout(objects)
    admission, access = [], []
    for i in range(REVIEWS):
        tenant = (i * 7919) % namespaces
        # Users 1 and 2 hold only their namespace's shared role (team a or b); user 0 is also
        # bound to a wildcard ClusterRole, which would allow every label.
        ns, user = f"tenant-{tenant}", f"user-{tenant}-{1 + i % 2}"
        team = "a" if i % 2 == 0 else "z"  # team=z is in nobody's bucket
        admission.append(make_review(user, "CREATE", "configmaps", namespace=ns,
                                     name=f"cm-{i}", labels={"team": team}))  # fmt: skip
        selector = [("team", "In", ["a"])] if i % 2 == 0 else None
        access.append(make_access_review(user, "list", "configmaps", namespace=ns,
                                         selector=selector))  # fmt: skip
    return {"/validate": admission, "/authorize": access}


def verdicts(running: Running, ca: Path, path: str, bodies: list[dict[str, Any]]) -> list[bool]:
    """Each review sent once: whether it was allowed (to check the mix is what it claims)."""
    import ssl

    context = ssl.create_default_context(cafile=str(ca))
    found = []
    for body in bodies:
        request = urllib.request.Request(running.url + path, data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(request, context=context, timeout=10) as response:
            answer = json.loads(response.read())
        found.append(bool((answer.get("response") or answer.get("status") or {})["allowed"]))
    return found


def lua_script(path: Path, bodies: list[dict[str, Any]]) -> None:
    """A wrk script cycling through ``bodies``, each connection from its own offset."""
    items = ",\n".join(json.dumps(json.dumps(b)) for b in bodies)
    path.write_text(
        f"local bodies = {{\n{items}\n}}\n"
        "local i = 0\n"
        'wrk.method = "POST"\n'
        'wrk.headers["Content-Type"] = "application/json"\n'
        "init = function(args) i = math.random(#bodies) end\n"
        "request = function()\n"
        "  i = i % #bodies + 1\n"
        "  return wrk.format(nil, nil, nil, bodies[i])\n"
        "end\n"
    )


_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def _ms(text: str) -> float:
    number, unit = re.fullmatch(r"([\d.]+)(us|ms|s)", text).groups()  # type: ignore[union-attr]
    return float(number) * _UNITS[unit]


def wrk(url: str, script: Path, seconds: float, connections: int) -> dict[str, float]:
    threads = min(2, connections)  # wrk needs a connection per thread
    out = subprocess.run(
        ["wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds:g}s", "--latency",
         "-s", str(script), url],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    lines = out.splitlines()

    def field(prefix: str) -> str:
        return next(ln for ln in lines if ln.strip().startswith(prefix)).split()[1]

    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    sockets = re.search(r"Socket errors: (.*)", out)
    return {
        "rps": float(field("Requests/sec")),
        "p50_ms": _ms(field("50%")),
        "p99_ms": _ms(field("99%")),
        "non_2xx": float(errors[1]) if errors else 0.0,
        "socket_errors": float(sum(map(int, re.findall(r"\d+", sockets[1])))) if sockets else 0.0,
    }


def python_load(
    url: str, ca: Path, bodies: list[bytes], seconds: float, connections: int
) -> dict[str, float]:
    """What ``wrk`` measures, from Python threads (where wrk is not installed, e.g. in CI):
    ``connections`` keep-alive connections, each posting the bodies in turn for ``seconds``."""
    import http.client
    import ssl
    import threading
    from urllib.parse import urlsplit

    context = ssl.create_default_context(cafile=str(ca))
    parts = urlsplit(url)
    latencies: list[float] = []
    errors = [0]
    deadline = time.monotonic() + seconds

    def client(offset: int) -> None:
        conn = http.client.HTTPSConnection(parts.hostname or "", parts.port, context=context)
        i = offset
        while (started := time.monotonic()) < deadline:
            conn.request("POST", parts.path, bodies[i % len(bodies)],
                         {"Content-Type": "application/json"})  # fmt: skip
            response = conn.getresponse()
            response.read()
            latencies.append(time.monotonic() - started)
            errors[0] += response.status != 200
            i += 1
        conn.close()

    threads = [threading.Thread(target=client, args=(n,)) for n in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    latencies.sort()

    def quantile(q: float) -> float:
        return 1e3 * latencies[min(len(latencies) - 1, int(q * len(latencies)))]

    return {"rps": len(latencies) / seconds, "p50_ms": quantile(0.5), "p99_ms": quantile(0.99),
            "non_2xx": float(errors[0]), "socket_errors": 0.0}  # fmt: skip


@dataclass(frozen=True)
class Plan:
    """What every comparison runs: the reviews per path, how they are sent, for how long."""

    mix: dict[str, list[dict[str, Any]]]
    scripts: dict[str, Path]  # wrk's, per path
    ca: Path
    client: str
    connections: int
    seconds: float
    rounds: int
    log_level: str
    baseline: str  # the no-op: "flask" or "wsgi"


def load(running: Running, path: str, plan: Plan, seconds: float) -> dict[str, float]:
    if plan.client == "wrk":
        return wrk(running.url + path, plan.scripts[path], seconds, plan.connections)
    bodies = [json.dumps(b).encode() for b in plan.mix[path]]
    return python_load(running.url + path, plan.ca, bodies, seconds, plan.connections)


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
            "throughput_ratio": statistics.median(r["rps"] / n["rps"] for n, r in pairs),
            "p99_ratio": statistics.median(r["p99_ms"] / n["p99_ms"] for n, r in pairs),
            "cpu_ratio": statistics.median(
                r["cpu_ms_per_request"] / n["cpu_ms_per_request"] for n, r in pairs
            ),
        })  # fmt: skip
    return rows


def med(runs: list[dict[str, float]], key: str) -> float:
    """The median of one figure over a server's rounds."""
    return statistics.median(r[key] for r in runs)


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", choices=("noop", "label-rbac"), help=argparse.SUPPRESS)
    parser.add_argument("--bind", help=argparse.SUPPRESS)
    parser.add_argument("--certs", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--rbac-dir", type=Path, help="reuse a directory bench_scale.py wrote")
    parser.add_argument("--kubeconfig", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--model", type=Model.parse, default=Model(), help=argparse.SUPPRESS)
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
        "changes streaming in (see scripts/bench_http_churn.py)",
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
    args = parser.parse_args()
    if args.serve:
        run_server(args.serve, args.model, args.rbac_dir, args.bind, args.certs, args.log_level,
                   args.baseline, args.kubeconfig)  # fmt: skip
        return
    if args.client == "wrk" and shutil.which("wrk") is None:
        raise SystemExit("bench_http: wrk not found (apt-get install wrk, or --client python)")
    from app.certs import generate

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
    from bench_scale import write_dir

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
    """Every serving model over the cluster source, quiet against churn (bench_http_churn)."""
    import bench_http_churn
    from bench_traffic import write_lists

    lists = args.lists or tmp / "lists"
    if not (lists / "list-roles.json").exists():
        write_lists(lists, args.objects)
    print(f"{args.objects:,} RBAC objects from the API server; {os.cpu_count()} CPUs; "
          f"{args.client} -c{args.connections}, {args.rounds} rounds of {args.seconds:g} s "
          f"quiet and churning at {args.rate:g} changes/s")  # fmt: skip
    rows = []
    for model in args.models:
        rows.append(bench_http_churn.measure(args.objects, lists, model, plan, args.rate, tmp))
        print(bench_http_churn.table(rows), flush=True)
    return rows


if __name__ == "__main__":
    main()
