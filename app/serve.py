"""``python -m app serve``: gunicorn with TLS, one RBAC source per worker, started after fork.

gunicorn calls ``load()`` inside each worker process (``preload_app`` stays off), so watch
threads and HTTP connections are created after the fork and never shared between processes.
Metrics are per worker and meet in PROMETHEUS_MULTIPROC_DIR (a temporary directory unless set).
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flask import Flask
from gunicorn.app.base import BaseApplication

from app.server import create_app
from app.settings import Settings
from app.source.base import RbacSource

if TYPE_CHECKING:
    from app.source.cluster import SourceObserver


def make_source(settings: Settings, observer: SourceObserver | None = None) -> RbacSource:
    """The RBAC source the settings ask for: static files, or the live cluster."""
    if settings.rbac_dir is not None:
        from app.source.static import StaticSource

        return StaticSource(settings.rbac_dir, settings.compiler)
    from app.source.cluster import ClusterSource

    return ClusterSource.from_settings(settings, observer)


def configure_logging(level: str) -> None:
    """JSON decision lines on stdout; everything else on stderr, beside gunicorn's error log."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s"))
    decisions = logging.getLogger("label_rbac.decisions")
    decisions.handlers[:] = [handler]
    decisions.propagate = False
    other = logging.StreamHandler(sys.stderr)
    other.setFormatter(
        logging.Formatter(
            "[%(asctime)s] [%(process)d] [%(levelname)s] %(name)s: %(message)s",
            "%Y-%m-%d %H:%M:%S %z",
        )
    )
    root = logging.getLogger("label_rbac")
    root.handlers[:] = [other]
    root.setLevel(level.upper())
    root.propagate = False


def build_app(settings: Settings) -> Flask:
    """Create and start one worker's source and app (called in the worker, after fork)."""
    configure_logging(settings.log_level)
    from app.metrics import Metrics  # here, after fork and PROMETHEUS_MULTIPROC_DIR: see there

    metrics = Metrics()
    source = make_source(settings, metrics)
    source.start()
    return create_app(
        settings,
        source,
        (metrics.observe_decision,),
        metrics.render,
        access_observers=(metrics.observe_access,),
    )


def child_exit(server: Any, worker: Any) -> None:
    """gunicorn hook (in the arbiter): a dead worker's live gauges leave the aggregate."""
    from app.metrics import mark_worker_dead

    mark_worker_dead(worker.pid)


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
        super().__init__()

    def load_config(self) -> None:
        s = self.settings
        options: dict[str, Any] = {
            "bind": [s.bind],
            "workers": s.workers,
            "threads": s.threads,
            "worker_class": "gthread",
            "certfile": str(s.tls_cert) if s.tls_cert else None,
            "keyfile": str(s.tls_key) if s.tls_key else None,
            "loglevel": s.log_level,
            "preload_app": False,
            # The API server's webhook timeout is at most 30s; keep-alive saves TLS handshakes.
            "timeout": 30,
            "keepalive": 75,
            "proc_name": "label-rbac",
            "child_exit": child_exit,
        }
        for key, value in options.items():
            if value is not None:
                self.cfg.set(key, value)

    def load(self) -> Flask:
        return build_app(self.settings)


def serve(settings: Settings) -> None:
    with multiprocess_dir():
        WebhookServer(settings).run()
