"""Differential fuzzing of request framing: the real server against h11 as the reference parser.

``streams()`` draws what one connection sends: one to three pipelined ``POST /validate``
requests, each carrying an AdmissionReview with a uid of its own, framed by Content-Length
(exact, wrong, signed, prefixed, repeated), by Transfer-Encoding (every list of ``chunked``,
``gzip``, ``identity``, ``deflate``, in one header line or several, with or without a
Content-Length) with chunk-size lines that may carry signs, ``0x`` prefixes, whitespace,
extensions or huge values, by nothing at all, with obsolete line folding, whitespace before a
colon, trailers, ``Connection: close`` or HTTP/1.0.

``expect()`` parses the stream with a fresh h11 server connection, answering each complete
request as the server would (so that h11 moves on to the next): the requests it delivers whole,
then how the stream ends (a refusal, the end of a connection asked to close, or more bytes
awaited). ``check()`` sends the stream over real HTTPS and reads the answers with an h11 client
connection: every request the reference delivered gets its own answer in order (200 with its
uid for a review, else 400 from the app); a stream the reference refuses (or that carries
Content-Length and Transfer-Encoding together, which the server refuses on purpose) ends with a
400, 413, 431 or 501 and the connection closed; nothing is answered that the reference did not
deliver, and nothing takes longer than ``TIMEOUT``. Used by tests/webhook/test_framing_fuzz.py
(a short run) and ``python -m bench framing`` (a long one).
"""

from __future__ import annotations

import json
import socket
import ssl
import uuid
from dataclasses import dataclass, field
from typing import Any

import h11
from hypothesis import strategies as st

from tests.support import make_review

TIMEOUT = 5.0
REFUSALS = frozenset({400, 413, 431, 501, 505})
CODINGS = ("chunked", "gzip", "identity", "deflate", "Chunked", "x-custom")


def review_body(uid: str) -> bytes:
    review = make_review("alice", "CREATE", "configmaps", namespace="t1", labels={"team": "a"})
    review["request"]["uid"] = uid
    return json.dumps(review).encode()


@st.composite
def chunk_size(draw: st.DrawFn, size: int) -> bytes:
    """A chunk-size line for ``size`` bytes, well-formed or not."""
    digits = draw(st.sampled_from([f"{size:x}", f"{size:X}", f"{size:04x}"]))
    if draw(st.integers(0, 9)) == 0:
        digits = draw(st.sampled_from(["ffffffffffffffff", "1" + "0" * 19, "f" * 21, "-0"]))
    prefix = draw(st.sampled_from(["", "", "", "-", "+", "0x", "0X", " ", "\t", "_"]))
    suffix = draw(st.sampled_from(["", "", "", " ", "\t", ";ext", ";a=b", '; a="x y"', "_0"]))
    return f"{prefix}{digits}{suffix}".encode()


@st.composite
def chunked(draw: st.DrawFn, body: bytes) -> bytes:
    cuts = sorted(draw(st.sets(st.integers(1, max(len(body) - 1, 1)), max_size=4)))
    pieces = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
    out = b"".join(draw(chunk_size(len(p))) + b"\r\n" + p + b"\r\n" for p in pieces if p)
    last = draw(st.sampled_from([b"0", b"000", b"0;ext", b"-0", b"0x0"]))
    trailers = draw(st.sampled_from([b"", b"", b"X-Trailer: 1\r\n", b"Bad Trailer\r\n"]))
    return out + last + b"\r\n" + trailers + b"\r\n"


@st.composite
def framed(draw: st.DrawFn, body: bytes) -> tuple[list[bytes], bytes]:
    """Framing header lines and the body as sent."""
    how = draw(st.sampled_from(["length", "length", "encoding", "encoding", "none"]))
    lines: list[bytes] = []
    sent = body
    if how == "length" or (how == "encoding" and draw(st.booleans()) and draw(st.booleans())):
        n = len(body) + draw(st.sampled_from([0, 0, 0, 0, -1, 1]))
        value = draw(
            st.sampled_from(
                [
                    f"{n}",
                    f"{n}",
                    f"+{n}",
                    f"-{n}",
                    f"0x{n:x}",
                    f"0{n}",
                    f"{n}, {n}",
                    f" {n} ",
                    f"{n}, {n + 1}",
                    f"{n}_0",
                ]
            )
        )
        lines.append(b"Content-Length: " + value.encode())
        if draw(st.integers(0, 5)) == 0:
            lines.append(b"Content-Length: " + value.encode())
    if how == "encoding":
        codings = draw(st.lists(st.sampled_from(CODINGS), min_size=1, max_size=3))
        if draw(st.booleans()):
            lines.append(b"Transfer-Encoding: " + ", ".join(codings).encode())
        else:
            lines += [b"Transfer-Encoding: " + c.encode() for c in codings]
        if "chunked" in (c.lower() for c in codings):
            sent = draw(chunked(body))
    return lines, sent


@st.composite
def request(draw: st.DrawFn) -> tuple[bytes, str]:
    uid = str(uuid.UUID(int=draw(st.integers(0, 2**128 - 1))))
    body = review_body(uid)
    lines, sent = draw(framed(body))
    lines = [b"Host: webhook", b"Content-Type: application/json", *lines]
    if draw(st.integers(0, 5)) == 0:
        lines.insert(draw(st.integers(1, len(lines))), b"X-Folded: a\r\n b")  # obs-fold
    if draw(st.integers(0, 7)) == 0:
        lines.append(b"Connection: close")
    if draw(st.integers(0, 9)) == 0:  # whitespace before the colon: a 400 (RFC 9112, 5.1)
        lines = [line.replace(b"-Length:", b"-Length :").replace(b"Encoding:", b"Encoding\t:")
                 for line in lines]  # fmt: skip
    draw(st.randoms()).shuffle(lines)
    version = draw(st.sampled_from([b"HTTP/1.1"] * 7 + [b"HTTP/1.0"]))
    head = b"POST /validate " + version + b"\r\n" + b"\r\n".join(lines) + b"\r\n\r\n"
    return head + sent, uid


