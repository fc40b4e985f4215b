"""Run the real server process (``python -m app serve``) and talk HTTPS to it."""

from __future__ import annotations

import json
import os
import resource
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from tests.support import ROOT


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Server:
    base_url: str
    ca: Path
    process: subprocess.Popen[str]
    log: Path = Path("server.log")

    def context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca))

    def request(
        self, method: str, path: str, body: bytes | None = None, timeout: float = 10
    ) -> tuple[int, Any]:
        req = urllib.request.Request(
            self.base_url + path,
            data=body,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, context=self.context(), timeout=timeout) as resp:
                return resp.status, _decode(resp.read())
        except urllib.error.HTTPError as err:
            return err.code, _decode(err.read())

    def connect(self, timeout: float = 10) -> ssl.SSLSocket:
        """A raw TLS connection, for requests an HTTP client library would not send."""
        host, port = self.base_url.removeprefix("https://").split(":")
        sock = socket.create_connection((host, int(port)), timeout=timeout)
        return self.context().wrap_socket(sock, server_hostname=host)

    def review(self, review: dict[str, Any]) -> dict[str, Any]:
        status, body = self.request("POST", "/validate", json.dumps(review).encode())
        assert status == 200, body
        return body

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        last: object = None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"server exited with {self.process.returncode}")
            try:
                status, last = self.request("GET", "/readyz", timeout=2)
                if status == 200:
                    return
            except (OSError, ssl.SSLError) as exc:
                last = exc
            time.sleep(0.1)
        raise AssertionError(f"server not ready after {timeout}s: {last}")


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def read_reply(sock: ssl.SSLSocket) -> Reply:
    """One HTTP/1.1 response with a Content-Length, read off a raw connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"connection closed before a full response: {data!r}")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    if status == 100:  # an interim answer to Expect: 100-continue, alone on the wire
        assert not rest, rest
        return Reply(status, headers, b"")
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("connection closed mid-body")
        rest += chunk
    return Reply(status, headers, rest[:length])


def client_hello() -> bytes:
    """A real TLS client's first flight, as it goes on the wire (for half-open connections)."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ssl.create_default_context().wrap_bio(incoming, outgoing, server_hostname="localhost")
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:
        return outgoing.read()
    raise AssertionError("a TLS handshake cannot finish without a server")


def established(port: int, peers: tuple[str, ...]) -> int:
    """Server-side TCP connections on ``port`` from the IPv4 ``peers`` still open: what the
    server holds, as the kernel sees it (/proc/net/tcp, state ESTABLISHED)."""
    wanted = {socket.inet_aton(peer)[::-1].hex().upper() for peer in peers}
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote, state = fields[1], fields[2], fields[3]
        if state == "01" and int(local.split(":")[1], 16) == port:
            count += remote.split(":")[0] in wanted
    return count


def _decode(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")


def stop(process: subprocess.Popen[Any], timeout: float = 15) -> None:
    """SIGTERM to the server's process group (arbiter and workers), SIGKILL if it lingers."""
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def launch(
    tmp: Path,
    *args: str,
    env: dict[str, str] | None = None,
    tls: tuple[Path, Path, Path] | None = None,
    port: int | None = None,
    log_name: str = "server.log",
    nofile: tuple[int, int] | None = None,
) -> Server:
    """Start ``python -m app serve`` on loopback (a free port unless ``port``); not waited for.

    TLS: ``--dev-tls`` into ``tmp/certs``, or ``tls`` = (CA file, certificate, key). The caller
    stops it with ``stop(server.process)``. ``nofile``: the (soft, hard) open-file limit it starts
    with, as a container runtime sets it.
    """
    port = free_port() if port is None else port
    certs = tmp / "certs"
    if tls is None:
        tls_args = ["--dev-tls", str(certs)]
        ca = certs / "ca.crt"
    else:
        ca, cert, key = tls
        tls_args = ["--tls-cert", str(cert), "--tls-key", str(key)]
    command = [
        sys.executable, "-m", "app", "serve",
        *tls_args, "--bind", f"127.0.0.1:{port}", *args,
    ]  # fmt: skip
    log_path = tmp / log_name
    with log_path.open("w") as log:  # the child keeps its own descriptor
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **(env or {})},
            start_new_session=True,
            preexec_fn=None if nofile is None else partial(_limit_files, nofile),
        )
    return Server(f"https://127.0.0.1:{port}", ca, process, log_path)


def _limit_files(limits: tuple[int, int]) -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, limits)


@contextmanager
def serve(
    tmp: Path,
    *args: str,
    env: dict[str, str] | None = None,
    ready: bool = True,
    tls: tuple[Path, Path, Path] | None = None,
    nofile: tuple[int, int] | None = None,
) -> Iterator[Server]:
    """Start ``python -m app serve`` on a free loopback port; stop it afterwards.

    TLS: ``--dev-tls`` into ``tmp/certs``, or ``tls`` = (CA file, certificate, key).
    """
    server = launch(tmp, *args, env=env, tls=tls, nofile=nofile)
    try:
        deadline = time.monotonic() + 30
        while not server.ca.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        if ready:
            server.wait_ready()
        yield server
    finally:
        stop(server.process)
