"""The real server process: gunicorn + TLS on loopback, reviews posted over HTTPS.

Besides decisions: configuration errors at start, JSON logs, certificate rotation under load
and shutdown under load, each against ``python -m app serve`` as a separate process.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import ProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from app import __version__
from app.webhook.certs import Authority
from tests.process import Server, serve
from tests.support import ROOT, lint_metric_family, load_review, make_access_review, make_review

REVIEW = make_review("alice", "CREATE", "configmaps", namespace="t1", labels={"team": "a"})
REVIEW_BODY = json.dumps(REVIEW).encode()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("https")
    env = {"XDG_RUNTIME_DIR": str(tmp)}  # where gunicorn would put its control socket
    with serve(
        tmp, "--rbac-dir", "manifests/examples", "--workers", "2", "--threads", "2", env=env
    ) as srv:
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


def test_every_log_line_is_json_with_time_and_level(server: Server) -> None:
    review = make_review(
        "bob",
        "CREATE",
        "configmaps",
        namespace="t1",
        name="logged",
        labels={"team": "a"},
        uid="11111111-2222-4333-8444-555555555555",
    )
    server.review(review)
    lines = _log_lines(server.log, lambda rec: rec.get("uid") == review["request"]["uid"])
    (decision,) = [rec for rec in lines if rec.get("uid") == review["request"]["uid"]]
    assert decision["level"] == "info" and decision["logger"] == "label_rbac.decisions"
    assert decision["allowed"] is False and decision["name"] == "logged"
    assert 'team="a" is not permitted' in decision["message"]
    assert "object" not in decision  # never an object body
    for record in lines:
        assert record["time"].endswith("Z") and record["level"] in ("info", "warning", "error")
    # gunicorn's own lines are JSON too.
    assert any(rec["logger"] == "gunicorn.error" for rec in lines)


def test_gunicorn_control_socket_is_off(server: Server, tmp_path_factory: Any) -> None:
    runtime = Path(server.log).parent
    assert server.request("GET", "/healthz")[0] == 200
    assert not (runtime / "gunicorn.ctl").exists()
    assert not list(runtime.glob("*.ctl"))


def _log_lines(log: Path, wait_for: Callable[[dict[str, Any]], bool] | None = None) -> list[Any]:
    """The server log as JSON records; every line but the dev-TLS notice must be JSON."""
    deadline = time.monotonic() + 5
    while True:
        records = []
        for line in log.read_text().splitlines():
            if line.startswith("dev TLS: "):
                continue
            records.append(json.loads(line))
        if wait_for is None or any(wait_for(r) for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.05)


# --- configuration errors at start: one line, no traceback, nothing forked ---------------------


def _pair(tmp: Path, cert: bytes, key: bytes) -> tuple[Path, Path]:
    (tmp / "tls.crt").write_bytes(cert)
    (tmp / "tls.key").write_bytes(key)
    return tmp / "tls.crt", tmp / "tls.key"


@pytest.fixture(scope="module")
def authority() -> Authority:
    return Authority.create()


BAD_STARTS = [
    pytest.param("missing-cert", [], "cannot read the TLS certificate", id="missing-cert"),
    pytest.param("garbage-cert", [], "is not a PEM certificate", id="garbage-cert"),
    pytest.param("garbage-key", [], "is not an unencrypted PEM private key", id="garbage-key"),
    pytest.param("mismatched", [], "does not belong to the certificate", id="mismatched-key"),
    pytest.param("good", ["--workers", "0"], "--workers must be at least 1", id="workers-0"),
    pytest.param("good", ["--threads", "-1"], "--threads must be at least 1", id="threads"),
    pytest.param("good", ["--bind", "localhost"], "expected HOST:PORT", id="bind"),
    pytest.param("good", ["--drain-seconds", "-1"], "must not be negative", id="drain"),
    pytest.param("good", ["--max-staleness", "0"], "must be positive", id="staleness"),
    pytest.param("good", ["--request-deadline", "0"], "must be positive", id="deadline"),
    pytest.param("good", ["--max-connections", "0"], "must be at least 1", id="connections"),
    pytest.param("good", ["--max-connections-per-peer", "0"], "must be at least 1", id="per-peer"),
    pytest.param(
        "good", ["--rbac-dir", "no/such/dir"], "--rbac-dir no/such/dir: not a directory", id="dir"
    ),
]


@pytest.mark.parametrize(("files", "flags", "error"), BAD_STARTS)
def test_bad_configuration_is_one_line_and_no_worker(
    tmp_path: Path, authority: Authority, files: str, flags: list[str], error: str
) -> None:
    cert, key = authority.issue(["localhost"])
    other_key = authority.issue(["localhost"])[1]
    contents = {
        "good": (cert, key),
        "garbage-cert": (b"not a certificate\n", key),
        "garbage-key": (cert, b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"),
        "mismatched": (cert, other_key),
    }
    cert_path, key_path = _pair(tmp_path, *contents.get(files, (cert, key)))
    if files == "missing-cert":
        cert_path.unlink()
    if "--rbac-dir" not in flags:
        flags = [*flags, "--rbac-dir", "manifests/examples"]
    result = subprocess.run(
        [sys.executable, "-m", "app", "serve", "--tls-cert", str(cert_path),
         "--tls-key", str(key_path), "--bind", "127.0.0.1:0", *flags],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2, result
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("serve: ") and error in result.stderr, result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert "Booting worker" not in result.stdout + result.stderr


def test_serve_refuses_to_run_without_tls() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "app", "serve", "--rbac-dir", "manifests/examples"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert "TLS is required" in result.stderr


# --- load: a steady stream of reviews, counted --------------------------------------------------


@dataclass
class Load:
    """Client threads posting reviews over HTTPS until stopped; every outcome is counted.

    Half the threads open a new connection per request (a new TLS handshake each), half keep
    their connection alive and reconnect when the server closes it, as the API server does.
    """

    server: Server
    threads: int = 4
    ok: int = 0
    failures: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _workers: list[threading.Thread] = field(default_factory=list)

    def __enter__(self) -> Load:
        for i in range(self.threads):
            thread = threading.Thread(target=self._run, args=(i % 2 == 0,), daemon=True)
            thread.start()
            self._workers.append(thread)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._workers:
            thread.join(timeout=30)

    def _connection(self) -> http.client.HTTPSConnection:
        host, port = self.server.base_url.removeprefix("https://").split(":")
        return http.client.HTTPSConnection(
            host, int(port), context=self.server.context(), timeout=10
        )

    def _run(self, keep_alive: bool) -> None:
        conn: http.client.HTTPSConnection | None = None
        while not self._stop.is_set():
            try:
                if conn is None:
                    conn = self._connection()
                conn.request("POST", "/validate", REVIEW_BODY, {"Content-Type": "application/json"})
                response = conn.getresponse()
                body = json.loads(response.read())
                if response.status != 200 or body["response"]["allowed"] is not True:
                    raise AssertionError(f"HTTP {response.status}: {body}")
                with self._lock:
                    self.ok += 1
                if not keep_alive or response.will_close:
                    conn.close()
                    conn = None
            except Exception as exc:  # every failure is a finding
                with self._lock:
                    self.failures.append(f"{type(exc).__name__}: {exc}")
                if conn is not None:
                    conn.close()
                conn = None
        if conn is not None:
            conn.close()


# --- certificate rotation ----------------------------------------------------------------------


class SecretVolume:
    """A directory updated as the kubelet updates a Secret volume (its AtomicWriter).

    The files are written into a new timestamped directory, ``..data`` is switched to it by
    renaming a symlink over it, and the old directory is removed. ``tls.crt`` and ``tls.key``
    are symlinks to ``..data/tls.crt`` and ``..data/tls.key``.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.generation = 0
        root.mkdir(parents=True, exist_ok=True)

    def write(self, files: dict[str, bytes]) -> None:
        self.generation += 1
        current = self.root / f"..{time.strftime('%Y_%m_%d_%H_%M_%S')}.{self.generation}"
        current.mkdir()
        for name, data in files.items():
            (current / name).write_bytes(data)
        data_link = self.root / "..data"
        old = data_link.resolve() if data_link.is_symlink() else None
        tmp_link = self.root / "..data_tmp"
        tmp_link.symlink_to(current.name)
        os.rename(tmp_link, data_link)
        for name in files:
            user_visible = self.root / name
            if not user_visible.is_symlink():
                user_visible.symlink_to(f"..data/{name}")
        if old is not None:
            for stale in old.iterdir():
                stale.unlink()
            old.rmdir()

    @property
    def cert(self) -> Path:
        return self.root / "tls.crt"

    @property
    def key(self) -> Path:
        return self.root / "tls.key"