@st.composite
def streams(draw: st.DrawFn) -> bytes:
    """What one connection sends: one to three requests, back to back."""
    return b"".join(draw(request())[0] for _ in range(draw(st.integers(1, 3))))


@dataclass
class Expected:
    """What the reference parser makes of a stream."""

    # Requests delivered whole, in order: method, target and body.
    requests: list[tuple[bytes, bytes, bytes]] = field(default_factory=list)
    end: str = "more"  # refused (an error status follows), closed, or more (bytes awaited)


def expect(stream: bytes) -> Expected:
    ref = h11.Connection(h11.SERVER)
    ref.receive_data(stream)
    expected = Expected()
    body: list[bytes] = []
    head = (b"", b"")
    while True:
        try:
            event = ref.next_event()
        except h11.RemoteProtocolError:
            expected.end = "refused"
            return expected
        if event is h11.NEED_DATA:
            return expected
        if isinstance(event, h11.Request):
            names = {name for name, _ in event.headers}
            if {b"content-length", b"transfer-encoding"} <= names:
                expected.end = "refused"  # the server's own stricter rule (RFC 9112, 6.3)
                return expected
            head, body = (event.method, event.target), []
        elif isinstance(event, h11.Data):
            body.append(bytes(event.data))
        elif isinstance(event, h11.EndOfMessage):
            expected.requests.append((*head, b"".join(body)))
            ref.send(h11.Response(status_code=200, headers=[(b"Content-Length", b"0")]))
            ref.send(h11.EndOfMessage())
            if ref.our_state is h11.MUST_CLOSE:
                expected.end = "closed"
                return expected
            ref.start_next_cycle()
        else:
            return expected


def answer_for(method: bytes, target: bytes, body: bytes) -> int | str:
    """The uid a review's answer must echo, else the status the app answers: 405 for another
    method (the stream's bytes shifted by a wrong length: ``OST``), 404 another path, 400 a body
    that is not a review."""
    if target != b"/validate":
        return 404
    if method != b"POST":
        return 405
    try:
        document = json.loads(body)
        uid = document["request"]["uid"]
    except (ValueError, TypeError, KeyError):
        return 400
    return uid if isinstance(uid, str) else 400


@dataclass
class Answer:
    status: int
    body: bytes


NO_BODY = [("Host", "webhook"), ("Content-Length", "0")]


class Reader:
    """Responses off a raw connection, parsed by h11 as a client."""

    def __init__(self, sock: ssl.SSLSocket) -> None:
        self.sock = sock
        self.http = h11.Connection(h11.CLIENT)
        self.closed = False

    def next(self) -> Answer | None:
        """The next final answer; None if the server closed first."""
        if self.http.our_state is h11.DONE:
            self.http.start_next_cycle()
        self.http.send(h11.Request(method="POST", target="/", headers=NO_BODY))
        self.http.send(h11.EndOfMessage())
        answer: Answer | None = None
        while True:
            event = self.http.next_event()
            if event is h11.NEED_DATA:
                data = self.sock.recv(65536)  # the socket's timeout bounds the wait
                self.http.receive_data(data)
                continue
            if isinstance(event, h11.Response):
                answer = Answer(event.status_code, b"")
            elif isinstance(event, h11.Data) and answer is not None:
                answer.body += bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                return answer
            elif isinstance(event, h11.ConnectionClosed):
                self.closed = True
                return None

    def closes(self) -> bool:
        """The server closes the connection (within the socket's timeout), sending nothing."""
        if self.http.trailing_data[0]:
            return False
        try:
            data = self.sock.recv(65536)
        except ssl.SSLError:
            return True
        except (ConnectionResetError, BrokenPipeError):
            return True
        return data == b""


def check(address: tuple[str, int], context: ssl.SSLContext, stream: bytes) -> None:
    """Send ``stream`` on a new connection; the server must answer as h11 parses it."""
    expected = expect(stream)
    raw = socket.create_connection(address, timeout=TIMEOUT)
    with context.wrap_socket(raw, server_hostname=address[0]) as sock:
        sock.sendall(stream)
        reader = Reader(sock)
        for i, (method, target, body) in enumerate(expected.requests):
            answer = reader.next()
            assert answer is not None, f"closed before answering request {i + 1}"
            uid = answer_for(method, target, body)
            if isinstance(uid, int):
                assert answer.status == uid, (i, answer)
                continue
            assert answer.status == 200, (i, answer)
            got: dict[str, Any] = json.loads(answer.body)
            assert got["response"]["uid"] == uid, (i, uid, got)
        if expected.end == "refused":
            answer = reader.next()
            assert answer is not None and answer.status in REFUSALS, answer
            assert reader.closes(), "still open after refusing"
        elif expected.end == "closed":
            assert reader.closes(), "still open after a request asking to close"
        else:
            # More bytes awaited: nothing else is answered meanwhile.
            sock.settimeout(0.2)
            try:
                extra = sock.recv(65536)
            except (TimeoutError, ssl.SSLError):
                extra = b""
            assert extra == b"" and not reader.http.trailing_data[0], extra
