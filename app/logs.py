"""Log output: one JSON object per line, for decisions and everything else (gunicorn's too).

Every line carries ``time`` (UTC, RFC 3339 with milliseconds), ``level``, ``logger`` and
``message``; a decision line adds its fields (``log_decision`` passes them as
``extra={"fields": {...}}``, because keys such as ``name`` and ``message`` are taken in a
LogRecord).

Decisions are logged by every request thread, so a log line must cost the request path as
little as possible. A plain StreamHandler would make the threads take turns on its lock for the
formatting and the write; ``QueueHandler`` here only puts the record on a queue (no lock:
``SimpleQueue`` is thread-safe) and one writer thread per process, woken by the first line of a
quiet moment, lets ``LINGER_SECONDS`` of lines gather, then formats them and writes them with one
``write``: a system call per batch, not per line (nor a wake-up per line). Records skip what
the JSON line never shows (the caller's file and line, thread and process names: the logging
HOWTO's "Optimization" switches). ``stop()`` drains the queue before the process exits.

The queue is bounded, because requests fill it and a stalled stdout (a blocked pipe, a slow log
collector) stops the writer: past ``MAX_QUEUED_LINES`` a line is dropped and counted (``dropped``,
and the metric ``set_drop_observer`` hooks in), never waited for, so logging never blocks a
request. What a request writes into a line is bounded too (``LINE_CHARS``): names, user names
and messages come from the request, and a line must not keep a huge one alive in the queue.
"""

from __future__ import annotations

import atexit
import functools
import json
import logging
import logging.handlers
import queue
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, TextIO

from gunicorn.glogging import Logger as GunicornLogger

# Lines one pipeline holds before it drops new ones: far above what a worker's threads log while
# the writer lingers (a few thousand lines a second), so only a stalled stream ever meets it.
MAX_QUEUED_LINES = 4096
# The characters of a queued line's strings together (its fields, or a record's message and its
# traceback each); past it the long ones share what the short ones leave, cut and marked. With
# the line count this bounds what waits to be written (the queue, and the batch the writer took
# from it: twice the count) at some 25 MB (75 MB if every character is beyond Latin-1), however
# hostile the requests and however stuck the stream.
LINE_CHARS = 2048
CUT = "…"

_dropped = 0
_drop_lock = threading.Lock()  # only drops take it
_on_drop: Callable[[], None] | None = None


def dropped() -> int:
    """Lines this process dropped because its queue was full."""
    return _dropped


def set_drop_observer(observer: Callable[[], None] | None) -> None:
    """Called once per dropped line (the metrics count them)."""
    global _on_drop
    _on_drop = observer


def _drop() -> None:
    global _dropped
    with _drop_lock:
        _dropped += 1
    observer = _on_drop
    if observer is not None:
        observer()


def _head(text: str, chars: int) -> str:
    return text if len(text) <= chars else f"{text[:chars]}{CUT}[{len(text) - chars} more]"


def _tail(text: str, chars: int) -> str:
    """The end of a traceback is where the error is: keep it."""
    return text if len(text) <= chars else f"[{len(text) - chars} more]{CUT}{text[-chars:]}"


def clip_fields(fields: Mapping[str, Any]) -> Mapping[str, Any]:
    """``fields`` with its strings within ``LINE_CHARS`` together: as is when they fit (the
    usual case, no copy), else the long ones cut to what the short ones leave, shared."""
    total = 0
    for value in fields.values():
        if isinstance(value, str):
            total += len(value)
    if total <= LINE_CHARS:
        return fields
    share = LINE_CHARS // len(fields)
    strings = [v for v in fields.values() if isinstance(v, str)]
    long = sum(1 for v in strings if len(v) > share)
    each = (LINE_CHARS - sum(len(v) for v in strings if len(v) <= share)) // long
    return {
        k: _head(v, each) if isinstance(v, str) and len(v) > share else v for k, v in fields.items()
    }


# Fields of a LogRecord that are not user ``extra``.
_RECORD_FIELDS = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


@functools.lru_cache(maxsize=4)
def _second(seconds: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))


def _timestamp(created: float) -> str:
    seconds = int(created)
    millis = int((created - seconds) * 1000)
    return f"{_second(seconds)}.{millis:03d}Z"


