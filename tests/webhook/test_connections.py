"""Connections that never finish a request, against the real server process over real sockets.

Hundreds of idle TCP connections, half ClientHellos, finished handshakes with no request, or
requests trickled a byte at a time must not hold a request thread: honest reviews (each on a
new connection, handshake included) are answered promptly while they are held, trickled
requests are cut off by the request deadline however steadily they send, and past the
per-worker and per-address caps the oldest waiting connection is closed, not an honest one
queued. The hostile connections come from other loopback addresses (127.0.0.2 and up), as an
attacking pod's do from the API server's.
"""

from __future__ import annotations

import functools
import json
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.settings import DEFAULT_MAX_BODY_BYTES
from tests.process import Server, client_hello, established, read_reply, serve, stop
from tests.support import make_access_review, make_review

ALLOWED = make_review("alice", "CREATE", "configmaps", namespace="t1", labels={"team": "a"})
DENIED = make_review("bob", "CREATE", "configmaps", namespace="t1", labels={"team": "a"})
# A list without a label selector: denied with a reason, decided by the engine like any other.
LIST = make_access_review("alice", "list", "configmaps", namespace="t1")
# What "promptly" means here: a full handshake and a decision on a shared 2-core machine, with
# hundreds of hostile connections open. Without the event-loop stage these take the whole
# request deadline or time out.
PROMPT = 2.0
HOSTILE = 300
HOSTILE_PEERS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
HELLO = functools.cache(client_hello)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The shipped serving model: 2 workers of 4 threads, deadline and caps at their defaults."""
    tmp = tmp_path_factory.mktemp("connections")
    with serve(tmp, "--rbac-dir", "manifests/examples") as srv:
        yield srv


def address(server: Server) -> tuple[str, int]:
    host, port = server.base_url.removeprefix("https://").split(":")
    return host, int(port)


def tcp(server: Server, source: str) -> socket.socket:
    return socket.create_connection(address(server), timeout=10, source_address=(source, 0))


def tls(server: Server, source: str) -> ssl.SSLSocket:
    return server.context().wrap_socket(tcp(server, source), server_hostname="127.0.0.1")


def idle_tcp(server: Server, source: str) -> socket.socket:
    return tcp(server, source)


def half_hello(server: Server, source: str) -> socket.socket:
    sock = tcp(server, source)
    hello = HELLO()
    sock.sendall(hello[: len(hello) // 2])
    return sock


def no_request(server: Server, source: str) -> socket.socket:
    return tls(server, source)


def request_head(server: Server, source: str) -> socket.socket:
    """A handshake and the start of a request's headers, the rest never sent."""
    sock = tls(server, source)
    sock.sendall(b"POST /validate HTTP/1.1\r\nHost: webhook\r\n")
    return sock


def partial_body(server: Server, source: str) -> socket.socket:
    """Headers promising a body of 1000 bytes, and 10 of them."""
    sock = tls(server, source)
    sock.sendall(b"POST /validate HTTP/1.1\r\nHost: webhook\r\nContent-Length: 1000\r\n\r\n{}")
    return sock


def oversized_body(server: Server, source: str) -> socket.socket:
    """A declared body over --max-body-bytes, then nothing: answered 413 and drained for up to
    10 s, on no thread's time."""
    sock = tls(server, source)
    over = DEFAULT_MAX_BODY_BYTES + 1
    sock.sendall(b"POST /validate HTTP/1.1\r\nHost: webhook\r\nContent-Length: %d\r\n\r\n" % over)
    return sock


