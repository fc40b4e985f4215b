"""``python -m app serve``: gunicorn with TLS, one RBAC source per worker, started after fork.

gunicorn calls ``load()`` inside each worker process (``preload_app`` stays off), so watch
threads and HTTP connections are created after the fork and never shared between processes.
Metrics are per worker and meet in PROMETHEUS_MULTIPROC_DIR (a temporary directory unless set).

Around gunicorn:

- **Configuration is checked before any worker is forked** (``check_settings``): a bad flag or
  an unusable certificate is one line on stderr, not one traceback per worker.
- **TLS**: each worker builds its SSLContext from the certificate and key files read as one
  pair (app.webhook.certs.ServingCertificate) and swaps it when the files change; gunicorn's own
  loading reads the two files separately for every connection, so a rotation between the two
  reads paired a new certificate with the old key.
- **Open files**: the soft limit is raised to the hard one, and the per-worker connection caps
  lowered (saying so) where they would not fit in it (``fit_file_limit``).
- **Shutdown**: on SIGTERM the arbiter sets a flag shared with the workers (an anonymous shared
  memory page made before the fork). ``/readyz`` answers 503 and every response closes its
  connection, while new connections are still accepted for ``--drain-seconds`` (endpoint
  removal takes a while to reach every API server). Then gunicorn's graceful stop: listeners
  close, requests in flight and already accepted finish within GRACEFUL_TIMEOUT. The workers
  wait for that stop even when the SIGTERM reaches them too (a process group signalled, as
  systemd does by default): one the arbiter did not send while stopping is looked at again
  after ``TERM_SETTLE``, and ignored if the arbiter is draining by then.
"""

from __future__ import annotations

import dataclasses
import json
import mmap
import os
import resource
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gunicorn.app.base import BaseApplication
from gunicorn.arbiter import Arbiter

from app import deepjson, logs
from app.settings import Settings
from app.source.base import RbacSource
from app.webhook import connections
from app.webhook.certs import CertificateError, ServingCertificate, load_pair
from app.webhook.server import create_app

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

    from app.source.cluster import SourceObserver

# After the drain, how long requests in flight may take. The API server gives up on a webhook
# call after its timeoutSeconds (5 in manifests/deploy, 30 at most).
GRACEFUL_TIMEOUT = 10

DRAINING_BODY = json.dumps(
    {"ready": False, "detail": "shutting down: draining connections"}
).encode()


class ConfigError(Exception):
    """A setting ``serve`` cannot run with; the message is one line for the operator."""


def make_source(settings: Settings, observer: SourceObserver | None = None) -> RbacSource:
    """The RBAC source the settings ask for: static files, or the live cluster."""
    if settings.rbac_dir is not None:
        from app.source.static import StaticSource

        return StaticSource(
            settings.rbac_dir, settings.compiler, node_graph=settings.node_authorizer
        )
    from app.source.cluster import ClusterSource

    return ClusterSource.from_settings(settings, observer)


# --- configuration, checked in the arbiter ---------------------------------------------------


def _check_numbers(settings: Settings) -> None:
    for flag, value, low in (
        ("--workers", settings.workers, 1),
        ("--threads", settings.threads, 1),
        ("--max-body-bytes", settings.max_body_bytes, 1),
        ("--max-connections", settings.max_connections, 1),
        ("--max-connections-per-peer", settings.max_connections_per_peer, 1),
    ):
        if value < low:
            raise ConfigError(f"{flag} must be at least {low}, not {value}")
    if settings.drain_seconds < 0:
        raise ConfigError(f"--drain-seconds must not be negative, not {settings.drain_seconds:g}")
    if settings.request_deadline <= 0:
        raise ConfigError(f"--request-deadline must be positive, not {settings.request_deadline:g}")
    if settings.max_staleness is not None and settings.max_staleness <= 0:
        raise ConfigError(f"--max-staleness must be positive, not {settings.max_staleness:g}")