def served_certificate(server: Server) -> bytes:
    """The DER certificate the server presents to a new connection."""
    host, port = server.base_url.removeprefix("https://").split(":")
    conn = http.client.HTTPSConnection(host, int(port), context=server.context(), timeout=10)
    try:
        conn.connect()
        assert isinstance(conn.sock, ssl.SSLSocket)
        der = conn.sock.getpeercert(binary_form=True)
        assert der is not None
        return der
    finally:
        conn.close()


def _der(pem: bytes) -> bytes:
    return ssl.PEM_cert_to_DER_cert(pem.decode())


@pytest.fixture
def rotating(tmp_path: Path, authority: Authority) -> Iterator[tuple[Server, SecretVolume]]:
    volume = SecretVolume(tmp_path / "tls")
    cert, key = authority.issue(["127.0.0.1", "localhost"])
    volume.write({"tls.crt": cert, "tls.key": key})
    ca = tmp_path / "ca.crt"
    ca.write_bytes(authority.pem())
    with serve(
        tmp_path,
        "--rbac-dir", "manifests/examples", "--workers", "2", "--threads", "4",
        tls=(ca, volume.cert, volume.key),
    ) as srv:  # fmt: skip
        yield srv, volume


def test_certificate_rotation_under_load_fails_no_request(
    rotating: tuple[Server, SecretVolume], authority: Authority
) -> None:
    server, volume = rotating
    pairs = [authority.issue(["127.0.0.1", "localhost"]) for _ in range(8)]
    with Load(server, threads=6) as load:
        for i in range(100):
            cert, key = pairs[i % len(pairs)]
            volume.write({"tls.crt": cert, "tls.key": key})
            time.sleep(0.02)
        time.sleep(0.3)
    assert load.failures == [], load.failures[:5]
    assert load.ok > 200, load.ok
    # The last pair written is what every worker serves now.
    last = _der(pairs[99 % len(pairs)][0])
    assert all(served_certificate(server) == last for _ in range(8))


