"""The compiler's probes and metrics: `/healthz`, `/readyz`, `/metrics` on `--probe-bind`.

What they mean, for a process that serves no requests but must keep writing:

- ``/healthz`` (liveness): the compile loop went round recently. A loop steps at least every
  sixth of the lease, so one silent for ``STALL_LEASES`` leases is stuck (a hung request, a
  deadlock), and a restart is what helps.
- ``/readyz`` (readiness): the RBAC watches are synced and connected, so the replica is either
  leading with a current view or standing by ready to take over with one. A replica whose watch
  is lost is not ready: a rollout or a node drain waits for one that is.
- ``/metrics``: ``label_rbac_compiler_leader`` (1 on the replica writing), the lag from an RBAC
  change to its parameters being written (``label_rbac_compiler_lag_seconds``, a histogram, and
  ``label_rbac_compiler_pending_seconds``, the age of the oldest change not written yet, or
  of a takeover's check of every namespace),
  ``label_rbac_compiler_params_written_total``, ``label_rbac_compiler_delegated_namespaces``
  (left to the webhook, too large to compile), ``label_rbac_compiler_errors_total`` and
  ``label_rbac_compiler_last_round_timestamp_seconds``.

The server is the standard library's, one thread per connection, GET only, fixed small bodies:
nothing a client sends is parsed beyond the path.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from app.source.base import SourceStatus

log = logging.getLogger("label_rbac.compile")

# Leases of silence after which the loop counts as stuck (it steps every sixth of a lease).
STALL_LEASES = 4
# Lag buckets: most changes are written in well under a second; the alert fires above a few.
LAG_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300)


class CompilerHealth:
    """The loop's and the watches' state, as the probes and the metrics report it."""

    def __init__(
        self,
        lease_seconds: float,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        # The cluster source's status, once the compile loop has one (``watching``).
        self._source_status: Callable[[], SourceStatus] | None = None
        self._stall = STALL_LEASES * lease_seconds
        self._clock, self._wall = clock, wall
        self._lock = threading.Lock()
        self._beat: float | None = None
        self._oldest: float | None = None  # when the oldest change not written yet arrived
        self._leading = False
        self.registry = CollectorRegistry(auto_describe=True)
        self.leader = Gauge(
            "label_rbac_compiler_leader",
            "1 on the replica holding the lease and writing, 0 on the others",
            registry=self.registry,
        )
        self.lag = Histogram(
            "label_rbac_compiler_lag_seconds",
            "From an RBAC change to the leader having written the parameters it touches",
            buckets=LAG_BUCKETS,
            registry=self.registry,
        )
        self.pending = Gauge(
            "label_rbac_compiler_pending_seconds",
            "Age of the oldest RBAC change the leader has not written yet (0: caught up)",
            registry=self.registry,
        )
        self.pending.set_function(self.pending_seconds)
        self.written = Counter(
            "label_rbac_compiler_params_written",
            "Namespaces whose parameters were written",
            registry=self.registry,
        )
        self.delegated = Gauge(
            "label_rbac_compiler_delegated_namespaces",
            "Namespaces left to the webhook (too large to compile), as last written",
            registry=self.registry,
        )
        self.errors = Counter(
            "label_rbac_compiler_errors",
            "Compile rounds that failed (the API server refused or was unreachable)",
            registry=self.registry,
        )
        self.last_round = Gauge(
            "label_rbac_compiler_last_round_timestamp_seconds",
            "When the compile loop last went round (Unix time)",
            registry=self.registry,
        )

    # -- what the loop reports -------------------------------------------------------------

    def watching(self, source_status: Callable[[], SourceStatus]) -> None:
        """The RBAC watches readiness is judged by (the compile loop's cluster source)."""
        self._source_status = source_status

    def changed(self) -> None:
        """A batch of RBAC changes was applied to the snapshot (the builder's thread)."""
        with self._lock:
            if self._oldest is None:
                self._oldest = self._clock()

    def round(self, leading: bool, written: int, caught_up: bool, delegated: int) -> None:
        """One turn of the loop: whether this replica leads, what it wrote, whether nothing is
        pending or in flight any more, how many namespaces are delegated."""
        now = self._clock()
        with self._lock:
            self._beat, self._leading = now, leading
            if not leading:
                self._oldest = None  # a standby writes nothing: no lag of its own
            elif caught_up and self._oldest is not None:
                self.lag.observe(now - self._oldest)
                self._oldest = None
            elif not caught_up and self._oldest is None:
                # Work no change of ours started: a takeover checking every namespace (what the
                # previous leader left may be stale), a retried write. Pending from now on, so
                # that a stall there shows too.
                self._oldest = now
        self.leader.set(1 if leading else 0)
        self.written.inc(written)
        if leading:
            self.delegated.set(delegated)
        self.last_round.set(self._wall())

    def failed(self) -> None:
        self.errors.inc()

    # -- what the probes say ---------------------------------------------------------------

    def pending_seconds(self) -> float:
        with self._lock:
            oldest = self._oldest
        return 0.0 if oldest is None else max(0.0, self._clock() - oldest)

    def live(self) -> tuple[bool, str]:
        with self._lock:
            beat = self._beat
        if beat is None:
            return True, "starting"
        silent = self._clock() - beat
        if silent > self._stall:
            return False, f"the compile loop has not gone round for {silent:.0f}s"
        return True, "the compile loop is running"

    def ready(self) -> tuple[bool, str]:
        live, detail = self.live()
        if not live:
            return False, detail
        if self._source_status is None:
            return False, "starting"
        status = self._source_status()
        if not status.ready or status.stale_seconds is not None:
            return False, status.detail
        with self._lock:
            role = "leading" if self._leading else "standing by"
        return True, f"{role}; {status.detail}"

    def metrics(self) -> bytes:
        return generate_latest(self.registry)


def _handler(health: CompilerHealth) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/metrics":
                self._send(200, health.metrics(), CONTENT_TYPE_LATEST)
                return
            checks = {"/healthz": health.live, "/readyz": health.ready}
            check = checks.get(self.path)
            if check is None:
                self._send(404, b'{"error": "not found"}\n', "application/json")
                return
            ok, detail = check()
            body = json.dumps({"ready" if self.path == "/readyz" else "live": ok,
                               "detail": detail}).encode() + b"\n"  # fmt: skip
            self._send(200 if ok else 503, body, "application/json")

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # probes every few seconds: not worth a log line each

    return Handler


class ProbeServer:
    """``/healthz``, ``/readyz`` and ``/metrics`` over plain HTTP on ``host:port``, in threads."""

    def __init__(self, health: CompilerHealth, host: str, port: int) -> None:
        self._server = ThreadingHTTPServer((host, port), _handler(health))
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="probes", daemon=True
        )

    def start(self) -> None:
        self._thread.start()
        log.info("probes and metrics on port %d", self.port)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