def _check_bind(bind: str) -> None:
    host, sep, port = bind.rpartition(":")
    if (
        not sep
        or not host
        or not (port.isascii() and port.isdigit())
        or not 0 <= int(port) <= 65535
    ):
        raise ConfigError(f"--bind {bind!r}: expected HOST:PORT, e.g. 0.0.0.0:8443")


def _check_source(settings: Settings) -> None:
    if settings.rbac_dir is not None:
        from app.source.static import ManifestError, StaticSource

        if not settings.rbac_dir.is_dir():
            raise ConfigError(f"--rbac-dir {settings.rbac_dir}: not a directory")
        try:
            StaticSource(settings.rbac_dir, settings.compiler).start()
        except (OSError, ManifestError) as exc:
            raise ConfigError(f"--rbac-dir {settings.rbac_dir}: {exc}") from None
    elif settings.kubeconfig is not None:
        from app.source.api import ConfigError as KubeConfigError
        from app.source.api import check_kubeconfig

        try:
            check_kubeconfig(settings.kubeconfig)
        except KubeConfigError as exc:
            raise ConfigError(f"kubeconfig {settings.kubeconfig}: {exc}") from None


def check_settings(settings: Settings) -> None:
    """Everything ``serve`` can check without serving; raises ConfigError."""
    _check_numbers(settings)
    _check_bind(settings.bind)
    if settings.tls_cert is None or settings.tls_key is None:
        raise ConfigError("TLS is required: pass --tls-cert and --tls-key, or --dev-tls")
    try:
        load_pair(settings.tls_cert, settings.tls_key)
    except CertificateError as exc:
        raise ConfigError(str(exc)) from None
    _check_source(settings)


# --- in the workers ----------------------------------------------------------------------------


def build_app(settings: Settings) -> Any:
    """Create and start one worker's source and app (called in the worker, after fork)."""
    logs.configure(settings.log_level)
    deepjson.prepare()  # before the source starts its threads: they parse API-server JSON
    # here, after fork and PROMETHEUS_MULTIPROC_DIR: see there
    from app.webhook.metrics import Metrics

    metrics = Metrics()
    logs.set_drop_observer(metrics.log_line_dropped)
    connections.set_close_observer(metrics.connection_closed)
    source = make_source(settings, metrics)
    source.start()
    if settings.rbac_dir is not None:
        # Files are loaded once, in start(): synced from here on (a cluster source reports
        # this itself as its watches list).
        metrics.synced(source.snapshot() is not None)
    return create_app(
        settings,
        source,
        (metrics.observe_decision,),
        metrics.render,
        access_observers=(metrics.observe_access,),
    )


class DrainFlag:
    """One byte of shared memory, written by the arbiter, read by every worker: serving (false),
    draining (true) after SIGTERM, then stopping (true, and ``stopping``) once the drain is over."""

    _DRAINING, _STOPPING = 1, 2

    def __init__(self) -> None:
        # Anonymous and MAP_SHARED: the workers forked later see the arbiter's writes.
        self._page = mmap.mmap(-1, 1)

    def set(self) -> None:
        self._page[0] = max(self._page[0], self._DRAINING)

    def stop(self) -> None:
        self._page[0] = self._STOPPING

    @property
    def stopping(self) -> bool:
        return self._page[0] == self._STOPPING

    def __bool__(self) -> bool:
        return self._page[0] != 0


# How long a worker given SIGTERM outside a stop waits for the arbiter to start draining: it
# handles its own SIGTERM at once, so longer than a turn of its loop takes.
TERM_SETTLE = 0.5


def drain_aware_term(worker: Any, draining: DrainFlag) -> None:
    """Make the worker's SIGTERM wait for the arbiter's word (gunicorn's post_worker_init).

    The arbiter alone decides when the drain ends; a SIGTERM it sends to stop (or for a reload)
    is handled as gunicorn does, one that only came with a signal to the whole group is not.
    """
    graceful = signal.getsignal(signal.SIGTERM)
    if not callable(graceful):
        return

    def settle(signum: int, frame: Any) -> None:
        time.sleep(TERM_SETTLE)
        if not draining or draining.stopping:
            graceful(signum, frame)

    def on_term(signum: int, frame: Any) -> None:
        if draining.stopping:
            graceful(signum, frame)
        else:
            threading.Thread(target=settle, args=(signum, None), daemon=True).start()

    signal.signal(signal.SIGTERM, on_term)


