"""label-rbac's pieces in a loopback control plane, for the benchmarks that run a real one.

The compiled component's manifests (``manifests/compiled``) as objects, and the webhook as a
cluster runs it: the shipped RBAC and ValidatingWebhookConfiguration of ``manifests/enforce``
(its Service replaced by the loopback address, as tests/kube/cluster.py installs it) and the
real ``python -m app serve`` process as its ServiceAccount. And a small HTTPS client for the
API server, one keep-alive connection per thread.
"""

from __future__ import annotations

import base64
import copy
import http.client
import json
import os
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from app.compiled.admission_policy import COMPILER
from app.webhook.certs import CertPaths, generate
from bench.core.processes import ROOT, cpu_seconds, process_cpu
from tests.kube.controlplane import ADMIN, WEBHOOK_USER, ControlPlane
from tests.process import Server, launch, stop

COMPILED = ROOT / "manifests" / "compiled"
# The Service name the webhook's serving certificate is issued for (manifests/deploy).
SERVICE_NAME = "label-rbac.label-rbac.svc"
# What a cluster runs instead of the manifests' Deployment, Service and cert-manager objects.
NOT_APPLIED = {"Deployment", "Service", "Certificate", "Issuer", "ServiceMonitor",
               "ValidatingWebhookConfiguration"}  # fmt: skip
# manifests/deploy's registration-only compiler and its guard, which manifests/compiled replaces
# under the same names (manifests/without-narrowing removes them for manifests/enforce-compiled).
NARROWING = frozenset(
    (d["kind"], d["metadata"]["name"])
    for name in ("narrowing.yaml", "registration-guard.yaml")
    for d in yaml.safe_load_all((ROOT / "manifests" / "deploy" / name).read_text())
    if d
)


def documents(name: str, root: Path = ROOT) -> list[dict[str, Any]]:
    """The objects of manifests/compiled/``name`` (of the checkout at ``root``)."""
    path = root / COMPILED.relative_to(ROOT) / name
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def kustomize(overlay: str) -> list[dict[str, Any]]:
    """``kubectl kustomize manifests/<overlay>``: the objects a user's ``apply -k`` creates."""
    done = subprocess.run(["kubectl", "kustomize", str(ROOT / "manifests" / overlay)],
                          capture_output=True, text=True, check=True)  # fmt: skip
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def webhook_configuration(docs: list[dict[str, Any]], url: str, ca: bytes) -> dict[str, Any]:
    """The shipped ValidatingWebhookConfiguration, each entry's Service replaced by ``url``."""
    (config,) = [copy.deepcopy(d) for d in docs if d["kind"] == "ValidatingWebhookConfiguration"]
    config["metadata"].get("annotations", {}).pop("cert-manager.io/inject-ca-from", None)
    for entry in config["webhooks"]:
        service = entry["clientConfig"].pop("service")
        entry["clientConfig"] = {"url": url + service.get("path", "/"),
                                 "caBundle": base64.b64encode(ca).decode()}  # fmt: skip
    return config


class Webhook:
    """label-rbac's webhook as a cluster runs it: the shipped RBAC and registration, the real
    ``python -m app serve`` process as its ServiceAccount; registered only while measured."""

    def __init__(self, cp: ControlPlane, workdir: Path, *, full_compiler: bool = False) -> None:
        """``full_compiler``: manifests/compiled's compiler runs (its RBAC applied already), so
        the registration-only compiler's objects of the same names are left out."""
        self.cp = cp
        self.docs = kustomize("enforce")
        skipped = NARROWING if full_compiler else frozenset()
        cp.apply(ADMIN, [d for d in self.docs if d["kind"] not in NOT_APPLIED
                         and (d["kind"], d["metadata"]["name"]) not in skipped])  # fmt: skip
        self.tls: CertPaths = generate(workdir / "webhook-tls",
                                       [SERVICE_NAME, "127.0.0.1", "localhost"])  # fmt: skip
        kubeconfig = str(cp.kubeconfig(WEBHOOK_USER.name))
        tls = (self.tls.ca, self.tls.cert, self.tls.key)
        self.server: Server = launch(workdir, "--kubeconfig", kubeconfig, tls=tls,
                                     log_name="webhook.log")  # fmt: skip
        self.server.wait_ready()
        self.config = webhook_configuration(self.docs, self.server.base_url,
                                            self.tls.ca.read_bytes())  # fmt: skip

    def cpu(self) -> float:
        """CPU seconds of the server's arbiter and workers so far."""
        pid = self.server.process.pid
        return process_cpu(pid) + cpu_seconds(pid)

    def stop(self) -> None:
        stop(self.server.process)


