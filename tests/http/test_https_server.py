"""The real server process: gunicorn + TLS on loopback, reviews posted over HTTPS."""

from __future__ import annotations

import json
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from tests.process import Server, serve
from tests.support import ROOT, load_review, make_review


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("https")
    with serve(tmp, "--rbac-dir", "manifests/examples", "--workers", "2", "--threads", "2") as srv:
        yield srv


def test_decisions_over_https(server: Server) -> None:
    allowed = make_review("alice", "CREATE", "configmaps", namespace="t1", labels={"team": "a"})
    denied = make_review("bob", "CREATE", "configmaps", namespace="t1", labels={"team": "a"})
    assert server.review(allowed)["response"]["allowed"] is True
    body = server.review(denied)
    assert body["response"]["allowed"] is False
    assert body["response"]["uid"] == denied["request"]["uid"]
    assert "role t1/team-b allows team in [b]" in body["response"]["status"]["message"]


def test_recorded_reviews_are_answered(server: Server) -> None:
    """Real API-server payloads round-trip; admin's exec is unrestricted (cluster-admin)."""
    for name in ("a007-create-configmaps", "a019-connect-pods-exec", "a012-delete-configmaps"):
        review = load_review(name)
        body = server.review(review)
        assert body["response"]["uid"] == review["request"]["uid"]
        assert body["apiVersion"] == "admission.k8s.io/v1"
        assert body["response"]["allowed"] is True, (name, body)


def test_garbage_is_400_and_server_survives(server: Server) -> None:
    status, body = server.request("POST", "/validate", b"\x00garbage")
    assert status == 400 and body["code"] == 400
    assert server.request("GET", "/healthz")[0] == 200


def test_tls_is_verified_against_generated_ca(server: Server) -> None:
    # A client that does not trust the CA must fail the handshake.
    untrusting = ssl.create_default_context()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(server.base_url + "/healthz", context=untrusting, timeout=5)
    status, body = server.request("GET", "/readyz")
    assert status == 200 and body["ready"] is True


def test_serve_refuses_to_run_without_tls() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "app", "serve", "--rbac-dir", "manifests/examples"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert "TLS is required" in result.stderr


def test_decision_lines_are_logged_as_json(server: Server) -> None:
    review = make_review(
        "alice",
        "CREATE",
        "configmaps",
        namespace="t1",
        name="logged",
        labels={"team": "a"},
        uid="11111111-2222-4333-8444-555555555555",
    )
    server.review(review)
    log = server.ca.parent.parent / "server.log"
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    assert any(rec["uid"] == review["request"]["uid"] and rec["allowed"] for rec in lines)
