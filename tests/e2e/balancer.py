"""HAProxy in front of webhook replicas, as a Service (or a cloud load balancer) stands there.

TCP mode: TLS passes through to the replicas, so the API server verifies the replicas' own
serving certificate against the webhook's caBundle. Each replica is health-checked on
``/readyz`` over HTTPS every ``INTERVAL``: a replica that drains (503) or dies leaves the
rotation within two checks, as a pod leaves a Service's endpoints. A connection refused by a
dead replica is redispatched to another (``retries`` + ``option redispatch``).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

from tests.kube.controlplane import Unavailable, _die_with_parent
from tests.process import free_port

INTERVAL_MS = 250

CONFIG = """\
global
    maxconn 2000
    stats socket {socket} mode 600 level admin
    # One line per connection with how it ended (haproxy.log): what explains a failed call.
    log stderr format raw local0

defaults
    mode tcp
    log global
    option tcplog
    timeout connect 1s
    timeout client 60s
    timeout server 60s
    timeout check 1s
    retries 3
    option redispatch

frontend webhook
    bind 127.0.0.1:{port}
    default_backend replicas

backend replicas
    balance roundrobin
    option httpchk GET /readyz
    http-check expect status 200
    default-server inter {interval}ms fall 2 rise 2 check check-ssl verify none
{servers}
"""


def binary() -> str:
    """The haproxy executable; ``Unavailable`` (with how to get it) when there is none."""
    found = shutil.which("haproxy") or (
        "/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").is_file() else None
    )
    if found is None:
        raise Unavailable("haproxy is not installed (apt-get install haproxy)")
    return found


class Balancer:
    """HAProxy on loopback ``port`` (a free one by default) in front of ``replicas`` (name ->
    port); ``start()``, ``stop()``."""

    def __init__(self, workdir: Path, replicas: Mapping[str, int], port: int | None = None) -> None:
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port() if port is None else port
        self.url = f"https://127.0.0.1:{self.port}"
        self.socket = workdir / "haproxy.sock"
        servers = "\n".join(
            f"    server {name} 127.0.0.1:{port}" for name, port in replicas.items()
        )
        self.config = workdir / "haproxy.cfg"
        self.config.write_text(
            CONFIG.format(socket=self.socket, port=self.port, interval=INTERVAL_MS, servers=servers)
        )
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with (self.workdir / "haproxy.log").open("ab") as log:
            self.process = subprocess.Popen(
                [binary(), "-db", "-f", str(self.config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        deadline = time.monotonic() + 10
        while not self.socket.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                log = (self.workdir / "haproxy.log").read_text()
                raise RuntimeError(f"haproxy did not start: {log}")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def states(self) -> dict[str, str]:
        """Each replica's state as the balancer sees it (``UP``, ``DOWN``, ``UP 1/2``...)."""
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(5)
            sock.connect(str(self.socket))
            sock.sendall(b"show stat\n")
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        lines = data.decode().splitlines()
        header = lines[0].lstrip("# ").split(",")
        rows = [dict(zip(header, line.split(","), strict=False)) for line in lines[1:] if line]
        return {
            row["svname"]: row["status"]
            for row in rows
            if row.get("pxname") == "replicas" and row["svname"] not in ("FRONTEND", "BACKEND")
        }

    def wait_state(self, name: str, state: str, timeout: float = 30) -> None:
        """Until the balancer sees replica ``name`` in ``state`` (exactly, e.g. ``UP``)."""
        deadline = time.monotonic() + timeout
        while (seen := self.states().get(name)) != state:
            if time.monotonic() > deadline:
                raise AssertionError(f"haproxy sees {name} {seen}, not {state}, after {timeout}s")
            time.sleep(0.05)
