"""The gunicorn worker: h11 frames every request in an event loop; threads get whole requests.

No code here parses HTTP. Each worker runs one event loop over non-blocking sockets that does
the TLS handshakes, feeds the bytes it reads to h11 (a maintained, strict HTTP/1.1 parser:
negative or prefixed chunk sizes, any Transfer-Encoding but exactly ``chunked``, malformed
lengths are its refusals) and writes what h11 serializes. A request reaches one of the worker's
``--threads`` only once h11 delivered all of it; the thread runs the WSGI app on it and hands
the answer back to the loop, so no thread ever reads from or writes to a client. What is kept
of gunicorn: its arbiter, signals, heartbeat and configuration.

- **one deadline**: ``--request-deadline`` covers handshake, head and body as a whole, from the
  accept or from the first byte of a kept-alive connection's next request; trickled bytes
  cannot stretch it. Writing an answer is bounded the same way.
- **bounds**: at most ``--max-connections`` per worker and ``--max-connections-per-peer`` per
  client address; past either, the oldest connection still waiting in the loop is closed (an
  honest client's request arrives within milliseconds, so the oldest waiting one is the slow
  one), or the new one if none waits. Request bodies are bounded too: at most twice
  ``--max-body-bytes`` per worker, partial ones and those waiting for or in a thread together,
  the oldest partial request dropped first.
- **out of descriptors**: EMFILE/ENFILE from ``accept`` closes the oldest waiting connection to
  make room, or (none waiting) pauses accepting for ACCEPT_PAUSE; it never ends the worker.
- **refusals**: what h11 refuses is answered with its status (400, 431, 501) and closed; so
  are a request with both Content-Length and Transfer-Encoding (400, as RFC 9112 allows), a
  head over HEADER_BYTES (431), an HTTP version but 1.0 and 1.1 (505) and a body in more than
  MAX_CHUNKS chunks (413). A body over ``--max-body-bytes`` gets a 413
  from the loop, and the rest of it is read through h11 and thrown away (app.webhook.server's
  DRAIN_BYTES and DRAIN_SECONDS), so the connection serves its next request.
"""

from __future__ import annotations

import contextlib
import errno
import heapq
import io
import itertools
import json
import os
import selectors
import socket
import ssl
import sys
import time
from collections.abc import Callable, Iterable
from concurrent import futures
from functools import partial
from typing import Any
from urllib.parse import unquote_to_bytes

import h11
from gunicorn import sock as gsock
from gunicorn.workers import base
from gunicorn.workers.gthread import STOP_KEEPALIVE_LINGER, PollableMethodQueue

from app.settings import Settings
from app.webhook.server import DRAIN_BYTES, DRAIN_SECONDS

# The request line and headers, at most (the API server's are a few hundred bytes): h11's
# limit on an incomplete head, past which it answers 431.
HEADER_BYTES = 32 * 1024
# One turn of the loop reads at most this much from one connection, so that one fast client
# cannot keep the others waiting; the rest is read on the next turn.
READ_SLICE = 1024 * 1024
RECV_BYTES = 65536
# A connection closed after its answer waits this long, at most, for the client to close too.
LINGER_SECONDS = 2.0
LINGER_BYTES = 64 * 1024
# Chunks one body may come in: h11 spends microseconds on each, so a body of one-byte chunks
# would cost the loop seconds per megabyte. Honest clients send a review in one piece or a few
# (the API server sends a Content-Length).
MAX_CHUNKS = 4096
# Connections accepted per readiness event of the listener.
ACCEPT_BATCH = 64
# Out of descriptors: how long accepting pauses (the kernel queues new connections meanwhile).
ACCEPT_PAUSE = 0.1
# Errors of accept() that mean "not now", never "stop serving".
ACCEPT_LATER = frozenset({errno.EAGAIN, errno.EWOULDBLOCK, errno.ECONNABORTED, errno.EINTR})
OUT_OF_DESCRIPTORS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})

