"""Connections benchmark: honest reviews' latency with hundreds of hostile connections held.

Run with ``.venv/bin/python -m bench connections``.

One label-rbac server (``python -m app serve``'s serving model, or ``--model``) over a static
RBAC directory. An honest client posts reviews one after the other, each on a new connection
(TCP and TLS handshake included, the slowest way the API server can call), and records each
answer's latency. Rounds alternate between two phases in the same run:

- **none**: nothing else is connected;
- **held**: ``--hostile`` connections from other loopback addresses are opened first and held
  open through the phase, in equal shares of four kinds: plain TCP sending nothing, half a TLS
  ClientHello, a finished handshake with no request, and a request trickled one byte every
  ``--trickle`` seconds.

Reported per phase: the honest reviews' p50 and p99 in milliseconds, the held phase's over the
none phase's as a ratio, reviews that failed or timed out (``--timeout``), and how many hostile
connections the server still held at the end of each held phase. The figures are written as
JSON (``--json``, default bench-connections.json).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import socket
import ssl
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.core.layout import write_dir
from bench.core.load import review_mix
from bench.core.servers import Model, Running, server
from bench.core.stats import med, median_ratio, percentile
from tests.process import client_hello, established

HOSTILE_PEERS = ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5")
KINDS = ("idle-tcp", "half-hello", "no-request", "trickle")
TRICKLED = b"POST /validate HTTP/1.1\r\nHost: webhook\r\nContent-Length: 100000\r\n\r\n"


def address(running: Running) -> tuple[str, int]:
    host, port = running.url.removeprefix("https://").split(":")
    return host, int(port)


class Hostile:
    """``count`` connections of the four kinds, held open (trickling) until closed."""

    def __init__(self, running: Running, context: ssl.SSLContext, count: int, trickle: float):
        self.addr = address(running)
        self.context = context
        self.trickle = trickle
        self.hello = client_hello()
        self.socks: list[socket.socket] = []
        self.trickling: list[ssl.SSLSocket] = []
        self.failed = 0  # not even connected, or no handshake within 3 s (a stalled server)
        handshaking: list[ssl.SSLSocket] = []
        for i in range(count):
            kind, source = KINDS[i % len(KINDS)], HOSTILE_PEERS[i % len(HOSTILE_PEERS)]
            try:
                sock = socket.create_connection(self.addr, timeout=2, source_address=(source, 0))
            except OSError:
                self.failed += 1
                continue
            if kind == "half-hello":
                sock.sendall(self.hello[: len(self.hello) // 2])
            elif kind in ("no-request", "trickle"):
                sock.setblocking(False)
                sock = context.wrap_socket(
                    sock, server_hostname="localhost", do_handshake_on_connect=False
                )
                handshaking.append(sock)
                if kind == "trickle":
                    self.trickling.append(sock)
            self.socks.append(sock)
        self.failed += self.handshake(handshaking, time.monotonic() + 3)
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    @staticmethod
    def handshake(socks: list[ssl.SSLSocket], deadline: float) -> int:
        """All the handshakes at once (non-blocking): how many did not finish by ``deadline``."""
        waiting = list(socks)
        while waiting and time.monotonic() < deadline:
            for sock in list(waiting):
                try:
                    sock.do_handshake()
                    waiting.remove(sock)
                except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                    pass
                except OSError:
                    waiting.remove(sock)
            select.select(waiting, [], [], 0.05)
        return len(waiting)

    def run(self) -> None:
        sent = 0
        while not self.stopped.wait(self.trickle):
            for sock in self.trickling:
                try:
                    sock.send(TRICKLED[sent % len(TRICKLED) : sent % len(TRICKLED) + 1])
                except (ssl.SSLWantWriteError, ssl.SSLWantReadError):
                    pass
                except OSError:
                    pass  # cut off by the server: counted at the end
            sent += 1

    def close(self) -> None:
        self.stopped.set()
        self.thread.join()
        for sock in self.socks:
            sock.close()


def held(running: Running) -> int:
    """Server-side connections from the hostile addresses still open."""
    return established(address(running)[1], HOSTILE_PEERS)


def post(running: Running, context: ssl.SSLContext, body: bytes, timeout: float) -> bool:
    """One review on a new connection; True if answered 200."""
    with (
        socket.create_connection(address(running), timeout=timeout) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as sock,
    ):
        sock.sendall(
            b"POST /validate HTTP/1.1\r\nHost: webhook\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    return reply.startswith(b"HTTP/1.1 200 ")


def honest(
    running: Running, context: ssl.SSLContext, bodies: list[bytes], seconds: float, timeout: float
) -> dict[str, float]:
    took: list[float] = []
    failed = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        body = bodies[len(took) % len(bodies)]
        started = time.monotonic()
        try:
            ok = post(running, context, body, timeout)
        except OSError:
            ok = False
        took.append(1e3 * (time.monotonic() - started))
        failed += not ok
    return {
        "reviews": len(took),
        "failed": failed,
        "p50_ms": percentile(took, 0.5),
        "p99_ms": percentile(took, 0.99),
        "max_ms": max(took),
    }


@contextmanager
def hostile_held(
    running: Running, context: ssl.SSLContext, count: int, trickle: float
) -> Iterator[Hostile]:
    hostile = Hostile(running, context, count, trickle)
    try:
        time.sleep(0.5)  # accepted and taken as far as they go
        yield hostile
    finally:
        hostile.close()


def measure(args: argparse.Namespace, model: Model, rbac_dir: Path, tmp: Path) -> dict[str, Any]:
    certs = tmp / "certs"
    context = ssl.create_default_context(cafile=str(certs / "ca.crt"))
    bodies = [json.dumps(review).encode() for review in review_mix(args.objects)["/validate"]]
    phases: dict[str, list[dict[str, float]]] = {"none": [], "held": []}
    with server("label-rbac", model, rbac_dir, certs, tmp / "server.log", "warning") as running:
        honest(running, context, bodies, 1, args.timeout)  # warm up
        for _ in range(args.rounds):
            phases["none"].append(honest(running, context, bodies, args.seconds, args.timeout))
            with hostile_held(running, context, args.hostile, args.trickle) as hostile:
                figures = honest(running, context, bodies, args.seconds, args.timeout)
                figures["held"] = held(running)
                figures["opened"] = args.hostile - hostile.failed
            phases["held"].append(figures)
    pairs = list(zip(phases["none"], phases["held"], strict=True))
    return {
        "model": str(model),
        "hostile": args.hostile,
        **phases,
        "p50_ratio": median_ratio(pairs, "p50_ms"),
        "p99_ratio": median_ratio(pairs, "p99_ms"),
    }


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| model | hostile held | p50 ms none | p50 ms held | p99 ms none | p99 ms held "
        "| p99 ratio | failed (none/held) | still held at end |",
        "|" + "---|" * 9,
    ]
    for row in rows:
        none, hold = row["none"], row["held"]
        failed = f"{sum(r['failed'] for r in none):g}/{sum(r['failed'] for r in hold):g}"
        lines.append(
            f"| {row['model']} | {row['hostile']} | {med(none, 'p50_ms'):.1f} "
            f"| {med(hold, 'p50_ms'):.1f} | {med(none, 'p99_ms'):.1f} | {med(hold, 'p99_ms'):.1f} "
            f"| {row['p99_ratio']:.2f} | {failed} | {min(r['held'] for r in hold):g} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=2000, help="RBAC objects to serve")
    parser.add_argument(
        "--models",
        type=lambda s: [Model.parse(m) for m in s.split(",")],
        default=[Model()],
        help="serving models, e.g. staged:2x4,gthread:2x4 (default: serve's, staged:2x4)",
    )
    parser.add_argument("--hostile", type=int, default=400, help="connections held per phase")
    parser.add_argument("--seconds", type=float, default=4, help="honest reviews per phase")
    parser.add_argument("--rounds", type=int, default=3, help="alternating none/held rounds")
    parser.add_argument("--trickle", type=float, default=0.5, help="seconds between bytes")
    parser.add_argument("--timeout", type=float, default=5, help="an honest review's limit")
    parser.add_argument("--json", type=Path, default=Path("bench-connections.json"))
    args = parser.parse_args(argv)
    from app.webhook.certs import generate

    rows = []
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        generate(tmp / "certs", ["localhost", "127.0.0.1"])
        objects = write_dir(tmp / "rbac", args.objects)
        print(f"{objects:,} RBAC objects; {os.cpu_count()} CPUs; {args.rounds} rounds of "
              f"{args.seconds:g} s per phase; {args.hostile} hostile connections "
              f"({', '.join(KINDS)})")  # fmt: skip
        for model in args.models:
            rows.append(measure(args, model, tmp / "rbac", tmp))
            print(table(rows), flush=True)
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    args.json.write_text(json.dumps(rows, indent=1))
