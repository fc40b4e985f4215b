"""Request framing an attacker chooses, and descriptors run out, against the real server process.

Over real HTTPS to ``python -m app serve`` in its shipped model (2 workers x 4 threads): chunk
sizes with a sign, a prefix or whitespace; Transfer-Encoding lists and repeated lines with a
body trickled after them; thousands of idle connections under the open-file limit container
runtimes give by default. Each is refused (400 or 501) and closed at once, or costs no more than
a connection, while honest reviews (each on a new connection, handshake included) are answered
promptly, no worker spins or restarts, and no worker runs out of descriptors.
"""

from __future__ import annotations

import contextlib
import os
import re
import resource
import select
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.webhook.connections import MAX_CHUNKS
from tests.process import Server, serve
from tests.webhook.test_connections import (
    PROMPT,
    closed,
    held,
    honest_reviews,
    idle_tcp,
    tls,
)

HEAD = b"POST /validate HTTP/1.1\r\nHost: webhook\r\nContent-Type: application/json\r\n"
ATTACKERS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The shipped serving model: 2 workers of 4 threads, deadline and caps at their defaults."""
    tmp = tmp_path_factory.mktemp("framing")
    with serve(tmp, "--rbac-dir", "manifests/examples") as srv:
        yield srv


def workers(server: Server, count: int = 2) -> set[int]:
    """The server's worker processes, once all ``count`` have started."""
    pid = server.process.pid
    children = Path(f"/proc/{pid}/task/{pid}/children")
    deadline = time.monotonic() + 30
    while len(found := {int(p) for p in children.read_text().split()}) < count:
        assert time.monotonic() < deadline, found
        time.sleep(0.1)
    return found


def cpu_seconds(pids: set[int]) -> float:
    """User and system time of ``pids``, from /proc."""
    ticks = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])
    return ticks / float(os.sysconf("SC_CLK_TCK"))