class JsonFormatter(logging.Formatter):
    """``{"time", "level", "logger", "message", **extra}``; tracebacks as ``exception``."""

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "time": _timestamp(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        attributes = vars(record)
        for key in attributes.keys() - _RECORD_FIELDS:
            value = attributes[key]
            if key == "fields" and isinstance(value, dict):
                payload.update(value)
            elif not key.startswith("_"):
                payload[key] = value
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            payload["exception"] = record.exc_text
        return json.dumps(payload, separators=(",", ":"), default=str)


class QueueHandler(logging.handlers.QueueHandler):
    """Hands records to the listener thread without taking a lock or formatting them; drops
    (and counts) them while the queue is full."""

    queue: queue.SimpleQueue[Queued]

    def handle(self, record: logging.LogRecord) -> bool:
        # Handler.handle would hold self.lock around emit; the queue needs no lock.
        if not self.filter(record):
            return False
        self.emit(record)
        return True

    def enqueue(self, record: logging.LogRecord) -> None:
        put(self.queue, record)

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        # Freeze what may change later (arguments, the exception); format in the listener.
        record.msg = _head(record.getMessage(), LINE_CHARS)
        record.args = None
        if record.exc_info:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
            record.exc_info = None
        if record.exc_text:
            record.exc_text = _tail(record.exc_text, LINE_CHARS)
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            record.fields = clip_fields(fields)
        return record


# An info line queued without a LogRecord (``info_fields``): created, logger, message, fields.
Line = tuple[float, str, str, Mapping[str, Any]]
# What a pipeline's queue carries; None asks the writer to finish.
Queued = logging.LogRecord | Line | None


def put(lines: queue.SimpleQueue[Queued], item: logging.LogRecord | Line) -> None:
    """Queue a line unless the queue is full (then drop it). Without a lock, threads that check
    at once may pass the bound together: by at most one line each."""
    if lines.qsize() >= MAX_QUEUED_LINES:
        _drop()
        return
    lines.put_nowait(item)


# Written at most this many lines at a time, so one burst does not hold a huge string.
_BATCH = 512
# After the first line of a quiet moment, the writer waits this long for more to join it. Each
# wake-up of the writer and each write is a system call, which at a few hundred requests per
# second cost more than the formatting; lines reach the stream at most this much later.
LINGER_SECONDS = 0.05


class _Pipeline:
    """One stream's queue and the thread writing it: formats what has queued up, one write."""

    def __init__(self, stream: TextIO, linger: float = LINGER_SECONDS) -> None:
        self.queue: queue.SimpleQueue[Queued] = queue.SimpleQueue()
        self._stream = stream
        self._linger = linger
        self._format = JsonFormatter().format
        self._thread = threading.Thread(target=self._run, name="log-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        get, get_nowait = self.queue.get, self.queue.get_nowait
        while True:
            batch = [get()]  # sleeps until there is a line to write
            if batch[-1] is not None:
                time.sleep(self._linger)  # puts meanwhile wake nobody: no waiter
            try:
                while batch[-1] is not None:
                    batch.append(get_nowait())
            except queue.Empty:
                pass
            lines = [self._line(record) for record in batch if record is not None]
            for start in range(0, len(lines), _BATCH):
                self._write("".join(lines[start : start + _BATCH]))
            if batch[-1] is None:
                return

    def _line(self, item: logging.LogRecord | Line) -> str:
        try:
            if isinstance(item, tuple):
                created, name, message, fields = item
                payload = {"time": _timestamp(created), "level": "info", "logger": name,
                           "message": message, **fields}  # fmt: skip
                return json.dumps(payload, separators=(",", ":"), default=str) + "\n"
            return self._format(item) + "\n"
        except Exception:  # a record that cannot be formatted must not stop the others
            return json.dumps({"level": "error", "message": "unformattable log record"}) + "\n"

    def _write(self, text: str) -> None:
        try:
            self._stream.write(text)
            self._stream.flush()
        except (OSError, ValueError):  # stdout gone (a closed pipe): nowhere left to report
            pass

    def stop(self) -> None:
        """Write out everything queued so far, then end the thread."""
        self.queue.put(None)
        self._thread.join()


_pipelines: dict[int, _Pipeline] = {}


def queued_handler(stream: TextIO) -> logging.Handler:
    """A handler writing JSON lines to ``stream`` through this process's listener thread."""
    pipeline = _pipelines.get(id(stream))
    if pipeline is None:
        pipeline = _pipelines[id(stream)] = _Pipeline(stream)
    return QueueHandler(pipeline.queue)


def info_fields(logger: logging.Logger, message: str, fields: Mapping[str, Any]) -> None:
    """``logger.info(message, extra={"fields": fields})``, the same line, but when the logger
    writes straight into a pipeline (the decision log, once per request) without building a
    LogRecord, which costs more than the rest of the line."""
    if not logger.isEnabledFor(logging.INFO):
        return
    handlers = logger.handlers
    if (
        len(handlers) == 1
        and isinstance(handlers[0], QueueHandler)
        and not handlers[0].filters
        and not logger.filters
        and handlers[0].level <= logging.INFO
    ):
        # The fields are the caller's and not changed afterwards: no copy unless cut.
        put(handlers[0].queue, (time.time(), logger.name, message, clip_fields(fields)))
        return
    logger.info(message, extra={"fields": fields})


def stop() -> None:
    """Write out what is queued and stop the listener threads (idempotent)."""
    while _pipelines:
        _, pipeline = _pipelines.popitem()
        pipeline.stop()


atexit.register(stop)


def configure(level: str) -> None:
    """label_rbac loggers: decisions to stdout, everything else to stderr, JSON, queued."""
    stop()  # a forked worker inherits the parent's pipelines without their threads
    # The JSON line shows none of these; gathering them costs every record a stack walk and
    # a few lookups (the logging HOWTO's "Optimization").
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
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
