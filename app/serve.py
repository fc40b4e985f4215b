"""``python -m app serve``: gunicorn with TLS, one RBAC source per worker, started after fork.

gunicorn calls ``load()`` inside each worker process (``preload_app`` stays off), so watch
threads and HTTP connections are created after the fork and never shared between processes.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from flask import Flask
from gunicorn.app.base import BaseApplication

from app.server import create_app
from app.settings import Settings
from app.source.base import RbacSource


def make_source(settings: Settings) -> RbacSource:
    """The RBAC source the settings ask for: static files, or the live cluster."""
    if settings.rbac_dir is not None:
        from app.source.static import StaticSource

        return StaticSource(settings.rbac_dir, settings.compiler)
    from app.source.cluster import ClusterSource

    return ClusterSource.from_settings(settings)


def configure_logging(level: str) -> None:
    """JSON decision lines on stdout; everything else through gunicorn's error log (stderr)."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s"))
    root = logging.getLogger("label_rbac")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False


def build_app(settings: Settings) -> Flask:
    """Create and start one worker's source and app (called in the worker, after fork)."""
    configure_logging(settings.log_level)
    source = make_source(settings)
    source.start()
    return create_app(settings, source)


class WebhookServer(BaseApplication):  # type: ignore[misc]
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
        }
        for key, value in options.items():
            if value is not None:
                self.cfg.set(key, value)

    def load(self) -> Flask:
        return build_app(self.settings)


def serve(settings: Settings) -> None:
    WebhookServer(settings).run()
