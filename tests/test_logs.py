"""The queued JSON log pipeline: every record written once, in order, batched, never stuck."""

from __future__ import annotations

import gc
import io
import json
import logging
import threading
import time
import tracemalloc

import pytest

from app import logs


class CountingStream(io.StringIO):
    """A stream that counts writes (system calls, for a real stdout) and can be slow."""

    def __init__(self, delay: float = 0.0) -> None:
        super().__init__()
        self.writes = 0
        self.delay = delay

    def write(self, text: str) -> int:
        self.writes += 1
        time.sleep(self.delay)
        return super().write(text)


def logger_to(stream: io.StringIO, name: str) -> logging.Logger:
    log = logging.getLogger(f"label_rbac.test.{name}")
    log.handlers[:] = [logs.queued_handler(stream)]
    log.propagate = False
    log.setLevel(logging.INFO)
    return log


@pytest.fixture(autouse=True)
def stopped_pipelines() -> object:
    yield
    logs.stop()


def lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_records_from_many_threads_are_all_written_once_in_each_threads_order() -> None:
    stream = CountingStream()
    log = logger_to(stream, "threads")

    def emit(thread: int) -> None:
        for i in range(500):
            log.info("decision", extra={"fields": {"thread": thread, "i": i}})

    threads = [threading.Thread(target=emit, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    logs.stop()  # writes out everything queued
    written = lines(stream)
    assert len(written) == 8 * 500
    for t in range(8):
        assert [r["i"] for r in written if r["thread"] == t] == list(range(500))
    assert all(r["message"] == "decision" and r["level"] == "info" for r in written)


def test_lines_that_queue_up_behind_a_slow_write_go_out_in_one_write() -> None:
    stream = CountingStream(delay=0.05)
    log = logger_to(stream, "slow")
    for i in range(2000):
        log.info("decision", extra={"fields": {"i": i}})
    logs.stop()
    assert [r["i"] for r in lines(stream)] == list(range(2000))
    # One write per batch of up to 512 lines, not one per line.
    assert stream.writes <= 2000 // 512 + 3


def test_a_record_that_cannot_be_formatted_does_not_stop_the_others() -> None:
    stream = CountingStream()
    log = logger_to(stream, "bad")
    log.info("before")
    log.info("bad", extra={"fields": {("not", "a", "string"): 1}})  # JSON keys must be strings
    log.info("after")
    logs.stop()
    assert [r["message"] for r in lines(stream)] == [
        "before", "unformattable log record", "after"
    ]  # fmt: skip


def test_a_closed_stream_loses_the_lines_but_not_the_process() -> None:
    stream = CountingStream()
    log = logger_to(stream, "closed")
    stream.close()
    log.info("nowhere to go")
    logs.stop()  # returns: the writer swallowed the error and ended when asked


def test_timestamps_are_utc_with_milliseconds() -> None:
    record = logging.makeLogRecord({"msg": "x", "levelname": "INFO", "name": "t"})
    record.created = 1_700_000_000.5
    assert json.loads(logs.JsonFormatter().format(record))["time"] == "2023-11-14T22:13:20.500Z"
    record.created = 1_700_000_001.25  # the next second: not the cached one
    assert json.loads(logs.JsonFormatter().format(record))["time"] == "2023-11-14T22:13:21.250Z"


def test_lines_arriving_one_by_one_are_gathered_into_few_writes() -> None:
    stream = CountingStream()
    log = logger_to(stream, "trickle")
    started = time.monotonic()
    for i in range(100):  # one line per millisecond or so, as requests arrive
        log.info("decision", extra={"fields": {"i": i}})
        time.sleep(0.001)
    elapsed = time.monotonic() - started
    logs.stop()
    assert [r["i"] for r in lines(stream)] == list(range(100))
    # A write per LINGER_SECONDS at most (plus the last), not one per line.
    assert stream.writes <= elapsed / logs.LINGER_SECONDS + 2


def test_a_quiet_line_is_written_within_the_linger() -> None:
    stream = CountingStream()
    log = logger_to(stream, "quiet")
    log.info("alone")
    deadline = time.monotonic() + 5
    while not stream.getvalue() and time.monotonic() < deadline:
        time.sleep(0.005)
    assert [r["message"] for r in lines(stream)] == ["alone"]  # without stop(): by the writer


FIELDS = {
    "uid": "u-1",
    "user": "alice",
    "allowed": False,
    "ms": 0.412,
    "message": 'user "alice" may not create configmaps',
}


def test_info_fields_writes_the_line_logger_info_writes() -> None:
    stream = CountingStream()
    log = logger_to(stream, "fields")
    logs.info_fields(log, "decision", FIELDS)  # straight into the pipeline
    log.info("decision", extra={"fields": FIELDS})  # through a LogRecord
    logs.stop()
    fast, slow = lines(stream)
    assert fast.pop("time") and slow.pop("time")
    assert list(fast.items()) == list(slow.items())  # same keys, values and order
    assert fast["message"] == FIELDS["message"]  # a denial's text replaces the message


def test_info_fields_honours_levels_and_falls_back_to_logging_elsewhere(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stream = CountingStream()
    log = logger_to(stream, "levels")
    log.setLevel(logging.WARNING)
    logs.info_fields(log, "decision", FIELDS)
    logs.stop()
    assert stream.getvalue() == ""
    # A logger not writing into a pipeline (here: pytest's capture) gets a LogRecord.
    plain = logging.getLogger("label_rbac.test.plain")
    plain.handlers[:] = []
    plain.propagate = True
    with caplog.at_level(logging.INFO, logger="label_rbac.test.plain"):
        logs.info_fields(plain, "decision", FIELDS)
    assert [r.fields for r in caplog.records] == [FIELDS]  # type: ignore[attr-defined]


class StalledStream(io.StringIO):
    """stdout nobody reads: every write waits until the test lets it through."""

    def __init__(self) -> None:
        super().__init__()
        self.flowing = threading.Event()

    def write(self, text: str) -> int:
        self.flowing.wait(30)
        return super().write(text)


def test_a_stalled_stream_drops_and_counts_lines_instead_of_growing_or_blocking() -> None:
    stream = StalledStream()
    log = logger_to(stream, "stalled")
    counted: list[None] = []
    logs.set_drop_observer(lambda: counted.append(None))
    before = logs.dropped()
    sent_per_thread = logs.MAX_QUEUED_LINES
    try:

        def flood(thread: int) -> None:
            for i in range(sent_per_thread):
                logs.info_fields(log, "decision", {"thread": thread, "i": i})

        threads = [threading.Thread(target=flood, args=(t,)) for t in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert not any(t.is_alive() for t in threads), "logging blocked a request thread"
        handler = log.handlers[0]
        assert isinstance(handler, logs.QueueHandler)
        assert handler.queue.qsize() <= logs.MAX_QUEUED_LINES + len(threads)
    finally:
        logs.set_drop_observer(None)
        stream.flowing.set()
    logs.stop()
    written = lines(stream)
    dropped = logs.dropped() - before
    sent = len(threads) * sent_per_thread
    assert dropped > 0 and len(counted) == dropped
    assert len(written) + dropped == sent
    # What was waiting: the queue, and the batch the writer had taken before the stream stalled.
    assert len(written) <= 2 * (logs.MAX_QUEUED_LINES + len(threads))


def test_long_request_fields_are_cut_before_they_are_queued() -> None:
    stream = CountingStream()
    log = logger_to(stream, "long")
    message = "m" * 3000  # a long denial: shares the line with the long user name
    logs.info_fields(log, "decision", {"user": "u" * 1_000_000, "name": "web", "message": message})
    logs.info_fields(log, "decision", FIELDS)  # short lines are untouched
    try:
        raise KeyError("k" * 100_000)
    except KeyError:
        logging.getLogger("label_rbac.test.long").exception("failed for %s", "x" * 100_000)
    logs.stop()
    cut, short, failed = lines(stream)
    assert cut["name"] == "web"
    assert str(cut["user"]).startswith("u" * 100) and str(cut["user"]).endswith(" more]")
    assert str(cut["message"]).startswith("m" * 1000)
    assert len(json.dumps(cut)) < logs.LINE_CHARS + 200
    assert {k: v for k, v in short.items() if k != "time"} == {
        "level": "info", "logger": "label_rbac.test.long", **FIELDS
    }  # fmt: skip
    assert len(str(failed["message"])) < logs.LINE_CHARS + 50
    # The end of a traceback says what failed: it is what is kept.
    assert str(failed["exception"]).rstrip().endswith("k" * 100 + "'")
    assert len(str(failed["exception"])) < logs.LINE_CHARS + 50


def test_a_flood_of_distinct_long_fields_keeps_only_their_cut_copies() -> None:
    stream = StalledStream()
    log = logger_to(stream, "memory")
    gc.collect()
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        for i in range(1000):  # 32 MB of distinct names, each released once logged
            logs.info_fields(log, "decision", {"name": f"{i}" + "n" * 32_000, "i": i})
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
        stream.flowing.set()
    logs.stop()
    assert len(lines(stream)) == 1000
    assert grown < 12_000_000, f"the queue keeps {grown} bytes"  # 32 MB when kept whole