def answer_and_close(sock: ssl.SSLSocket, within: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes, and how long that took (at most ``within``:
    a connection still open by then is a failure)."""
    started = time.monotonic()
    sock.setblocking(False)
    received = b""
    while time.monotonic() - started < within:
        select.select([sock], [], [], 0.1)
        try:
            data = sock.recv(65536)
        except (ssl.SSLWantReadError, BlockingIOError):
            continue
        except OSError:
            break
        if not data:
            break
        received += data
    else:
        raise AssertionError(f"still open after {within} s, having sent {received!r}")
    return received, time.monotonic() - started


def status_of(answer: bytes) -> int:
    match = re.match(rb"HTTP/1\.1 (\d{3}) ", answer)
    assert match, answer
    return int(match[1])


def assert_quiet(server: Server, before: set[int]) -> None:
    """The same workers serve (none was killed and replaced), and none spins: at most a tenth of
    a core over a second with nothing sent."""
    assert workers(server) == before
    pids = workers(server)
    used = cpu_seconds(pids)
    time.sleep(1.0)
    assert cpu_seconds(pids) - used < 0.1 * len(pids) + 0.05


@pytest.mark.parametrize(
    "size",
    [
        pytest.param(b"-6", id="negative"),
        pytest.param(b"+6", id="plus-sign"),
        pytest.param(b"0x6", id="0x-prefix"),
        pytest.param(b" 6", id="leading-space"),
        pytest.param(b"6_0", id="underscore"),
        pytest.param(b"-0", id="negative-zero"),
        pytest.param(b"f" * 21, id="21-hex-digits"),
    ],
)
def test_a_malformed_chunk_size_is_a_400_and_costs_no_worker(server: Server, size: bytes) -> None:
    """Sent on many connections at once (several per worker): each is refused and closed at
    once, honest reviews meanwhile are answered promptly, and no worker spins or restarts."""
    before = workers(server)
    request = HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + size + b"\r\nabcdef\r\n0\r\n\r\n"
    socks = [tls(server, ATTACKERS[i % 3]) for i in range(8)]
    for sock in socks:
        sock.sendall(request)
    took = honest_reviews(server, rounds=2)
    for sock in socks:
        answer, _ = answer_and_close(sock, within=PROMPT)
        assert status_of(answer) == 400
        assert b"malformed HTTP request: illegal chunk header" in answer
        sock.close()
    assert max(took) < PROMPT, sorted(took)[-3:]
    assert_quiet(server, before)


@pytest.mark.parametrize(
    "encoding",
    [
        pytest.param(b"Transfer-Encoding: gzip, chunked\r\n", id="gzip-chunked"),
        pytest.param(b"Transfer-Encoding: identity, chunked\r\n", id="identity-chunked"),
        pytest.param(
            b"Transfer-Encoding: identity\r\nTransfer-Encoding: chunked\r\n", id="two-lines"
        ),
        pytest.param(b"Transfer-Encoding: chunked, chunked\r\n", id="chunked-twice"),
        pytest.param(b"Transfer-Encoding: chunked, identity\r\n", id="chunked-not-last"),
        pytest.param(b"Transfer-Encoding: x-custom\r\n", id="unknown"),
    ],
)
def test_a_transfer_encoding_other_than_chunked_is_a_501_before_its_body(
    server: Server, encoding: bytes
) -> None:
    """12 connections send such a head, then trickle their body a byte every 0.3 s: each gets a
    501 on its head alone and is closed, long before any deadline; honest reviews meanwhile are
    answered promptly."""
    before = workers(server)
    socks = [tls(server, ATTACKERS[i % 3]) for i in range(12)]
    for sock in socks:
        sock.sendall(HEAD + encoding + b"\r\n")
    started = time.monotonic()
    for sock in socks:
        sock.setblocking(False)
    ended: dict[int, bytes] = {}
    body = b"5\r\nhello\r\n0\r\n\r\n"
    sent = 0
    while len(ended) < len(socks) and time.monotonic() - started < PROMPT:
        for i, sock in enumerate(socks):
            if i in ended:
                continue
            try:
                answer = sock.recv(65536)
                ended[i] = answer
                continue
            except (ssl.SSLWantReadError, BlockingIOError):
                pass
            except OSError:
                ended[i] = b""
                continue
            with contextlib.suppress(OSError):  # SSLWant*, BlockingIOError: next time
                sock.send(body[sent : sent + 1] or b" ")
        sent += 1
        time.sleep(0.3)
    took = honest_reviews(server, rounds=2)
    assert len(ended) == len(socks), f"{len(socks) - len(ended)} still open after {PROMPT} s"
    assert {status_of(answer) for answer in ended.values()} == {501}
    assert all(b"Only Transfer-Encoding: chunked is supported" in a for a in ended.values())
    for sock in socks:
        answer, _ = answer_and_close(sock, within=PROMPT)  # closed: nothing more comes
        assert answer == b""
        sock.close()
    assert max(took) < PROMPT, sorted(took)[-3:]
    assert_quiet(server, before)


def test_a_body_in_thousands_of_tiny_chunks_is_a_413_and_costs_no_worker(server: Server) -> None:
    """Each chunk costs the parser microseconds: a body of one-byte chunks is refused past
    MAX_CHUNKS (413, closed) on 8 connections at once, honest reviews answered meanwhile; one in
    a few chunks is decided."""
    before = workers(server)
    request = HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + b"1\r\n \r\n" * 200_000
    socks = [tls(server, ATTACKERS[i % 3]) for i in range(8)]
    for sock in socks:
        sock.setblocking(False)
        with contextlib.suppress(OSError):  # as much as the server reads before it refuses
            sock.send(request)
    took = honest_reviews(server, rounds=2)
    for sock in socks:
        answer, _ = answer_and_close(sock, within=PROMPT)
        assert status_of(answer) == 413
        assert f"request body in more than {MAX_CHUNKS} chunks".encode() in answer
        sock.close()
    assert max(took) < PROMPT, sorted(took)[-3:]
    assert_quiet(server, before)


@pytest.mark.parametrize(
    ("request_bytes", "status", "message"),
    [
        pytest.param(
            HEAD + b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            400, b"Content-Length and Transfer-Encoding together", id="length-and-encoding",
        ),
        pytest.param(
            HEAD + b"X-Big: " + b"a" * 40_000 + b"\r\nContent-Length: 2\r\n\r\n{}",
            431, b"request headers larger than 32768 bytes", id="head-over-32-KiB-at-once",
        ),
        pytest.param(
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 505, b"only HTTP/1.0 and HTTP/1.1",
            id="http2-preface",
        ),
        pytest.param(
            HEAD + b"Transfer-Encoding : chunked\r\n\r\n0\r\n\r\n", 400,
            b"illegal header line", id="space-before-colon",
        ),
    ],
)  # fmt: skip
def test_framing_the_server_refuses_on_its_own_is_refused_and_closed(
    server: Server, request_bytes: bytes, status: int, message: bytes
) -> None:
    with server.connect() as sock:
        sock.sendall(request_bytes)
        answer, _ = answer_and_close(sock, within=PROMPT)
    assert status_of(answer) == status
    assert message in answer


# --- descriptors -------------------------------------------------------------------------------


def open_files(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


def file_limit(pid: int) -> tuple[int, int]:
    soft, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    return soft, hard


def test_the_open_file_limit_is_raised_to_the_hard_limit(tmp_path: Path) -> None:
    """As container runtimes start it: soft 1024, a higher hard limit. The caps fit once raised,
    so they stay as configured."""
    with serve(tmp_path, "--rbac-dir", "manifests/examples", nofile=(1024, 8192)) as srv:
        assert {file_limit(pid) for pid in workers(srv)} == {(8192, 8192)}
    assert "lowered" not in srv.log.read_text()


# 20 addresses x 110 connections: under the per-address cap (128), past what 1,024 descriptors
# hold for 2 workers' worth of the per-worker cap (1,000).
FLOOD_PEERS = tuple(f"127.0.1.{i}" for i in range(1, 21))


def test_thousands_of_idle_connections_under_a_low_file_limit_cost_no_worker(
    tmp_path: Path,
) -> None:
    """Soft and hard limit 1,024: the per-worker cap is lowered to fit (and said so), 2,200 idle
    connections from 20 addresses are held or evicted, never a worker's exit, and honest reviews
    are answered promptly throughout."""
    with serve(tmp_path, "--rbac-dir", "manifests/examples", nofile=(1024, 1024)) as srv:
        log = srv.log.read_text()
        assert "serve: --max-connections lowered from 1000 to 896" in log
        before = workers(srv)
        # What a worker holds besides its connections: well inside the reserve.
        assert max(open_files(pid) for pid in before) < 64
        flood: list[socket.socket] = []
        try:
            for i in range(2200):
                flood.append(idle_tcp(srv, FLOOD_PEERS[i % len(FLOOD_PEERS)]))
            time.sleep(0.5)
            took = honest_reviews(srv, rounds=3)
            assert held(srv, FLOOD_PEERS) <= 2 * 896
            assert max(open_files(pid) for pid in before) <= 1024
            assert closed(srv, "evicted") >= 2200 - 2 * 896
        finally:
            for sock in flood:
                sock.close()
        assert_quiet(srv, before)
    assert max(took) < PROMPT, sorted(took)[-3:]
    assert "Too many open files" not in srv.log.read_text()


def test_out_of_descriptors_in_accept_the_oldest_waiting_connection_makes_room(
    tmp_path: Path,
) -> None:
    """The workers' soft limit lowered under them, far below their caps (as if something else
    took the descriptors): accept fails with EMFILE, and the worker closes its oldest waiting
    connection to make room instead of exiting; honest reviews are answered promptly."""
    with serve(tmp_path, "--rbac-dir", "manifests/examples") as srv:
        before = workers(srv)
        for pid in before:
            hard = file_limit(pid)[1]
            resource.prlimit(pid, resource.RLIMIT_NOFILE, (open_files(pid) + 40, hard))
        flood: list[socket.socket] = []
        try:
            for i in range(300):
                flood.append(idle_tcp(srv, ATTACKERS[i % 3]))
            time.sleep(0.5)
            took = honest_reviews(srv, rounds=3)
            assert held(srv, ATTACKERS) <= 2 * 40
        finally:
            for sock in flood:
                sock.close()
        assert closed(srv, "descriptors") >= 300 - 2 * 40
        assert_quiet(srv, before)
    assert max(took) < PROMPT, sorted(took)[-3:]
    assert "Too many open files" not in srv.log.read_text()
    assert "accept failed" not in srv.log.read_text()


def test_caps_that_cannot_fit_refuse_to_start(tmp_path: Path) -> None:
    with serve(tmp_path, "--rbac-dir", "manifests/examples", nofile=(130, 130), ready=False) as srv:
        assert srv.process.wait(timeout=30) != 0
    assert "the open-file limit (130) leaves room for 2 connections per worker" in (
        srv.log.read_text()
    )
