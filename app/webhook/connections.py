"""The gunicorn worker: gthread, with no request thread ever waiting on a client.

gunicorn's gthread worker hands every accepted connection to a request thread, which then does
the TLS handshake and reads the request with blocking calls: a client that connects and sends
nothing, half a ClientHello, or a handshake and no request, holds one of the few threads for as
long as it likes, and a few dozen such connections stall every review. ``StagedWorker`` keeps
gunicorn (its arbiter, thread pool, HTTP parser, WSGI glue, graceful stop) and moves everything
that waits on the client into the worker's event loop, on non-blocking sockets:

- **the handshake and the request**: a connection reaches a thread only once its request is
  complete in memory (headers and the whole body, by Content-Length or chunked framing), so the
  thread parses from the buffer and never waits. One deadline covers handshake, headers and body
  (``--request-deadline`` from accept, or from the first byte of a kept-alive connection's next
  request): trickled bytes cannot stretch it, as a per-read idle timeout would let them.
- **keep-alive and closing**: between requests a connection waits in the loop (keep-alive
  timeout), and one closed after its answer lingers there for the client's last bytes, not on
  the loop's or a thread's time.
- **bounds**: at most ``--max-connections`` per worker and ``--max-connections-per-peer`` per
  client address; past either, the oldest connection still waiting in the loop is closed (an
  honest client's request arrives within milliseconds, so the oldest waiting one is the slow
  one), or the new one if none waits. What the loop buffers is bounded the same way: at most
  twice ``--max-body-bytes`` per worker, the oldest partial request dropped first.

A body over ``--max-body-bytes`` is refused from the loop too: the 413 goes out at once and the
rest of the body is read and thrown away there (app.webhook.server's DRAIN_BYTES and
DRAIN_SECONDS), so the connection serves its next request. Only framing gunicorn refuses before
reading a body (400) reaches a thread unread.
"""

from __future__ import annotations

import contextlib
import errno
import heapq
import itertools
import json
import re
import selectors
import socket
import ssl
import struct
import sys
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from gunicorn import http
from gunicorn import sock as gsock
from gunicorn.workers.gthread import STOP_KEEPALIVE_LINGER, TConn, ThreadWorker

from app.settings import Settings
from app.webhook.server import DRAIN_BYTES, DRAIN_SECONDS

# The request line and headers, at most (the API server's are a few hundred bytes).
HEADER_BYTES = 32 * 1024
# One turn of the loop reads at most this much from one connection, so that one fast client
# cannot keep the others waiting; the rest is read on the next turn.
READ_SLICE = 1024 * 1024
# A connection closed after its answer waits this long, at most, for the client to close too.
LINGER_SECONDS = 2.0
LINGER_BYTES = 64 * 1024
# Connections accepted per readiness event of the listener.
ACCEPT_BATCH = 64

CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


def _answer(status: str, message: str, close: bool = True) -> bytes:
    """A complete JSON error response, as app.webhook.server's errors (closing the connection unless
    told otherwise)."""
    body = json.dumps({"error": message, "code": int(status.split()[0])}).encode()
    connection = "Connection: close\r\n" if close else ""
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n{connection}"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


HEADERS_TOO_LARGE = _answer(
    "431 Request Header Fields Too Large", f"request headers larger than {HEADER_BYTES} bytes"
)
TOO_SLOW = _answer("408 Request Timeout", "the request was not received in time")

# What a staged connection is waiting for; DISCARD: the rest of a body refused with a 413.
HANDSHAKE, REQUEST, IDLE, LINGER, DISCARD = "handshake", "request", "idle", "linger", "discard"
# Framing verdicts: read the body here, hand the request on as it is, or refused already.
READ, HAND_ON, REFUSED = "read", "hand-on", "refused"


