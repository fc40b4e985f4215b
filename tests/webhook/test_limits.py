"""Size and nesting limits against the real server process, over real TLS sockets.

The largest review the API server can send must be decided; a body over ``--max-body-bytes``
must get a JSON 413 that the client can read, whether it declared its length, asked
``Expect: 100-continue`` first, or sent chunks; JSON nested as deep as the API server allows must
get an ordinary decision.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from app.deepjson import API_SERVER_MAX_DEPTH
from app.settings import DEFAULT_MAX_BODY_BYTES
from app.webhook.server import BODY_READ_TIMEOUT
from tests.process import Server, read_reply, serve
from tests.support import make_review

MIB = 1024 * 1024
# etcd's default request limit, the most a stored object can weigh in its storage encoding.
ETCD_OBJECT_BYTES = 3 * MIB // 2
# Go's encoding/json writes "<", ">", "&", control characters and invalid UTF-8 as \uXXXX.
WORST_ESCAPE = 6


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The server with its default limits: nothing about size or depth is configured."""
    tmp = tmp_path_factory.mktemp("limits")
    with serve(tmp, "--rbac-dir", "manifests/examples", "--workers", "1", "--threads", "2") as srv:
        yield srv


def configmap_update(user: str) -> dict[str, Any]:
    """alice may touch team=a configmaps in t1, bob may not: the same review decides both ways."""
    labels = {"team": "a"}
    return make_review(
        user, "UPDATE", "configmaps", namespace="t1", labels=labels, old_labels=labels
    )


def encode(review: dict[str, Any], *, escaped_run: int = 0, depth: int = 0) -> bytes:
    """The review as JSON, with ``"PAD"`` replaced by a run of ``\\u003c`` escapes and ``"DEEP"``
    by an object nested ``depth`` levels (both written out, as no encoder would build them)."""
    text = json.dumps(review)
    if escaped_run:
        text = text.replace('"PAD"', '"' + "\\u003c" * escaped_run + '"')
    if depth:
        text = text.replace('"DEEP"', '{"a":' * depth + "{}" + "}" * depth)
    return text.encode()


def post(server: Server, body: bytes, headers: str = "") -> Any:
    with server.connect(timeout=60) as sock:
        head = (
            "POST /validate HTTP/1.1\r\nHost: webhook\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{headers}\r\n"
        )
        sock.sendall(head.encode() + body)
        return read_reply(sock)


def test_the_largest_review_the_api_server_can_send_is_decided(server: Server) -> None:
    """An UPDATE of an object at etcd's limit, every byte of it escaped six-fold, both copies."""
    run = ETCD_OBJECT_BYTES
    for user, allowed in (("alice", True), ("bob", False)):
        review = configmap_update(user)
        review["request"]["object"]["data"] = {"blob": "PAD"}
        review["request"]["oldObject"]["data"] = {"blob": "PAD"}
        body = encode(review, escaped_run=run)
        assert len(body) > 2 * WORST_ESCAPE * ETCD_OBJECT_BYTES
        assert len(body) <= DEFAULT_MAX_BODY_BYTES
        reply = post(server, body)
        assert reply.status == 200, reply.body[:200]
        decision = reply.json()["response"]
        assert decision["uid"] == review["request"]["uid"]
        assert decision["allowed"] is allowed, decision


@pytest.mark.parametrize("user,allowed", [("alice", True), ("bob", False)])
def test_objects_nested_as_deep_as_the_api_server_allows_are_decided(
    server: Server, user: str, allowed: bool
) -> None:
    review = configmap_update(user)
    review["request"]["object"]["spec"] = "DEEP"
    review["request"]["oldObject"]["spec"] = "DEEP"
    reply = post(server, encode(review, depth=API_SERVER_MAX_DEPTH))
    assert reply.status == 200, reply.body[:200]
    assert reply.json()["response"]["allowed"] is allowed