def oversized_chunk(server: Server, source: str) -> socket.socket:
    """A chunked body whose first chunk is declared past the limit, then nothing."""
    sock = tls(server, source)
    sock.sendall(
        b"POST /validate HTTP/1.1\r\nHost: webhook\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"ffffffff\r\n{"
    )
    return sock


Opener = Callable[[Server, str], socket.socket]


def open_hostile(server: Server, opener: Opener, count: int = HOSTILE) -> list[socket.socket]:
    started = time.monotonic()
    socks = [opener(server, HOSTILE_PEERS[i % len(HOSTILE_PEERS)]) for i in range(count)]
    time.sleep(0.5)  # accepted and taken as far as they go
    # Well within the request deadline (10 s), so that all are still held for the reviews.
    assert time.monotonic() - started < 5
    return socks


def held(server: Server, peers: tuple[str, ...] = HOSTILE_PEERS) -> int:
    """Server-side connections from ``peers`` still open."""
    return established(address(server)[1], peers)


CLOSED = "label_rbac_connections_closed_total"


def closed(server: Server, reason: str) -> float:
    """label_rbac_connections_closed_total{reason} over the workers, from /metrics."""
    status, text = server.request("GET", "/metrics")
    assert status == 200
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if (sample.name, sample.labels.get("reason")) == (CLOSED, reason):
                return float(sample.value)
    return 0.0


def honest_reviews(server: Server, rounds: int = 5) -> list[float]:
    """Reviews on new connections (a full handshake each): answers checked, seconds returned."""
    took = []
    for _ in range(rounds):
        for path, review, check in (
            ("/validate", ALLOWED, lambda b: b["response"]["allowed"] is True),
            ("/validate", DENIED, lambda b: b["response"]["allowed"] is False),
            ("/authorize", LIST, lambda b: b["status"]["denied"] is True),
        ):
            started = time.monotonic()
            status, body = server.request("POST", path, json.dumps(review).encode(), timeout=10)
            took.append(time.monotonic() - started)
            assert status == 200 and check(body), body
    return took


@pytest.mark.parametrize(
    "opener",
    [
        pytest.param(idle_tcp, id="idle-tcp"),
        pytest.param(half_hello, id="half-client-hello"),
        pytest.param(no_request, id="handshake-no-request"),
        pytest.param(request_head, id="headers-unfinished"),
        pytest.param(partial_body, id="body-unfinished"),
        pytest.param(oversized_body, id="body-over-the-limit"),
        pytest.param(oversized_chunk, id="chunk-over-the-limit"),
    ],
)
def test_honest_reviews_are_answered_while_hundreds_of_connections_hang(
    server: Server, opener: Opener
) -> None:
    hostile = open_hostile(server, opener)
    try:
        took = honest_reviews(server)
        # The hostile connections were held all along, not refused: they just hold no thread.
        assert held(server) == HOSTILE
    finally:
        for sock in hostile:
            sock.close()
    assert max(took) < PROMPT, sorted(took)[-3:]


class Trickle:
    """Connections sending a request one byte at a time, each byte well within any idle timeout;
    records when the server answered or closed each."""

    REQUEST = (
        b"POST /validate HTTP/1.1\r\nHost: webhook\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100000\r\n\r\n" + b" " * 100_000
    )

    def __init__(self, socks: list[ssl.SSLSocket], interval: float) -> None:
        self.socks = socks
        self.interval = interval
        self.started = time.monotonic()
        self.ended: dict[int, tuple[float, bytes]] = {}
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        for sock in self.socks:
            sock.setblocking(False)
        sent = 0
        while len(self.ended) < len(self.socks) and time.monotonic() - self.started < 60:
            for i, sock in enumerate(self.socks):
                if i not in self.ended:
                    self.step(i, sock, self.REQUEST[sent : sent + 1])
            sent += 1
            time.sleep(self.interval)

    def step(self, i: int, sock: ssl.SSLSocket, byte: bytes) -> None:
        readable, _, _ = select.select([sock], [], [], 0)
        try:
            if readable:
                answer = sock.recv(65536)
                self.ended[i] = (time.monotonic() - self.started, answer)
                return
            sock.send(byte)
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
            pass  # only session tickets so far
        except OSError:
            self.ended[i] = (time.monotonic() - self.started, b"")


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The shipped serving model with a short request deadline, to keep the test short."""
    tmp = tmp_path_factory.mktemp("quick")
    with serve(tmp, "--rbac-dir", "manifests/examples", "--request-deadline", "3") as srv:
        yield srv


def test_trickled_requests_are_cut_off_at_the_deadline(quick: Server) -> None:
    """A byte every 0.2 s keeps any per-read timeout happy; the deadline is for the whole
    request: each is answered 408 by then and closed."""
    socks = [tls(quick, HOSTILE_PEERS[i % 3]) for i in range(100)]
    trickle = Trickle(socks, 0.2)
    trickle.thread.start()
    try:
        took = honest_reviews(quick, rounds=3)
        trickle.thread.join(timeout=30)
    finally:
        for sock in socks:
            sock.close()
    assert max(took) < PROMPT, sorted(took)[-3:]
    assert len(trickle.ended) == len(socks)
    ends = sorted(seconds for seconds, _ in trickle.ended.values())
    # The deadline runs from accept; the loop looks at deadlines once a second.
    assert ends[0] >= 2.0 and ends[-1] <= 3 + 2.5, ends
    answers = {answer.split(b"\r\n", 1)[0] for _, answer in trickle.ended.values()}
    assert answers <= {b"HTTP/1.1 408 Request Timeout", b""}, answers
    assert b"HTTP/1.1 408 Request Timeout" in answers
    # Counted, for an operator to see: a metric shared by the workers.
    assert closed(quick, "deadline") >= len(socks)


@pytest.fixture(scope="module")
def capped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One worker, small caps: what happens past them is seen on every connection."""
    tmp = tmp_path_factory.mktemp("capped")
    flags = ("--workers", "1", "--max-connections", "120", "--max-connections-per-peer", "50")
    with serve(tmp, "--rbac-dir", "manifests/examples", *flags) as srv:
        yield srv


def raw_review(server: Server, source: str) -> dict[str, object]:
    with tls(server, source) as sock:
        body = json.dumps(ALLOWED).encode()
        sock.sendall(
            b"POST /validate HTTP/1.1\r\nHost: webhook\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        reply = read_reply(sock)
    assert reply.status == 200
    answer: dict[str, object] = reply.json()["response"]
    return answer


@pytest.mark.parametrize(
    ("peers", "cap"),
    [
        pytest.param(("127.0.0.2",), 50, id="per-address"),
        pytest.param(("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"), 120, id="per-worker"),
    ],
)
def test_past_the_caps_the_oldest_waiting_connection_is_closed(
    capped: Server, peers: tuple[str, ...], cap: int
) -> None:
    evicted = closed(capped, "evicted")
    hostile = [idle_tcp(capped, peers[i % len(peers)]) for i in range(300)]
    try:
        time.sleep(0.5)
        assert held(capped, peers) <= cap
        # New connections still get in, from the same address too: they close an idle one.
        for _ in range(5):
            assert raw_review(capped, peers[0])["allowed"] is True
        # The oldest went first: the first connections opened are the ones closed.
        assert _closed(hostile[0]) and not _closed(hostile[-1])
        assert closed(capped, "evicted") - evicted >= 300 - cap
    finally:
        for sock in hostile:
            sock.close()


def _closed(sock: socket.socket) -> bool:
    readable, _, _ = select.select([sock], [], [], 1)
    return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""


def test_held_connections_do_not_hold_up_a_stop(tmp_path: Path) -> None:
    """SIGTERM with hundreds of connections held and no request begun on them: the workers stop
    as if they were idle kept-alive connections (gunicorn gives those 2 s), not at the request
    deadline or the graceful timeout."""
    with serve(tmp_path, "--rbac-dir", "manifests/examples") as srv:
        hostile = open_hostile(srv, no_request) + open_hostile(srv, half_hello, 100)
        try:
            assert honest_reviews(srv, rounds=1)
            started = time.monotonic()
            stop(srv.process)
            stopped = time.monotonic() - started
        finally:
            for sock in hostile:
                sock.close()
    assert srv.process.returncode == 0
    assert stopped < 5, stopped


def test_requests_pipelined_or_expecting_100_continue_are_served(server: Server) -> None:
    """Bytes past one request are the next request; an Expect: 100-continue gets one 100."""
    body = json.dumps(ALLOWED).encode()
    one = (
        b"POST /validate HTTP/1.1\r\nHost: webhook\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    with server.connect() as sock:
        sock.sendall(one + one + b"GET /healthz HTTP/1.1\r\nHost: webhook\r\n\r\n")
        assert [read_reply(sock).status for _ in range(3)] == [200, 200, 200]
    with server.connect() as sock:
        head, _, rest = one.partition(b"\r\n\r\n")
        sock.sendall(head + b"\r\nExpect: 100-continue\r\n\r\n")
        assert read_reply(sock).status == 100
        sock.sendall(rest)
        reply = read_reply(sock)
        assert reply.status == 200 and reply.json()["response"]["allowed"] is True