class ChunkScan:
    """Finds the end of a chunked body incrementally: each byte is looked at a bounded number
    of times, however the body is split across reads."""

    def __init__(self, start: int) -> None:
        self.pos = start  # where the next chunk-size line (or the trailers) begins
        self.body = 0  # chunk data bytes seen so far
        self.declared = 0  # those and the chunk being received
        self.trailers = False

    def end(self, buf: bytearray) -> int | None:
        """The offset just past the body, once ``buf`` holds all of it; None: not yet (or
        malformed: then gunicorn's parser is left to refuse it, see ``malformed``)."""
        while True:
            line_end = buf.find(b"\r\n", self.pos)
            if line_end < 0:
                return None
            if self.trailers:
                if line_end == self.pos:
                    return line_end + 2
                self.pos = line_end + 2
                continue
            size_text = bytes(buf[self.pos : line_end]).split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                self.malformed = True
                return line_end + 2
            if size == 0:
                self.trailers = True
                self.pos = line_end + 2
                continue
            data_end = line_end + 2 + size + 2
            self.declared = self.body + size
            if len(buf) < data_end:
                return None
            self.body += size
            self.pos = data_end

    malformed = False


class ChunkSkip:
    """Reads past a chunked body without keeping it (bytes fed as they come)."""

    def __init__(self) -> None:
        self.line = bytearray()
        self.state = "size"  # size, data, crlf, trailer
        self.left = 0

    def feed(self, data: bytes) -> int | None:
        """The offset in ``data`` just past the body, or None if it goes on; ValueError if it
        is not chunked framing."""
        i, n = 0, len(data)
        while i < n:
            if self.state in ("data", "crlf"):
                take = min(self.left, n - i)
                i, self.left = i + take, self.left - take
                if self.left == 0:
                    self.state, self.left = ("crlf", 2) if self.state == "data" else ("size", 0)
                continue
            j = data.find(b"\n", i)
            if j < 0:
                self.line += data[i:]
                if len(self.line) > 4096:
                    raise ValueError("chunk line too long")
                return None
            self.line += data[i:j]
            i = j + 1
            line = bytes(self.line).rstrip(b"\r")
            self.line.clear()
            if self.state == "trailer":
                if not line:
                    return i
                continue
            size = int(line.split(b";", 1)[0].strip(), 16)
            if size < 0:
                raise ValueError("negative chunk size")
            self.state, self.left = ("trailer", 0) if size == 0 else ("data", size)
        return None


class Staged:
    """One connection while it waits on its client in the loop."""

    __slots__ = (
        "buf", "callback", "chunks", "client", "conn", "continued", "deadline", "discard_left",
        "drained", "events", "head_end", "lingered", "need", "peer", "server", "skip", "sock",
        "state",
    )  # fmt: skip

    def __init__(
        self, sock: ssl.SSLSocket, client: Any, server: Any, callback: Callable[[Any], None]
    ) -> None:
        self.sock = sock
        self.callback = callback  # what the selector calls when the socket is ready
        self.client = client
        self.peer = str(client[0]) if isinstance(client, tuple) else str(client)
        self.server = server
        self.conn: TConn | None = None  # gunicorn's connection, once a request was dispatched
        self.state = HANDSHAKE
        self.deadline = 0.0
        self.buf = bytearray()
        self.head_end: int | None = None  # offset just past the blank line ending the headers
        self.need: int | None = None  # total bytes of the request, when known
        self.chunks: ChunkScan | None = None
        self.continued = False  # "100 Continue" sent for this request
        self.events = 0
        self.lingered = 0
        # Discarding a refused body: bytes still due (declared length) or the chunk reader.
        self.discard_left = 0
        self.skip: ChunkSkip | None = None
        self.drained = 0

    def reset_request(self) -> None:
        self.head_end = self.need = self.chunks = None
        self.continued = False


# The header fields that frame a request, each line's value (gunicorn parses them all later;
# this only finds where the request ends, in one C-speed pass over the header block).
_FRAMING = re.compile(
    rb"\r\n(content-length|transfer-encoding|expect)[ \t]*:([^\r\n]*)", re.IGNORECASE
)


def _header_fields(head: bytes) -> dict[bytes, list[bytes]]:
    fields: dict[bytes, list[bytes]] = {}
    for name, value in _FRAMING.findall(head):
        fields.setdefault(name.lower(), []).append(value.strip().lower())
    return fields