def test_a_broken_pair_is_never_served(
    rotating: tuple[Server, SecretVolume], authority: Authority
) -> None:
    server, volume = rotating
    before = served_certificate(server)
    good_cert, good_key = authority.issue(["127.0.0.1", "localhost"])
    _, other_key = authority.issue(["127.0.0.1", "localhost"])
    for broken in (
        {"tls.crt": good_cert, "tls.key": other_key},
        {"tls.crt": good_cert[: len(good_cert) // 2], "tls.key": good_key},
    ):
        volume.write(broken)
        for _ in range(4):
            assert served_certificate(server) == before
        assert server.review(REVIEW)["response"]["allowed"] is True
    kept = "keeping the previous TLS certificate"
    errors = _log_lines(server.log, lambda r: kept in r["message"])
    assert any(
        r["level"] == "error" and "does not belong to the certificate" in r["message"]
        for r in errors
    )
    volume.write({"tls.crt": good_cert, "tls.key": good_key})
    assert all(served_certificate(server) == _der(good_cert) for _ in range(4))


# --- graceful shutdown ---------------------------------------------------------------------------


def _slow_review(server: Server, seconds: float, result: list[Any]) -> None:
    """One review whose body trickles in over ``seconds``: in flight while the server stops."""
    host, port = server.base_url.removeprefix("https://").split(":")
    conn = http.client.HTTPSConnection(host, int(port), context=server.context(), timeout=30)
    try:
        conn.putrequest("POST", "/validate")
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", str(len(REVIEW_BODY)))
        conn.endheaders()
        chunks = [REVIEW_BODY[i : i + 64] for i in range(0, len(REVIEW_BODY), 64)]
        for chunk in chunks:
            conn.send(chunk)
            time.sleep(seconds / len(chunks))
        response = conn.getresponse()
        result.append((response.status, json.loads(response.read())))
    except Exception as exc:
        result.append(exc)
    finally:
        conn.close()


def _children(pid: int) -> set[int]:
    return {int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}


@pytest.mark.parametrize(
    "send",
    [
        # As the kubelet does: SIGTERM to the container's main process only.
        pytest.param(os.kill, id="main-process"),
        # As systemd does by default (KillMode=control-group): to every process, workers too.
        pytest.param(os.killpg, id="process-group"),
    ],
)
def test_sigterm_drains_without_failing_a_request(
    tmp_path: Path, send: Callable[[int, int], None]
) -> None:
    drain = 3.0
    with serve(
        tmp_path, "--rbac-dir", "manifests/examples", "--workers", "2", "--threads", "4",
        "--drain-seconds", str(drain),
    ) as server:  # fmt: skip
        with Load(server, threads=6) as load:
            time.sleep(0.5)
            before = load.ok
            workers = _children(server.process.pid)
            send(server.process.pid, signal.SIGTERM)
            signalled = time.monotonic()
            status, body = server.request("GET", "/readyz")
            assert status == 503 and "shutting down" in body["detail"]
            assert time.monotonic() - signalled < 1
            slow: list[Any] = []
            # Starts inside the drain and is still sending its body when the drain ends.
            time.sleep(drain - 1.0)
            trickle = threading.Thread(target=_slow_review, args=(server, 2.0, slow))
            trickle.start()
            time.sleep(0.5)
            during = load.ok
            # The same workers serve the whole drain: none stops and is replaced by a new one,
            # which in a cluster would start with an empty cache.
            assert _children(server.process.pid) == workers and len(workers) == 2
            # The Service has stopped sending new connections here by now.
            load.stop()
        trickle.join(timeout=30)
        assert load.failures == [], load.failures[:5]
        assert during > before + 50, (before, during)  # served on through the drain
        assert slow and not isinstance(slow[0], Exception), slow
        assert slow[0][0] == 200 and slow[0][1]["response"]["allowed"] is True
        assert server.process.wait(timeout=30) == 0
        stopped = time.monotonic() - signalled
        assert drain <= stopped < drain + 8, stopped


def test_authorize_over_https(server: Server) -> None:
    def status_of(review: dict[str, object]) -> dict[str, object]:
        status, body = server.request("POST", "/authorize", json.dumps(review).encode())
        assert status == 200, body
        assert (body["apiVersion"], body["kind"]) == (review["apiVersion"], "SubjectAccessReview")
        return dict(body["status"])

    listing = make_access_review("alice", "list", "configmaps", namespace="t1")
    assert status_of(listing) == {
        "allowed": False,
        "denied": True,
        "reason": 'user "alice" may list configmaps in namespace "t1" only with a label '
        "selector within team in [a] (add -l team=a)",
    }
    own = make_access_review(
        "alice", "list", "configmaps", namespace="t1", selector=[("team", "In", ["a"])]
    )
    assert status_of(own) == {"allowed": False}  # no opinion: RBAC decides
    # Without cluster access a get by name cannot be judged: refused, saying why.
    get = make_access_review("alice", "get", "configmaps", namespace="t1", name="c1")
    assert "without cluster access" in str(status_of(get)["reason"])
    assert server.request("POST", "/authorize", b"[]")[0] == 400


# --- metrics of the real server -----------------------------------------------------------------


def test_metrics_follow_the_conventions_and_say_what_runs(server: Server) -> None:
    server.review(make_review("bob", "CREATE", "configmaps", namespace="t1", labels={"team": "a"}))
    server.review(make_review("alice", "UPDATE", "deployments.apps", namespace="t1",
                              labels={"team": "a"}, old_labels={"team": "a"}))  # fmt: skip

    def scrape() -> dict[str, Any]:
        text = (
            urllib.request.urlopen(
                server.base_url + "/metrics", context=server.context(), timeout=10
            )
            .read()
            .decode()
        )
        return {f.name: f for f in text_string_to_metric_families(text)}

    # Synced is the lowest over the workers: 0 while one is still loading its files.
    deadline = time.monotonic() + 20
    while (families := scrape())["label_rbac_cache_synced"].samples[0].value != 1:
        assert time.monotonic() < deadline, "label_rbac_cache_synced stays 0"
        time.sleep(0.1)
    assert [p for f in families.values() for p in lint_metric_family(f)] == []

    def value(name: str, **labels: str) -> float:
        family = families[name]
        return sum(
            s.value
            for s in family.samples
            if s.name in (name, f"{name}_total") and labels.items() <= s.labels.items()
        )

    assert value("label_rbac_decisions", operation="CREATE", resource="configmaps",
                 mode="enforce", allowed="false", reason="LabelNotPermitted") >= 1  # fmt: skip
    assert value("label_rbac_decisions", operation="UPDATE", resource="deployments.apps") >= 1
    (build,) = families["label_rbac_build_info"].samples
    assert build.value == 1 and build.labels["version"] == __version__
    # process_* cover the arbiter and both workers: more than any one process.
    own = ProcessCollector(pid=lambda: server.process.pid, registry=None)
    arbiter_rss = {f.name: f for f in own.collect()}["process_resident_memory_bytes"]
    assert value("process_resident_memory_bytes") > 2 * arbiter_rss.samples[0].value
    assert value("process_cpu_seconds") > 0 and value("process_open_fds") > 0
