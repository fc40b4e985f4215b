"""The servers of the HTTP benchmarks: label-rbac and a no-op webhook, served the same way.

Both run through ``app.webhook.serve.WebhookServer`` (the same gunicorn configuration, TLS context,
JSON logger and draining wrapper) in a child process of their own, ``python -m bench.core.servers``,
with the serving model (gunicorn worker class, workers, threads, keep-alive) under test. Each
worker tags its answers with its process id in ``X-Worker``, to tell workers apart.
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and any(arg.startswith("gevent:") for arg in sys.argv):
    # gevent's worker needs the standard library patched before anything imports ssl or
    # threading (the arbiter builds the TLS context before it forks): as gevent's docs say,
    # first thing in the process.
    from gevent import monkey

    monkey.patch_all()

import argparse
import json
import os
import re
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.core.processes import ROOT, module_command

# gunicorn's worker classes measured: what ``serve`` runs (staged: one event loop per worker
# framing requests with h11, threads for the app, app.webhook.connections), the two that need
# nothing beyond gunicorn, and gevent's (``pip install gevent``: not a dependency of label-rbac;
# measured to see whether it would pay).
WORKER_CLASSES = ("staged", "gthread", "sync", "gevent")
WORKER_PATHS = {"staged": "app.webhook.connections.StagedWorker"}


@dataclass(frozen=True)
class Model:
    """How gunicorn serves: worker class, processes, threads per process, keep-alive seconds."""

    worker_class: str = "staged"
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
    from app.settings import Settings
    from app.webhook.serve import WebhookServer, draining_readiness

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
            worker_class = model.worker_class
            self.cfg.set("worker_class", WORKER_PATHS.get(worker_class, worker_class))
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
    command = module_command("bench.core.servers", app_name, "--model", str(model), *source,
                             "--bind", f"127.0.0.1:{port}", "--certs", str(certs),
                             "--log-level", log_level, "--baseline", baseline)  # fmt: skip
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


def main(argv: list[str] | None = None) -> None:
    """The child process of ``server``: serve until stopped."""
    parser = argparse.ArgumentParser(description="Serve label-rbac or the no-op for a benchmark.")
    parser.add_argument("app", choices=("noop", "label-rbac"))
    parser.add_argument("--model", type=Model.parse, default=Model())
    parser.add_argument("--rbac-dir", type=Path)
    parser.add_argument("--kubeconfig", type=Path)
    parser.add_argument("--bind", required=True)
    parser.add_argument("--certs", type=Path, required=True)
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--baseline", choices=tuple(BASELINES), default="flask")
    args = parser.parse_args(argv)
    run_server(args.app, args.model, args.rbac_dir, args.bind, args.certs, args.log_level,
               args.baseline, args.kubeconfig)  # fmt: skip


if __name__ == "__main__":
    main()