def test_nesting_beyond_any_api_server_is_a_400_not_a_crash(server: Server) -> None:
    review = configmap_update("alice")
    review["request"]["object"]["spec"] = "DEEP"
    reply = post(server, encode(review, depth=200_000))
    assert reply.status == 400
    assert "nested deeper" in reply.json()["error"]
    assert server.request("GET", "/healthz")[0] == 200


def _chunked(body: bytes, size: int = 64 * 1024) -> bytes:
    parts = [
        b"%x\r\n%s\r\n" % (len(body[i : i + size]), body[i : i + size])
        for i in range(0, len(body), size)
    ]
    return b"".join(parts) + b"0\r\n\r\n"


def test_a_chunked_review_is_decided(server: Server) -> None:
    review = configmap_update("bob")
    with server.connect() as sock:
        sock.sendall(
            b"POST /validate HTTP/1.1\r\nHost: webhook\r\nTransfer-Encoding: chunked\r\n\r\n"
            + _chunked(json.dumps(review).encode(), 100)
        )
        reply = read_reply(sock)
    assert reply.status == 200
    assert reply.json()["response"]["allowed"] is False


OVER = DEFAULT_MAX_BODY_BYTES + MIB
HEAD = "POST /validate HTTP/1.1\r\nHost: webhook\r\nContent-Type: application/json\r\n"


@pytest.mark.parametrize(
    ("headers", "framing"),
    [
        pytest.param(f"Content-Length: {OVER}\r\n", "plain", id="declared-length"),
        pytest.param(
            f"Content-Length: {OVER}\r\nExpect: 100-continue\r\n", "expect", id="expect-continue"
        ),
        pytest.param("Transfer-Encoding: chunked\r\n", "chunked", id="chunked"),
    ],
)
def test_a_body_over_the_limit_gets_a_413_the_client_reads(
    server: Server, headers: str, framing: str
) -> None:
    """The client writes its whole body before reading, as most clients do; the connection must
    stay intact for that, the 413 must be readable, and the connection is usable afterwards."""
    body = b"x" * OVER
    with server.connect(timeout=60) as sock:
        sock.sendall((HEAD + headers + "\r\n").encode())
        if framing == "expect":
            assert read_reply(sock).status == 100
        sock.sendall(_chunked(body) if framing == "chunked" else body)
        reply = read_reply(sock)
        assert reply.status == 413
        assert reply.json() == {
            "error": f"request body larger than {DEFAULT_MAX_BODY_BYTES} bytes (--max-body-bytes)",
            "code": 413,
        }
        # The body was read to its end: the same connection serves the next request.
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: webhook\r\n\r\n")
        assert read_reply(sock).status == 200


def test_a_hopelessly_large_declared_body_is_refused_at_once(server: Server) -> None:
    """Past what is worth reading, the 413 comes before the body and the connection closes."""
    with server.connect(timeout=30) as sock:
        sock.sendall((HEAD + "Content-Length: 10000000000\r\n\r\n").encode())
        reply = read_reply(sock)  # without a byte of the body sent
        assert reply.status == 413
        assert sock.recv(1) == b""  # closed cleanly after the answer
    assert server.request("GET", "/healthz")[0] == 200


def test_a_stalled_body_gets_a_408_and_frees_the_thread(server: Server) -> None:
    """A client that stops sending its body is answered after BODY_READ_TIMEOUT and cut off."""
    with server.connect(timeout=BODY_READ_TIMEOUT + 10) as sock:
        sock.sendall((HEAD + "Content-Length: 1000\r\n\r\n").encode() + b'{"kind": ')
        started = time.monotonic()
        reply = read_reply(sock)
        waited = time.monotonic() - started
    assert reply.status == 408 and reply.json()["code"] == 408
    assert BODY_READ_TIMEOUT - 1 <= waited <= BODY_READ_TIMEOUT + 5
    assert server.review(configmap_update("alice"))["response"]["allowed"] is True