# What a connection is doing: its TLS handshake, receiving a request, idle between requests,
# in a thread, sending an answer, reading past a body refused with a 413, or closing.
HANDSHAKE, REQUEST, IDLE, BUSY, DISCARD, LINGER = (
    "handshake", "request", "idle", "busy", "discard", "linger",
)  # fmt: skip

CONTINUE = h11.InformationalResponse(status_code=100, headers=[], reason=b"Continue")

REASONS = {
    400: "Bad Request", 408: "Request Timeout", 413: "Request Entity Too Large",
    414: "URI Too Long", 431: "Request Header Fields Too Large", 501: "Not Implemented",
    505: "HTTP Version Not Supported",
}  # fmt: skip


def error_body(status: int, message: str) -> bytes:
    """The JSON of app.webhook.server's errors."""
    return json.dumps({"error": message, "code": status}).encode()


class Conn:
    """One client connection and its h11 state."""

    __slots__ = (
        "body", "callback", "chunks", "client", "deadline", "drained", "events", "http",
        "lingered", "out", "peer", "request", "server", "size", "sock", "state", "wants_100",
    )  # fmt: skip

    def __init__(self, sock: ssl.SSLSocket, client: Any, server: Any) -> None:
        self.sock = sock
        self.client = client
        self.peer = str(client[0]) if isinstance(client, tuple) else str(client)
        self.server = server
        self.http = h11.Connection(h11.SERVER, max_incomplete_event_size=HEADER_BYTES)
        self.callback: Callable[[Any], None] = lambda _: None
        self.state = HANDSHAKE
        self.deadline = 0.0
        self.events = 0  # what the selector watches the socket for
        self.request: h11.Request | None = None
        self.body: list[bytes] = []
        self.size = 0  # bytes in body
        self.chunks = 0
        self.wants_100 = False
        self.out = bytearray()  # serialized by h11, not yet sent
        self.drained = 0
        self.lingered = 0