class Client:
    """One keep-alive HTTPS connection per thread to a server, as one user (or none)."""

    def __init__(self, url: str, ca: Path, token: str | None = None) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 443
        self.context = ssl.create_default_context(cafile=str(ca))
        self.token = token
        self.local = threading.local()

    def _connection(self) -> http.client.HTTPSConnection:
        found = getattr(self.local, "connection", None)
        if found is None:
            found = self.local.connection = http.client.HTTPSConnection(
                self.host, self.port, context=self.context, timeout=30
            )
        return found

    def send(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        sent = {"Content-Type": "application/json", **(headers or {})}
        if self.token:
            sent["Authorization"] = f"Bearer {self.token}"
        data = None if body is None else json.dumps(body).encode()
        for attempt in range(2):
            connection = self._connection()
            try:
                connection.request(method, path, data, sent)
                response = connection.getresponse()
                raw = response.read()
                return response.status, json.loads(raw) if raw else None
            except (OSError, http.client.HTTPException):
                connection.close()
                self.local.connection = None
                if attempt:
                    raise
        raise AssertionError("unreachable")


def start_compiler(
    cp: ControlPlane,
    workdir: Path,
    *args: str,
    identity: str = "bench",
    root: Path = ROOT,
    log_name: str = "compiler.log",
) -> subprocess.Popen[bytes]:
    """``label-rbac compile`` (of the checkout at ``root``; ``args`` added) against ``cp`` as the
    compiler's ServiceAccount, logging to ``workdir/<log_name>``."""
    with (workdir / log_name).open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "app", "compile", "--kubeconfig",
             str(cp.kubeconfig(COMPILER)), "--identity", identity, *args],
            cwd=root, stdout=log, stderr=subprocess.STDOUT,
            env={**os.environ, "KUBECONFIG": "", "PYTHONPATH": str(root)},
            start_new_session=True,
        )  # fmt: skip


def compiler_metrics(port: int) -> dict[str, float]:
    """The running compiler's metrics (``--probe-bind 127.0.0.1:port``); empty while it does
    not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except (OSError, urllib.error.URLError):
        return {}
    found = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            found[name] = float(value)
    return found


def compiler_idle(
    process: subprocess.Popen[bytes],
    port: int,
    quiet: float,
    timeout: float,
    started: float | None = None,
    calm: Callable[[], bool] = lambda: True,
) -> float:
    """Wait until the compiler leads, has nothing pending, writes nothing, spends (almost) no
    CPU and meets ``calm`` for ``quiet`` seconds (a render of every namespace, which a start or
    a newly restricted resource asks for, is done); the seconds from ``started`` (default: now)
    to the start of that calm. Raises after ``timeout`` seconds from ``started``."""
    started = time.monotonic() if started is None else started
    calm_since: float | None = None
    last: tuple[float, float] | None = None
    while time.monotonic() - started < timeout:
        if process.poll() is not None:
            raise RuntimeError(f"the compiler exited with {process.returncode}")
        m = compiler_metrics(port)
        now = (m.get("label_rbac_compiler_params_written_total", -1.0), process_cpu(process.pid))
        idle = (
            m.get("label_rbac_compiler_leader") == 1
            and m.get("label_rbac_compiler_pending_seconds", 1.0) == 0
            and last is not None
            and now[0] == last[0]
            and now[1] - last[1] < 0.1
            and calm()
        )
        calm_since = (calm_since or time.monotonic()) if idle else None
        if calm_since is not None and time.monotonic() - calm_since >= quiet:
            return calm_since - started
        last = now
        time.sleep(0.5)
    raise RuntimeError("the compiler did not settle in time")


def count(admin: Client, path: str) -> int:
    """How many objects the collection at ``path`` holds (one item listed)."""
    status, answer = admin.send("GET", f"{path}?limit=1")
    if status != 200:
        return 0
    return len(answer["items"]) + int(answer["metadata"].get("remainingItemCount", 0))


def dormant(config: dict[str, Any]) -> dict[str, Any]:
    """The shipped webhook registration selecting no namespace: the API server never calls it
    (the webhook is asked directly), while the compiler keeps its coverage condition in it as
    it does in a cluster (``app.compiled.registration``)."""
    never = {"matchLabels": {"labelrbac.io/bench-never": "true"}}
    return {**config, "webhooks": [{**w, "namespaceSelector": never} for w in config["webhooks"]]}


def stamp(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def profiling(cp: ControlPlane, seconds: int, into: Path | None) -> subprocess.Popen[bytes] | None:
    """The API server's CPU profile over the next ``seconds``, written to
    ``into`` (read it with ``go tool pprof -top``), as a running curl; None without ``into``."""
    if into is None:
        return None
    url = f"{cp.url}/debug/pprof/profile?seconds={seconds}"
    token = cp.users[ADMIN].token
    return subprocess.Popen(
        ["curl", "-sf", "--cacert", str(cp.ca), "-H", f"Authorization: Bearer {token}",
         "-o", str(into), url],
    )  # fmt: skip
