"""Differential fuzzing of request framing against the real server (tests/webhook/framing.py).

A short, repeatable run (the hypothesis profile's examples); ``python -m bench framing`` runs a
long one. The server must answer every stream as h11, the reference parser, parses it, or refuse
it (400, 413, 431, 501) and close; afterwards its workers are the same ones, and idle.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings

from tests.process import Server, serve
from tests.webhook.framing import check, expect, streams
from tests.webhook.test_connections import address
from tests.webhook.test_framing import assert_quiet, workers


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The shipped serving model: 2 workers of 4 threads."""
    tmp = tmp_path_factory.mktemp("fuzz")
    with serve(tmp, "--rbac-dir", "manifests/examples") as srv:
        yield srv


def test_the_server_frames_requests_as_the_reference_parser(server: Server) -> None:
    before = workers(server)
    context = server.context()

    @settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(streams())
    def frames_as_h11(stream: bytes) -> None:
        check(address(server), context, stream)

    frames_as_h11()
    assert_quiet(server, before)


@pytest.mark.parametrize(
    ("stream", "bodies", "end"),
    [
        pytest.param(b"POST /validate HTTP/1.1\r\nHost: w\r\nTransfer-Encoding: chunked\r\n\r\n"
                     b"-6\r\nabcdef\r\n0\r\n\r\n", 0, "refused", id="negative-chunk"),
        pytest.param(b"POST /validate HTTP/1.1\r\nHost: w\r\nContent-Length: 2\r\n\r\n{}"
                     b"POST /validate HTTP/1.1\r\nHost: w\r\nContent-Length: 2\r\n\r\n{}",
                     2, "more", id="pipelined"),
        pytest.param(b"POST /validate HTTP/1.1\r\nHost: w\r\nContent-Length: 1\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 0, "refused", id="cl-and-te"),
    ],
)  # fmt: skip
def test_the_reference_parses_as_rfc_9112_says(stream: bytes, bodies: int, end: str) -> None:
    """The reference itself, on streams whose parse is known."""
    expected = expect(stream)
    assert (len(expected.requests), expected.end) == (bodies, end)