class StagedWorker(base.Worker):
    """A gunicorn worker: one event loop for every socket, ``--threads`` threads for the app."""

    alive: bool  # set by gunicorn's base worker; False once stopping

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        settings = getattr(self.app, "settings", None)
        if not isinstance(settings, Settings):
            settings = Settings()
        self.deadline_seconds = settings.request_deadline
        self.max_connections = settings.max_connections
        self.max_per_peer = settings.max_connections_per_peer
        self.max_body = settings.max_body_bytes
        self.budget = 2 * settings.max_body_bytes
        self.too_large = f"request body larger than {self.max_body} bytes (--max-body-bytes)"
        # serve's drain flag (set on SIGTERM): every answer then closes its connection.
        self.draining: Any = getattr(self.app, "draining", False)
        self.poller = selectors.DefaultSelector()
        self.method_queue = PollableMethodQueue()
        self.tpool: futures.ThreadPoolExecutor | None = None
        self.conns: dict[Conn, None] = {}  # every open connection
        self.waiting: dict[Conn, None] = {}  # waiting on their client, longest first
        self.by_peer: dict[str, dict[Conn, None]] = {}
        self.peer_count: dict[str, int] = {}
        self.loading: dict[Conn, None] = {}  # holding a partial body, oldest first
        self.serving: dict[Conn, int] = {}  # body bytes of requests in threads (or queued)
        self.buffered = 0  # body bytes of both
        self.deadlines: list[tuple[float, int, Conn]] = []
        self.seq = itertools.count()
        self.accepting = False
        self.resume_accept = 0.0

    # --- the process ---------------------------------------------------------------------------

    def init_process(self) -> None:
        self.tpool = futures.ThreadPoolExecutor(max_workers=self.cfg.threads)
        self.method_queue.init()
        super().init_process()

    def handle_exit(self, sig: int, frame: Any) -> None:
        if self.alive:
            self.alive = False
            self.method_queue.defer(lambda: None)  # wake the loop up

    def handle_quit(self, sig: int, frame: Any) -> None:
        if self.tpool is not None:
            self.tpool.shutdown(wait=False)
        super().handle_quit(sig, frame)

    def run(self) -> None:
        self.poller.register(
            self.method_queue.fileno(), selectors.EVENT_READ, self.method_queue.run_callbacks
        )
        self._accept_from(True)
        while self.alive:
            self.notify()
            self._turn()
            if self.ppid != os.getppid():
                self.log.info("Parent changed, shutting down: %s", self)
                break
        # Graceful stop: no new connections; idle ones get a short while for a request arriving
        # now (answered with Connection: close), requests begun and in threads finish.
        self._accept_from(False)
        self.resume_accept = float("inf")
        linger = time.monotonic() + STOP_KEEPALIVE_LINGER
        for conn in list(self.waiting):
            quiet = conn.state in (HANDSHAKE, IDLE) or (conn.state == REQUEST and not _begun(conn))
            if quiet and conn.deadline > linger:
                self._set_deadline(conn, linger)
        stop_by = time.monotonic() + self.cfg.graceful_timeout
        while self.conns and time.monotonic() < stop_by:
            self.notify()
            self._turn()
        for conn in list(self.conns):
            self._close(conn)
        assert self.tpool is not None
        self.tpool.shutdown(wait=False)
        self.poller.close()
        self.method_queue.close()
        for listener in self.sockets:
            listener.close()

    def _turn(self) -> None:
        """One turn of the loop: wait for readiness (at most a second), dispatch, deadlines."""
        now = time.monotonic()
        timeout = 1.0
        if self.deadlines:
            timeout = min(timeout, max(self.deadlines[0][0] - now, 0.0))
        if not self.accepting and self.alive and self.resume_accept < float("inf"):
            if now >= self.resume_accept:
                self._accept_from(True)
            else:
                timeout = min(timeout, self.resume_accept - now)
        try:
            ready = self.poller.select(timeout)
        except InterruptedError:
            ready = []
        for key, _ in ready:
            key.data(key.fileobj)
        self._expire(time.monotonic())

    # --- accepting -----------------------------------------------------------------------------

    def _accept_from(self, enabled: bool) -> None:
        if enabled == self.accepting:
            return
        for listener in self.sockets:
            if enabled:
                listener.setblocking(False)
                self.poller.register(listener, selectors.EVENT_READ, self._accept)
            else:
                with contextlib.suppress(KeyError, ValueError, OSError):
                    self.poller.unregister(listener)
        self.accepting = enabled

    def _accept(self, listener: Any) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                raw, client = listener.accept()
            except OSError as exc:
                if exc.errno in OUT_OF_DESCRIPTORS and self._out_of_descriptors():
                    continue
                if exc.errno not in ACCEPT_LATER | OUT_OF_DESCRIPTORS:
                    self.log.warning("accept failed: %s", exc)
                return
            self._admit(raw, client, listener.getsockname())

    def _out_of_descriptors(self) -> bool:
        """Back-pressure: the oldest waiting connection makes room, as past the caps (True: try
        again); if every connection is busy in a thread, accepting pauses for a moment and the
        kernel keeps new connections queued meanwhile."""
        if self.waiting:
            self._drop(next(iter(self.waiting)), "descriptors")
            return True
        self._accept_from(False)
        self.resume_accept = time.monotonic() + ACCEPT_PAUSE
        return False

    def _admit(self, raw: socket.socket, client: Any, server: Any) -> None:
        raw.setblocking(False)
        peer = str(client[0]) if isinstance(client, tuple) else str(client)
        if not self._make_room(peer):
            _abort(raw)
            _closed_early("refused")
            return
        try:
            sock = gsock.ssl_context(self.cfg).wrap_socket(
                raw, server_side=True, do_handshake_on_connect=False
            )
        except (OSError, ValueError):
            _abort(raw)
            return
        conn = Conn(sock, client, server)
        conn.callback = partial(self._on_event, conn)
        self.conns[conn] = None
        self.peer_count[peer] = self.peer_count.get(peer, 0) + 1
        self._wait(conn, HANDSHAKE, time.monotonic() + self.deadline_seconds)
        self._progress(conn)

    def _make_room(self, peer: str) -> bool:
        """Room for one more connection from ``peer``: the oldest waiting one (of that peer, or
        of anyone) is closed if needed; False if every connection is busy in a thread."""
        if self.peer_count.get(peer, 0) >= self.max_per_peer:
            waiting = self.by_peer.get(peer)
            if not waiting:
                return False
            self._drop(next(iter(waiting)), "evicted")
        if len(self.conns) >= self.max_connections:
            if not self.waiting:
                return False
            self._drop(next(iter(self.waiting)), "evicted")
        return True

    # --- bookkeeping ---------------------------------------------------------------------------

    def _wait(self, conn: Conn, state: str, deadline: float) -> None:
        """The connection waits on its client (again): newest of the waiting ones."""
        conn.state = state
        self._set_deadline(conn, deadline)
        self.waiting.pop(conn, None)
        self.waiting[conn] = None
        self.by_peer.setdefault(conn.peer, {})[conn] = None

    def _unwait(self, conn: Conn) -> None:
        self.waiting.pop(conn, None)
        peers = self.by_peer.get(conn.peer)
        if peers is not None:
            peers.pop(conn, None)
            if not peers:
                del self.by_peer[conn.peer]

    def _set_deadline(self, conn: Conn, deadline: float) -> None:
        conn.deadline = deadline
        heapq.heappush(self.deadlines, (deadline, next(self.seq), conn))

    def _watch(self, conn: Conn, events: int) -> None:
        if conn.events == events:
            return
        try:
            if not events:
                self.poller.unregister(conn.sock)
            elif conn.events:
                self.poller.modify(conn.sock, events, conn.callback)
            else:
                self.poller.register(conn.sock, events, conn.callback)
        except (OSError, ValueError, KeyError):
            conn.events = 0
            self._close(conn)
            return
        conn.events = events

    def _release(self, conn: Conn) -> None:
        if conn in self.loading:
            del self.loading[conn]
            self.buffered -= conn.size
        self.buffered -= self.serving.pop(conn, 0)
        conn.body, conn.size = [], 0

    def _drop(self, conn: Conn, reason: str | None = None) -> None:
        """Close a connection now; ``reason``: the server's, counted (else the client's, or the
        end of its keep-alive)."""
        if conn in self.conns:
            self._close(conn)
            if reason is not None:
                _closed_early(reason)

    def _close(self, conn: Conn) -> None:
        if conn not in self.conns:
            return
        del self.conns[conn]
        self._unwait(conn)
        self._release(conn)
        if conn.events:
            with contextlib.suppress(OSError, ValueError, KeyError):
                self.poller.unregister(conn.sock)
            conn.events = 0
        left = self.peer_count.get(conn.peer, 1) - 1
        if left > 0:
            self.peer_count[conn.peer] = left
        else:
            self.peer_count.pop(conn.peer, None)
        _abort(conn.sock)

    # --- reading -------------------------------------------------------------------------------

    def _on_event(self, conn: Conn, fileobj: Any) -> None:
        if conn in self.conns and conn.state != BUSY:
            self._progress(conn)

    def _progress(self, conn: Conn) -> None:
        """Take the connection as far as its client's bytes (and room to write) allow."""
        try:
            if conn.state == HANDSHAKE:
                conn.sock.do_handshake()
                if conn.sock.selected_alpn_protocol() == "h2":
                    raise ssl.SSLError("HTTP/2 is not served")
                conn.state = REQUEST
            if conn.out and not self._flush(conn):
                return
            if conn.state == LINGER:
                self._linger(conn)
            elif conn.state != BUSY:
                self._read(conn)
        except ssl.SSLWantReadError:
            self._watch(conn, selectors.EVENT_READ)
        except ssl.SSLWantWriteError:
            self._watch(conn, selectors.EVENT_WRITE)
        except (OSError, ValueError):
            self._drop(conn)
        except Exception:
            # A fault here must cost this connection, not the loop every connection of the
            # worker waits in.
            self.log.exception("closing a connection after an error reading its request")
            self._drop(conn)

    def _read(self, conn: Conn) -> None:
        taken = 0
        while taken < READ_SLICE and conn in self.conns and conn.state not in (BUSY, LINGER):
            if conn.out and not self._flush(conn):
                return  # an answer (a 100, a refusal) is written first
            if conn not in self.conns or conn.state in (BUSY, LINGER):
                return
            data = conn.sock.recv(RECV_BYTES)
            if not data:
                self._drop(conn)
                return
            taken += len(data)
            if conn.state == IDLE:
                # The next request's first byte: its deadline starts now.
                self._wait(conn, REQUEST, time.monotonic() + self.deadline_seconds)
            conn.http.receive_data(data)
            self._advance(conn)
        if conn in self.conns and conn.state in (REQUEST, IDLE, DISCARD):
            if taken >= READ_SLICE:
                # More may be waiting: come back to it after the other connections' turn.
                self.method_queue.defer(self._on_event, conn, None)
            self._watch(conn, selectors.EVENT_READ)

    def _advance(self, conn: Conn) -> None:
        """Take every event h11 has for what was received so far."""
        while conn in self.conns and conn.state in (REQUEST, IDLE, DISCARD) and not conn.out:
            try:
                event = conn.http.next_event()
            except h11.RemoteProtocolError as exc:
                status = exc.error_status_hint
                reason = "headers" if status == 431 else "malformed"
                self._refuse(conn, status, f"malformed HTTP request: {exc}", reason)
                return
            if event is h11.NEED_DATA or event is h11.PAUSED:
                return
            if isinstance(event, h11.Request):
                self._on_request(conn, event)
            elif isinstance(event, h11.Data):
                conn.chunks += event.chunk_start
                if conn.chunks > MAX_CHUNKS:
                    message = f"request body in more than {MAX_CHUNKS} chunks"
                    self._refuse(conn, 413, message, "malformed")
                    return
                self._on_data(conn, bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                self._on_end(conn)
            else:  # ConnectionClosed
                self._drop(conn)

    def _on_request(self, conn: Conn, request: h11.Request) -> None:
        if conn.state == IDLE:  # pipelined: its bytes came with the last request's
            self._wait(conn, REQUEST, time.monotonic() + self.deadline_seconds)
        if request.http_version not in (b"1.0", b"1.1"):
            self._refuse(conn, 505, "only HTTP/1.0 and HTTP/1.1 are served", "malformed")
            return
        # h11 bounds a head only while it is incomplete: one read can bring a whole larger one.
        head = len(request.target) + sum(len(n) + len(v) + 4 for n, v in request.headers)
        if head > HEADER_BYTES:
            self._refuse(conn, 431, f"request headers larger than {HEADER_BYTES} bytes", "headers")
            return
        names = {name for name, _ in request.headers}
        if b"transfer-encoding" in names and b"content-length" in names:
            message = "malformed HTTP request: Content-Length and Transfer-Encoding together"
            self._refuse(conn, 400, message, "malformed")
            return
        conn.request, conn.chunks = request, 0
        conn.wants_100 = conn.http.they_are_waiting_for_100_continue
        declared = next((int(v) for n, v in request.headers if n == b"content-length"), None)
        if declared is not None and declared > self.max_body:
            self._refuse_body(conn, declared)
        elif conn.wants_100 and (declared or b"transfer-encoding" in names):
            # The client waits for this before it sends its body.
            self._send(conn, CONTINUE)

    def _on_data(self, conn: Conn, data: bytes) -> None:
        if conn.state == DISCARD:
            conn.drained += len(data)
            if conn.drained > DRAIN_BYTES:
                self._drop(conn)
            return
        if conn.size + len(data) > self.max_body:
            self._refuse_body(conn, None)
            return
        while self.buffered + len(data) > self.budget and self.loading:
            oldest = next(iter(self.loading))
            self._drop(oldest, "buffer")
            if oldest is conn:
                return
        if self.buffered + len(data) > self.budget:
            self._drop(conn, "buffer")
            return
        self.loading[conn] = None
        self.buffered += len(data)
        conn.body.append(data)
        conn.size += len(data)

    def _on_end(self, conn: Conn) -> None:
        if conn.state == DISCARD:
            self._next_cycle(conn)
            return
        self._dispatch(conn)

    # --- refusals --------------------------------------------------------------------------------

    def _refuse(
        self, conn: Conn, status: int, message: str, reason: str | None, close: bool = True
    ) -> None:
        """Answer ``status`` from the loop (JSON, as the app's errors); close after it unless
        told otherwise; ``reason``: counted as a connection closed early."""
        body = error_body(status, message[:300])
        headers = [(b"Content-Type", b"application/json"), (b"Content-Length", b"%d" % len(body))]
        if close:
            headers.append((b"Connection", b"close"))
        phrase = REASONS.get(status, "Error").encode()
        try:
            self._send(conn, h11.Response(status_code=status, headers=headers, reason=phrase))
            self._send(conn, h11.Data(data=body))
            self._send(conn, h11.EndOfMessage())
        except h11.LocalProtocolError:
            self._drop(conn, reason)  # nothing can be answered in this state
            return
        if reason is not None:
            _closed_early(reason)
        if close:
            self._unwait(conn)
            self._release(conn)
            conn.state = LINGER
            self._set_deadline(conn, time.monotonic() + self.deadline_seconds)
            self._waiting_linger(conn)
        self._flush(conn)

    def _waiting_linger(self, conn: Conn) -> None:
        self.waiting[conn] = None
        self.by_peer.setdefault(conn.peer, {})[conn] = None

    def _refuse_body(self, conn: Conn, declared: int | None) -> None:
        """A body over the limit: a 413 at once; the rest of it is read through h11 and thrown
        away (up to DRAIN_BYTES within DRAIN_SECONDS), so that a client writing its whole body
        first reads the 413 on an intact connection that serves its next request. A declared
        length past DRAIN_BYTES is answered and closed."""
        self._release(conn)
        hopeless = declared is not None and declared > DRAIN_BYTES
        if conn.wants_100 and not hopeless:
            # As a client waiting for it expects: the interim answer, then the refusal.
            self._send(conn, CONTINUE)
            self._flush(conn)  # a record of its own: the client reads it alone
        self._refuse(conn, 413, self.too_large, None, close=hopeless)
        if not hopeless and conn in self.conns:
            conn.state = DISCARD
            conn.drained = 0
            self._set_deadline(conn, time.monotonic() + DRAIN_SECONDS)

    # --- the request in a thread -----------------------------------------------------------------

    def _dispatch(self, conn: Conn) -> None:
        """The request is complete in memory: a thread runs the app on it."""
        assert conn.request is not None and self.tpool is not None
        self._unwait(conn)
        body = b"".join(conn.body)
        # Still counted against the budget until answered: requests queued for a thread hold
        # their bodies as much as partial ones do.
        self.loading.pop(conn, None)
        self.serving[conn] = conn.size
        conn.body, conn.size = [], 0
        conn.state = BUSY
        self._watch(conn, 0)
        environ = wsgi_environ(conn.request, body, conn.client, conn.server)
        future = self.tpool.submit(run_app, self.wsgi, environ)
        future.add_done_callback(lambda done: self.method_queue.defer(self._answer, conn, done))

    def _answer(self, conn: Conn, done: futures.Future[Any]) -> None:
        """Back in the loop: h11 serializes the app's answer, the loop writes it."""
        self.buffered -= self.serving.pop(conn, 0)
        if conn not in self.conns:
            return
        try:
            status, reason, headers, body = done.result()
        except Exception:
            self.log.exception("error serving a request")
            status, reason = 500, b"Internal Server Error"
            body = error_body(500, "internal error")
            headers = [(b"Content-Type", b"application/json")]
        framing = (b"content-length", b"connection", b"transfer-encoding")
        headers = [(n, v) for n, v in headers if n.lower() not in framing]
        headers.append((b"Content-Length", b"%d" % len(body)))
        if self.draining or not self.alive:
            # While draining, answer and close: the client reconnects through the Service,
            # which by then no longer sends it here.
            headers.append((b"Connection", b"close"))
        try:
            self._send(conn, h11.Response(status_code=status, headers=headers, reason=reason))
            self._send(conn, h11.Data(data=body))
            self._send(conn, h11.EndOfMessage())
        except h11.LocalProtocolError:
            self.log.warning("the app's answer could not be sent: status %s", status)
            self._drop(conn)
            return
        # Writing the answer waits on the client reading it: bounded like a request.
        self._wait(conn, REQUEST, time.monotonic() + self.deadline_seconds)
        self._flush(conn)

    def _send(self, conn: Conn, event: Any) -> None:
        data = conn.http.send(event)
        if data:
            conn.out += data

    def _flush(self, conn: Conn) -> bool:
        """Write what h11 serialized; True once all of it is sent (and then what follows an
        answer is done: the next request, or the close)."""
        while conn.out:
            try:
                sent = conn.sock.send(conn.out)
            except (ssl.SSLWantWriteError, BlockingIOError):
                self._watch(conn, selectors.EVENT_WRITE)
                return False
            except ssl.SSLWantReadError:
                self._watch(conn, selectors.EVENT_READ)
                return False
            except (OSError, ValueError):
                self._drop(conn)
                return False
            del conn.out[:sent]
        if conn.state == LINGER:
            self._start_linger(conn)
            return False
        if conn.state == REQUEST and conn.http.our_state in (h11.DONE, h11.MUST_CLOSE):
            self._next_cycle(conn)
            return False
        return True

    def _next_cycle(self, conn: Conn) -> None:
        """After an answer and the request's end: the next request on this connection, or the
        close h11 (or the client) asks for."""
        if conn not in self.conns or conn.out:
            return
        http = conn.http
        if http.our_state is h11.MUST_CLOSE or http.their_state is h11.MUST_CLOSE:
            self._unwait(conn)
            self._start_linger(conn)
            return
        if http.our_state is not h11.DONE or http.their_state is not h11.DONE:
            return  # the answer went out before the request's end: that comes first
        http.start_next_cycle()
        conn.request, conn.wants_100 = None, False
        now = time.monotonic()
        idle_until = now + self.cfg.keepalive if self.alive else now + STOP_KEEPALIVE_LINGER
        self._wait(conn, IDLE, idle_until)
        pending, _ = http.trailing_data
        if pending:
            # The client pipelined its next request: that began already.
            self._wait(conn, REQUEST, now + self.deadline_seconds)
            self._advance(conn)
        if conn in self.conns and conn.state in (IDLE, REQUEST):
            self._progress(conn)

    # --- closing -------------------------------------------------------------------------------

    def _start_linger(self, conn: Conn) -> None:
        """After the last answer: half-close, then wait in the loop for the client to close
        (RFC 9112, 9.6), so that its unread bytes do not turn our close into a reset."""
        try:
            conn.sock.shutdown(socket.SHUT_WR)
        except (OSError, ValueError):
            self._close(conn)
            return
        conn.state = LINGER
        conn.lingered = 0
        self._waiting_linger(conn)
        self._set_deadline(conn, time.monotonic() + LINGER_SECONDS)
        self._linger(conn)

    def _linger(self, conn: Conn) -> None:
        # Half-closed, the socket reads the raw stream (the TLS layer is gone): what is left of
        # the client's bytes is read and thrown away until it closes.
        while conn.lingered < LINGER_BYTES:
            try:
                data = conn.sock.recv(4096)
            except (BlockingIOError, ssl.SSLWantReadError):
                self._watch(conn, selectors.EVENT_READ)
                return
            except (OSError, ValueError):
                break
            if not data:
                break
            conn.lingered += len(data)
        self._close(conn)

    def _expire(self, now: float) -> None:
        while self.deadlines and self.deadlines[0][0] <= now:
            deadline, _, conn = heapq.heappop(self.deadlines)
            if conn.deadline != deadline or conn not in self.conns or conn.state == BUSY:
                continue
            if conn.state == REQUEST and _begun(conn):
                # A request begun and not finished in time is told so, then cut off.
                self._refuse(conn, 408, "the request was not received in time", "deadline")
            else:
                early = conn.state in (HANDSHAKE, REQUEST, DISCARD)
                self._drop(conn, "deadline" if early else None)


def _begun(conn: Conn) -> bool:
    """A request is partly received and not answered yet."""
    http = conn.http
    if conn.out or (http.our_state is not h11.IDLE and http.our_state is not h11.SEND_RESPONSE):
        return False
    return http.their_state is h11.SEND_BODY or (
        http.their_state is h11.IDLE and bool(http.trailing_data[0])
    )


# --- WSGI: the app runs on a request h11 delivered whole -------------------------------------


def wsgi_environ(request: h11.Request, body: bytes, client: Any, server: Any) -> dict[str, Any]:
    """PEP 3333's environ for a complete request (the body in memory, its length known)."""
    path, _, query = request.target.partition(b"?")
    environ: dict[str, Any] = {
        "REQUEST_METHOD": request.method.decode("ascii"),
        "SCRIPT_NAME": "",
        "PATH_INFO": unquote_to_bytes(path).decode("latin-1"),
        "QUERY_STRING": query.decode("latin-1"),
        "SERVER_PROTOCOL": "HTTP/" + request.http_version.decode("ascii"),
        "SERVER_NAME": str(server[0]) if isinstance(server, tuple) else str(server),
        "SERVER_PORT": str(server[1]) if isinstance(server, tuple) else "",
        "REMOTE_ADDR": str(client[0]) if isinstance(client, tuple) else str(client),
        "REMOTE_PORT": str(client[1]) if isinstance(client, tuple) else "",
        "CONTENT_LENGTH": str(len(body)),
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": "https",
        "wsgi.input": io.BytesIO(body),
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
    }
    for name, value in request.headers:
        key = name.decode("latin-1").upper().replace("-", "_")
        if key in ("CONTENT_LENGTH", "TRANSFER_ENCODING"):
            continue  # the body is whole: its length is what was received
        text = value.decode("latin-1")
        if key == "CONTENT_TYPE":
            environ[key] = text
            continue
        key = "HTTP_" + key
        environ[key] = f"{environ[key]},{text}" if key in environ else text
    return environ


Answer = tuple[int, bytes, list[tuple[bytes, bytes]], bytes]


def run_app(app: Any, environ: dict[str, Any]) -> Answer:
    """Call the WSGI app (in a request thread): status, reason, headers and the whole body."""
    started: list[Any] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        started[:] = [status, headers]
        return lambda data: None

    result: Iterable[bytes] = app(environ, start_response)
    try:
        body = b"".join(result)
    finally:
        close = getattr(result, "close", None)
        if close is not None:
            close()
    status, headers = started
    code, _, reason = status.partition(" ")
    encoded = [(n.encode("latin-1"), v.encode("latin-1")) for n, v in headers]
    return int(code), reason.encode("latin-1"), encoded, body


# Told of every connection the server closes before its request was answered, with the reason
# (app.webhook.metrics counts them; set in each worker).
_observer: Callable[[str], None] | None = None


def set_close_observer(observer: Callable[[str], None] | None) -> None:
    global _observer
    _observer = observer


def _closed_early(reason: str) -> None:
    if _observer is not None:
        _observer(reason)


def _abort(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.close()