def draining_readiness(app: WSGIApplication, draining: DrainFlag) -> WSGIApplication:
    """``/readyz`` answers 503 while draining; every other request is served as usual."""

    def wrapped(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        if draining and environ.get("PATH_INFO") == "/readyz":
            start_response(
                "503 Service Unavailable",
                [("Content-Type", "application/json"), ("Content-Length", str(len(DRAINING_BODY)))],
            )
            return [DRAINING_BODY]
        return app(environ, start_response)

    return wrapped


def child_exit(server: Any, worker: Any) -> None:
    """gunicorn hook (in the arbiter): a dead worker's live gauges leave the aggregate."""
    from app.webhook.metrics import mark_worker_dead

    mark_worker_dead(worker.pid)


def worker_exit(server: Any, worker: Any) -> None:
    """gunicorn hook (in the worker, on its way out): write out queued log lines."""
    logs.stop()


# --- the arbiter -----------------------------------------------------------------------------


class DrainingArbiter(Arbiter):
    """gunicorn's arbiter, with SIGTERM turned into drain, then graceful stop.

    A second SIGTERM, SIGINT or SIGQUIT stops at once, as in plain gunicorn.
    """

    def __init__(self, app: WebhookServer) -> None:
        self._drain_seconds = app.settings.drain_seconds
        self._draining = app.draining
        self._drain_until: float | None = None
        super().__init__(app)

    def handle_term(self) -> None:
        if self._drain_until is not None or self._drain_seconds <= 0:
            raise StopIteration
        self._draining.set()
        self._drain_until = time.monotonic() + self._drain_seconds
        self.log.info("SIGTERM: not ready, serving for %gs more", self._drain_seconds)
        timer = threading.Timer(self._drain_seconds, self.wakeup)
        timer.daemon = True
        timer.start()

    def stop(self, graceful: bool = True) -> None:
        self._draining.stop()  # the workers' SIGTERM now means stop
        super().stop(graceful)

    def maybe_promote_master(self) -> None:
        # Runs at the top of every turn of the main loop: the place to end the drain.
        super().maybe_promote_master()
        if self._drain_until is not None and time.monotonic() >= self._drain_until:
            self.log.info("drain over: stopping")
            raise StopIteration


@contextmanager
def multiprocess_dir() -> Iterator[Path]:
    """PROMETHEUS_MULTIPROC_DIR for the workers: the given one, emptied, or a temporary one."""
    given = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if given:
        # prometheus_client requires the directory to be wiped between runs.
        path = Path(given)
        path.mkdir(parents=True, exist_ok=True)
        for stale in path.glob("*.db"):
            stale.unlink()
        yield path
        return
    path = Path(tempfile.mkdtemp(prefix="label-rbac-metrics-"))
    owner = os.getpid()
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(path)
    try:
        yield path
    finally:
        # Workers are forked inside this block and leave it by SystemExit too: only the
        # arbiter that made the directory removes it.
        if os.getpid() == owner:
            os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
            shutil.rmtree(path, ignore_errors=True)


class WebhookServer(BaseApplication):
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.draining = DrainFlag()
        super().__init__()

    def load_config(self) -> None:
        s = self.settings
        draining = self.draining
        options: dict[str, Any] = {
            "bind": [s.bind],
            "workers": s.workers,
            "threads": s.threads,
            # One event loop per worker frames requests with h11; threads get whole requests
            # (and, while draining, every answer closes its connection).
            "worker_class": "app.webhook.connections.StagedWorker",
            # Both set, so gunicorn wraps sockets in TLS; the context comes from ssl_context.
            "certfile": str(s.tls_cert) if s.tls_cert else None,
            "keyfile": str(s.tls_key) if s.tls_key else None,
            "ssl_context": self._ssl_context(),
            "loglevel": s.log_level,
            "logger_class": logs.JsonGunicornLogger,
            "preload_app": False,
            # The API server's webhook timeout is at most 30s; keep-alive saves TLS handshakes.
            "timeout": 30,
            "keepalive": 75,
            "graceful_timeout": GRACEFUL_TIMEOUT,
            "proc_name": "label-rbac",
            # No runtime control over a socket: nothing in a pod should reconfigure it.
            "control_socket_disable": True,
            "child_exit": child_exit,
            "worker_exit": worker_exit,
            "post_worker_init": (
                (lambda worker: drain_aware_term(worker, draining)) if s.drain_seconds > 0 else None
            ),
        }
        for key, value in options.items():
            if value is not None:
                self.cfg.set(key, value)

    def _ssl_context(self) -> Callable[[Any, Any], Any] | None:
        """gunicorn's per-connection hook, answered from the pair loaded as one.

        Loaded here, in the arbiter, so that every worker starts with the last good pair, also
        one forked while the files on disk are broken; each worker then follows the files.
        """
        if self.settings.tls_cert is None or self.settings.tls_key is None:
            return None
        serving = ServingCertificate(self.settings.tls_cert, self.settings.tls_key)
        return lambda config, default_factory: serving.context()

    def load(self) -> WSGIApplication:
        return draining_readiness(build_app(self.settings), self.draining)

    def run(self) -> None:
        try:
            DrainingArbiter(self).run()
        except RuntimeError as exc:
            print(f"serve: {exc}", file=sys.stderr)
            sys.exit(1)


# Descriptors a worker holds besides its clients' connections: standard streams, listener,
# selector, wake-up pipes, heartbeat file, metric files, the API-server connections of its watches
# and lookups (tests/webhook/test_framing.py checks a worker holds fewer than 64 otherwise).
RESERVED_DESCRIPTORS = 128


def fit_file_limit(settings: Settings) -> tuple[Settings, str | None]:
    """Raise the open-file soft limit to the hard one (inherited by the workers), and fit the
    per-worker connection caps in it: lowered, with a line saying so, when they do not fit;
    ConfigError when not even a few connections would."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (OSError, ValueError):
            pass  # (an unlimited hard limit the kernel refuses): the caps are fitted to soft
    if soft == resource.RLIM_INFINITY or settings.max_connections + RESERVED_DESCRIPTORS <= soft:
        return settings, None
    room = soft - RESERVED_DESCRIPTORS
    if room < 2 * settings.threads:
        raise ConfigError(
            f"the open-file limit ({soft}) leaves room for {max(room, 0)} connections per worker "
            f"beside the {RESERVED_DESCRIPTORS} a worker needs otherwise: raise it (ulimit -n)"
        )
    per_peer = min(settings.max_connections_per_peer, room)
    lowered = f"--max-connections lowered from {settings.max_connections} to {room}"
    if per_peer != settings.max_connections_per_peer:
        lowered += (
            f", --max-connections-per-peer from {settings.max_connections_per_peer} to {per_peer}"
        )
    note = (
        f"serve: {lowered}: the open-file limit is {soft} (its hard limit) and a worker needs "
        f"{RESERVED_DESCRIPTORS} descriptors besides its connections"
    )
    fitted = dataclasses.replace(settings, max_connections=room, max_connections_per_peer=per_peer)
    return fitted, note


def serve(settings: Settings) -> None:
    """Check the settings, then run gunicorn until it stops (ConfigError: nothing started)."""
    check_settings(settings)
    settings, note = fit_file_limit(settings)
    if note is not None:
        print(note, file=sys.stderr, flush=True)
    # Logging is configured in each worker (build_app): no listener thread runs in the arbiter
    # when it forks.
    with multiprocess_dir():
        WebhookServer(settings).run()