class StagedWorker(ThreadWorker):
    """gunicorn's gthread worker, with handshakes and request reads in its event loop."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        settings = getattr(self.app, "settings", None)
        if not isinstance(settings, Settings):
            settings = Settings()
        self.deadline_seconds = settings.request_deadline
        self.max_connections = settings.max_connections
        self.max_per_peer = settings.max_connections_per_peer
        self.max_body = settings.max_body_bytes
        self.budget = 2 * settings.max_body_bytes + HEADER_BYTES
        # app.webhook.server.BodyLimit's 413, word for word; kept-alive unless the body is past
        # draining.
        too_large = f"request body larger than {self.max_body} bytes (--max-body-bytes)"
        self.too_large = _answer("413 Request Entity Too Large", too_large)
        self.too_large_keep = _answer("413 Request Entity Too Large", too_large, close=False)
        # gunicorn stops accepting at worker_connections, leaving new connections queued in the
        # kernel behind whatever holds the slots: this worker always accepts and decides itself.
        self.worker_connections = sys.maxsize
        self.staged: dict[Staged, None] = {}  # waiting in the loop, oldest first
        self.by_peer: dict[str, dict[Staged, None]] = {}
        self.peer_count: dict[str, int] = {}  # every open connection, staged or in a thread
        self.loading: dict[Staged, None] = {}  # holding request bytes, oldest first
        self.buffered = 0
        self.deadlines: list[tuple[float, int, Staged]] = []
        self.seq = itertools.count()
        self.by_conn: dict[TConn, Staged] = {}

    # --- accepting --------------------------------------------------------------------------

    def accept(self, listener: socket.socket) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                raw, client = listener.accept()
            except OSError as exc:
                if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK, errno.ECONNABORTED):
                    return
                raise
            self._admit(raw, client, listener.getsockname())

    def _admit(self, raw: socket.socket, client: Any, server: Any) -> None:
        raw.setblocking(False)
        peer = str(client[0]) if isinstance(client, tuple) else str(client)
        if not self._make_room(peer):
            _abort(raw)
            _closed_early("refused")
            return
        try:
            sock = gsock.ssl_context(self.cfg).wrap_socket(
                raw,
                server_side=True,
                do_handshake_on_connect=False,
                suppress_ragged_eofs=self.cfg.suppress_ragged_eofs,
            )
        except (OSError, ValueError):
            _abort(raw)
            return
        # A thread writing an answer to a client that does not read must not wait for ever.
        _send_timeout(raw, self.deadline_seconds)
        staged = Staged(sock, client, server, lambda _: None)
        staged.callback = partial(self._on_event, staged)
        self.nr_conns += 1
        self.peer_count[peer] = self.peer_count.get(peer, 0) + 1
        self._stage(staged, HANDSHAKE, time.monotonic() + self.deadline_seconds)
        self._progress(staged)

    def _make_room(self, peer: str) -> bool:
        """Room for one more connection from ``peer``: the oldest waiting one (of that peer, or
        of anyone) is closed if needed; False if every connection is busy in a thread."""
        if self.peer_count.get(peer, 0) >= self.max_per_peer:
            waiting = self.by_peer.get(peer)
            if not waiting:
                return False
            self._drop(next(iter(waiting)), "evicted")
        if self.nr_conns >= self.max_connections:
            if not self.staged:
                return False
            self._drop(next(iter(self.staged)), "evicted")
        return True

    # --- the stage ----------------------------------------------------------------------------

    def _stage(self, staged: Staged, state: str, deadline: float) -> None:
        staged.state = state
        self._set_deadline(staged, deadline)
        self.staged[staged] = None
        self.by_peer.setdefault(staged.peer, {})[staged] = None
        self._watch(staged, selectors.EVENT_READ)

    def _set_deadline(self, staged: Staged, deadline: float) -> None:
        staged.deadline = deadline
        heapq.heappush(self.deadlines, (deadline, next(self.seq), staged))

    def _watch(self, staged: Staged, events: int) -> None:
        if staged.events == events:
            return
        try:
            if staged.events:
                self.poller.modify(staged.sock, events, staged.callback)
            else:
                self.poller.register(staged.sock, events, staged.callback)
        except (OSError, ValueError, KeyError):
            self._drop(staged)
            return
        staged.events = events

    def _unstage(self, staged: Staged) -> None:
        self.staged.pop(staged, None)
        waiting = self.by_peer.get(staged.peer)
        if waiting is not None:
            waiting.pop(staged, None)
            if not waiting:
                del self.by_peer[staged.peer]
        self._release(staged)
        if staged.events:
            with contextlib.suppress(OSError, ValueError, KeyError):
                self.poller.unregister(staged.sock)
            staged.events = 0

    def _release(self, staged: Staged) -> None:
        if staged in self.loading:
            del self.loading[staged]
            self.buffered -= len(staged.buf)

    def _drop(self, staged: Staged, reason: str | None = None) -> None:
        """Close a staged connection now; ``reason``: the server's, counted (else the client's,
        or the end of its keep-alive)."""
        if staged in self.staged:
            self._unstage(staged)
            self._close(staged)
            if reason is not None:
                _closed_early(reason)

    def _close(self, staged: Staged) -> None:
        """Close a connection that is not (or no longer) staged."""
        staged.buf = bytearray()
        if staged.conn is not None:
            self.by_conn.pop(staged.conn, None)
        self.nr_conns -= 1
        left = self.peer_count.get(staged.peer, 1) - 1
        if left > 0:
            self.peer_count[staged.peer] = left
        else:
            self.peer_count.pop(staged.peer, None)
        _abort(staged.sock)

    def _on_event(self, staged: Staged, fileobj: Any) -> None:
        if staged in self.staged:
            self._progress(staged)

    def _progress(self, staged: Staged) -> None:
        """Take the connection as far as its client's bytes allow, without waiting."""
        try:
            if staged.state == HANDSHAKE:
                staged.sock.do_handshake()
                if staged.sock.selected_alpn_protocol() == "h2":
                    raise ssl.SSLError("HTTP/2 is not served")
                staged.state = REQUEST
            if staged.state == LINGER:
                self._linger(staged)
                return
            self._read(staged)
        except ssl.SSLWantReadError:
            self._watch(staged, selectors.EVENT_READ)
        except ssl.SSLWantWriteError:
            self._watch(staged, selectors.EVENT_WRITE)
        except (OSError, ValueError):
            self._drop(staged)
        except Exception:
            # A fault here must cost this connection, not the loop every connection of the
            # worker waits in.
            self.log.exception("closing a connection after an error reading its request")
            self._drop(staged)

    def _read(self, staged: Staged) -> None:
        taken = 0
        while taken < READ_SLICE:
            data = staged.sock.recv(65536)
            if not data:
                self._drop(staged)
                return
            taken += len(data)
            if staged.state == DISCARD:
                if self._discard(staged, data):
                    return
                continue
            if staged.state == IDLE:
                # The next request's first byte: its deadline starts now.
                staged.state = REQUEST
                self._set_deadline(staged, time.monotonic() + self.deadline_seconds)
            if not self._keep(staged, data) or self._complete(staged):
                return
        # More may be waiting (in the kernel or in TLS records already read): come back to it
        # after the other connections had their turn.
        self.method_queue.defer(self._on_event, staged, None)

    def _keep(self, staged: Staged, data: bytes) -> bool:
        """Buffer ``data`` within the worker's budget: the oldest partial requests are dropped
        to make room (this one too, when it is the oldest)."""
        while self.buffered + len(data) > self.budget and self.loading:
            oldest = next(iter(self.loading))
            self._drop(oldest, "buffer")
            if oldest is staged:
                return False
        if self.buffered + len(data) > self.budget:
            self._drop(staged, "buffer")
            return False
        if staged not in self.loading:
            self.loading[staged] = None
        staged.buf += data
        self.buffered += len(data)
        return True

    def _complete(self, staged: Staged) -> bool:
        """Dispatch the request if it is all here; True if the connection left the stage."""
        buf = staged.buf
        if staged.head_end is None:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > HEADER_BYTES:
                    self._refuse(staged, HEADERS_TOO_LARGE, "headers")
                    return True
                return False
            staged.head_end = end + 4
            verdict = self._framing(staged)
            if verdict == HAND_ON:
                self._dispatch(staged)
            if verdict != READ:
                return True
        if staged.chunks is not None:
            body_end = staged.chunks.end(buf)
            if body_end is None:
                if staged.chunks.declared <= self.max_body:
                    return False
                return self._too_large(staged, None)
            staged.need = body_end
        if staged.need is not None and len(buf) < staged.need:
            return False
        self._dispatch(staged)
        return True

    def _framing(self, staged: Staged) -> str:
        """Learn how long the request is: READ its body here, HAND_ON the request as it is
        (framing gunicorn refuses before reading a body: it answers 400), or REFUSED (413)."""
        assert staged.head_end is not None
        fields = _header_fields(bytes(staged.buf[: staged.head_end - 4]))
        encoding, length = fields.get(b"transfer-encoding"), fields.get(b"content-length")
        expects = fields.get(b"expect") == [b"100-continue"]
        if encoding is not None:
            if length is not None or encoding != [b"chunked"]:
                return HAND_ON
            staged.chunks = ChunkScan(staged.head_end)
        elif length is not None:
            if len(set(length)) != 1 or not (length[0].isascii() and length[0].isdigit()):
                return HAND_ON
            size = int(length[0])
            if size > self.max_body:
                if expects and len(staged.buf) == staged.head_end:
                    # As gunicorn did: the interim answer first, then the refusal.
                    staged.sock.send(CONTINUE)
                self._too_large(staged, size)
                return REFUSED
            staged.need = staged.head_end + size
        else:
            staged.need = staged.head_end
        wants_body = staged.chunks is not None or (staged.need or 0) > staged.head_end
        if expects and wants_body:
            if len(staged.buf) == staged.head_end:
                # The client waits for this before it sends the body; sent here, not by the
                # thread later (handle_request).
                staged.sock.send(CONTINUE)
            staged.continued = True
        return READ

    def _too_large(self, staged: Staged, declared: int | None) -> bool:
        """Refuse a body over the limit with a 413 from here, then read the rest of it and
        throw it away (up to DRAIN_BYTES within DRAIN_SECONDS, as app.webhook.server.BodyLimit did),
        so that a client writing its whole body first reads the 413 on an intact connection
        that serves its next request. A declared length past DRAIN_BYTES is answered and closed.
        True: the request left the stage (as ``_complete``)."""
        assert staged.head_end is not None
        body = bytes(staged.buf[staged.head_end :])
        self._release(staged)
        staged.buf = bytearray()
        if declared is not None and declared > DRAIN_BYTES:
            staged.sock.send(self.too_large)
            self._unstage(staged)
            self._start_linger(staged, time.monotonic())
            return True
        staged.sock.send(self.too_large_keep)
        staged.state = DISCARD
        staged.discard_left = declared or 0
        staged.skip = ChunkSkip() if declared is None else None
        staged.drained = 0
        self._set_deadline(staged, time.monotonic() + DRAIN_SECONDS)
        self._discard(staged, body)
        return True

    def _discard(self, staged: Staged, data: bytes) -> bool:
        """Throw refused body bytes away; once the body is over, the connection waits for its
        next request. True if the connection left the stage or closed."""
        staged.drained += len(data)
        if staged.skip is None:
            taken = min(len(data), staged.discard_left)
            staged.discard_left -= taken
            end: int | None = taken if staged.discard_left == 0 else None
        else:
            try:
                end = staged.skip.feed(data)
            except ValueError:
                self._drop(staged)
                return True
        if end is None:
            if staged.drained > DRAIN_BYTES:
                self._drop(staged)
                return True
            return False
        staged.skip = None
        staged.reset_request()
        return self._await_next(staged, data[end:], time.monotonic())

    def _dispatch(self, staged: Staged) -> None:
        """The request is in memory: a thread serves it from there."""
        self._unstage(staged)
        sock = staged.sock
        conn = staged.conn
        if conn is None:
            conn = TConn(self.cfg, sock, staged.client, staged.server)
            conn.initialized = True
            conn.parser = http.get_parser(self.cfg, sock, staged.client)
            staged.conn = conn
            self.by_conn[conn] = staged
        conn.data_ready = True
        conn.continued = staged.continued
        conn.parser.unreader.unread(bytes(staged.buf))
        staged.buf = bytearray()
        staged.reset_request()
        sock.setblocking(True)
        self.enqueue_req(conn)

    def _refuse(self, staged: Staged, answer: bytes, reason: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            staged.sock.send(answer)
        self._drop(staged, reason)

    # --- after a thread served a request ------------------------------------------------------

    def handle_request(self, req: Any, conn: TConn) -> Any:
        if getattr(conn, "continued", False):
            req._expected_100_continue = False  # the loop sent it already
        return super().handle_request(req, conn)

    def finish_request(self, conn: TConn, fs: Any) -> None:
        staged = self.by_conn.get(conn)
        if staged is None:  # not one of ours (cannot happen): gunicorn's way
            super().finish_request(conn, fs)
            return
        try:
            keep = bool(fs.result()) if not fs.cancelled() else False
        except Exception:
            keep = False
        try:
            conn.sock.setblocking(False)
        except (OSError, ValueError):
            self._close(staged)
            return
        now = time.monotonic()
        if not keep:
            self._start_linger(staged, now)
            return
        staged.buf = bytearray()
        if not self._await_next(staged, conn.parser.unreader.take_buffered(), now):
            self._progress(staged)

    def _await_next(self, staged: Staged, leftover: bytes, now: float) -> bool:
        """Wait in the loop for the connection's next request, ``leftover`` its first bytes
        (the client pipelined it). True if the connection left the stage or closed."""
        self._unstage(staged)
        idle_until = now + self.cfg.keepalive
        if not self.alive:
            idle_until = min(idle_until, now + STOP_KEEPALIVE_LINGER)
        self._stage(staged, IDLE, idle_until)
        if not leftover:
            return False
        staged.state = REQUEST
        self._set_deadline(staged, now + self.deadline_seconds)
        return not self._keep(staged, leftover) or self._complete(staged)

    def _start_linger(self, staged: Staged, now: float) -> None:
        """After the last answer: half-close, then wait in the loop for the client to close
        (RFC 9112, 9.6), so that its unread bytes do not turn our close into a reset."""
        try:
            staged.sock.shutdown(socket.SHUT_WR)
        except (OSError, ValueError):
            self._close(staged)
            return
        staged.lingered = 0
        self._stage(staged, LINGER, now + LINGER_SECONDS)
        self._progress(staged)

    def _linger(self, staged: Staged) -> None:
        # Half-closed, the socket reads the raw stream (the TLS layer is gone): what is left of
        # the client's bytes is read and thrown away until it closes.
        while staged.lingered < LINGER_BYTES:
            try:
                data = staged.sock.recv(4096)
            except BlockingIOError:
                self._watch(staged, selectors.EVENT_READ)
                return
            if not data:
                break
            staged.lingered += len(data)
        self._drop(staged)

    # --- deadlines and stopping (gunicorn calls these every turn of its loop) ---------------

    def murder_keepalived(self, force: bool = False) -> None:
        now = time.monotonic()
        if force:
            for staged in list(self.staged):
                self._drop(staged)
            self.deadlines.clear()
            return
        while self.deadlines and self.deadlines[0][0] <= now:
            deadline, _, staged = heapq.heappop(self.deadlines)
            if staged.deadline == deadline and staged in self.staged:
                if staged.state == REQUEST and staged.buf:
                    # A request begun and not finished in time is told so, then cut off.
                    self._refuse(staged, TOO_SLOW, "deadline")
                else:
                    early = staged.state in (HANDSHAKE, REQUEST, DISCARD)
                    self._drop(staged, "deadline" if early else None)

    def murder_pending(self) -> None:
        pass  # no connection waits for its first bytes outside the stage

    def _cap_keepalive(self, deadline: float) -> None:
        # Stopping: connections with no request begun get what kept-alive ones get from
        # gunicorn, a short while for one arriving now, so that connections held open without
        # a request do not keep the worker past it.
        for staged in list(self.staged):
            if staged.state != LINGER and not staged.buf and staged.deadline > deadline:
                self._set_deadline(staged, deadline)


# Told of every connection the server closes before its request was complete, with the reason:
# refused, evicted, buffer, headers, deadline (app.webhook.metrics counts them; set in each worker).
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


def _send_timeout(sock: socket.socket, seconds: float) -> None:
    """SO_SNDTIMEO: a blocking send gives up after ``seconds`` (the threads' sockets block)."""
    whole = int(seconds)
    packed = struct.pack("ll", whole, int((seconds - whole) * 1_000_000))
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, packed)
