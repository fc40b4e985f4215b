"""Log output: one JSON object per line, for decisions and everything else (gunicorn's too).

Every line carries ``time`` (UTC, RFC 3339 with milliseconds), ``level``, ``logger`` and
``message``; a decision line adds its fields (``log_decision`` passes them as
``extra={"fields": {...}}``, because keys such as ``name`` and ``message`` are taken in a
LogRecord).

Decisions are logged by every request thread. A plain StreamHandler would make them take turns
on its lock for the formatting and the write; ``QueueHandler`` here only puts the record on a
queue (no lock: ``SimpleQueue`` is thread-safe) and one listener thread per process formats and
writes. ``stop()`` drains the queue before the process exits.
"""

from __future__ import annotations

import atexit
import json
import logging
import logging.handlers
import queue
import sys
import time
from typing import Any, TextIO

from gunicorn.glogging import Logger as GunicornLogger

# Fields of a LogRecord that are not user ``extra``.
_RECORD_FIELDS = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


def _timestamp(created: float) -> str:
    seconds = int(created)
    millis = int((created - seconds) * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"


class JsonFormatter(logging.Formatter):
    """``{"time", "level", "logger", "message", **extra}``; tracebacks as ``exception``."""

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "time": _timestamp(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key == "fields" and isinstance(value, dict):
                payload.update(value)
            elif key not in _RECORD_FIELDS and not key.startswith("_"):
                payload[key] = value
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            payload["exception"] = record.exc_text
        return json.dumps(payload, separators=(",", ":"), default=str)


class QueueHandler(logging.handlers.QueueHandler):
    """Hands records to the listener thread without taking a lock or formatting them."""

    def handle(self, record: logging.LogRecord) -> bool:
        # Handler.handle would hold self.lock around emit; the queue needs no lock.
        if not self.filter(record):
            return False
        self.emit(record)
        return True

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        # Freeze what may change later (arguments, the exception); format in the listener.
        record.msg = record.getMessage()
        record.args = None
        if record.exc_info:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
            record.exc_info = None
        return record


class _Pipeline:
    """One process's queue and listener thread."""

    def __init__(self, stream: TextIO) -> None:
        self.queue: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
        target = logging.StreamHandler(stream)
        target.setFormatter(JsonFormatter())
        self.listener = logging.handlers.QueueListener(self.queue, target)
        self.listener.start()


_pipelines: dict[int, _Pipeline] = {}


def queued_handler(stream: TextIO) -> logging.Handler:
    """A handler writing JSON lines to ``stream`` through this process's listener thread."""
    pipeline = _pipelines.get(id(stream))
    if pipeline is None:
        pipeline = _pipelines[id(stream)] = _Pipeline(stream)
    return QueueHandler(pipeline.queue)


def stop() -> None:
    """Write out what is queued and stop the listener threads (idempotent)."""
    while _pipelines:
        _, pipeline = _pipelines.popitem()
        pipeline.listener.stop()


atexit.register(stop)


def configure(level: str) -> None:
    """label_rbac loggers: decisions to stdout, everything else to stderr, JSON, queued."""
    stop()  # a forked worker inherits the parent's pipelines without their threads
    decisions = logging.getLogger("label_rbac.decisions")
    decisions.handlers[:] = [queued_handler(sys.stdout)]
    decisions.propagate = False
    root = logging.getLogger("label_rbac")
    root.handlers[:] = [queued_handler(sys.stderr)]
    root.setLevel(level.upper())
    root.propagate = False


class JsonGunicornLogger(GunicornLogger):
    """gunicorn's error (and, if enabled, access) log in the same JSON format."""

    def _set_handler(self, log, output, fmt, stream=None) -> None:
        super()._set_handler(log, output, JsonFormatter(), stream)
