"""The compiler's probes and metrics (app.compiled.health), over real HTTP to its server."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from app.compiled.health import STALL_LEASES, CompilerHealth, ProbeServer
from app.source.base import SourceStatus

LEASE = 15.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def health(clock: Clock) -> CompilerHealth:
    return CompilerHealth(LEASE, clock=clock, wall=lambda: 1.7e9)


@pytest.fixture
def url(health: CompilerHealth) -> Iterator[str]:
    server = ProbeServer(health, "127.0.0.1", 0)
    server.start()
    yield f"http://127.0.0.1:{server.port}"
    server.stop()


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


SYNCED = SourceStatus(True, "synced: 3 roles")
LOST = SourceStatus(True, "lost the watch of roles; serving the state of 40s ago", 40.0)
LISTING = SourceStatus(False, "waiting for the initial list of roles")


@pytest.mark.parametrize(
    ("status", "leading", "code", "says"),
    [
        pytest.param(None, True, 503, "starting", id="no-watch-yet"),
        pytest.param(LISTING, True, 503, "waiting for the initial list", id="listing"),
        pytest.param(LOST, True, 503, "lost the watch", id="watch-lost-leading"),
        pytest.param(LOST, False, 503, "lost the watch", id="watch-lost-standby"),
        pytest.param(SYNCED, True, 200, "leading; synced", id="leading"),
        pytest.param(SYNCED, False, 200, "standing by; synced", id="standing-by"),
    ],
)
def test_readiness_is_a_current_watch_leading_or_standing_by(
    health: CompilerHealth,
    url: str,
    status: SourceStatus | None,
    leading: bool,
    code: int,
    says: str,
) -> None:
    if status is not None:
        health.watching(lambda: status)
    health.round(leading, 0, True, 0)
    answer, body = get(url + "/readyz")
    assert answer == code and says in json.loads(body)["detail"], body


def test_liveness_is_the_loop_going_round(health: CompilerHealth, clock: Clock, url: str) -> None:
    assert get(url + "/healthz")[0] == 200  # starting
    health.watching(lambda: SYNCED)
    health.round(True, 0, True, 0)
    clock.now += STALL_LEASES * LEASE - 1
    assert get(url + "/healthz")[0] == 200
    clock.now += 2
    code, body = get(url + "/healthz")
    assert code == 503 and "has not gone round for 61s" in body
    assert get(url + "/readyz")[0] == 503  # a stuck loop is not ready either
    assert get(url + "/other")[0] == 404


def test_lag_from_a_change_to_caught_up(health: CompilerHealth, clock: Clock, url: str) -> None:
    health.changed()
    clock.now += 1.0
    health.changed()  # a later change does not move the oldest
    health.round(True, 3, False, 0)  # still writing
    assert health.pending_seconds() == 1.0
    clock.now += 1.5
    health.round(True, 2, True, 1)  # caught up: 2.5 s after the first change
    assert health.pending_seconds() == 0.0
    code, text = get(url + "/metrics")
    assert code == 200
    series = dict(
        line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#")
    )
    assert series["label_rbac_compiler_lag_seconds_count"] == "1.0"
    assert series["label_rbac_compiler_lag_seconds_sum"] == "2.5"
    assert series['label_rbac_compiler_lag_seconds_bucket{le="2.0"}'] == "0.0"
    assert series['label_rbac_compiler_lag_seconds_bucket{le="5.0"}'] == "1.0"
    assert series["label_rbac_compiler_params_written_total"] == "5.0"
    assert series["label_rbac_compiler_delegated_namespaces"] == "1.0"
    assert series["label_rbac_compiler_leader"] == "1.0"
    assert series["label_rbac_compiler_pending_seconds"] == "0.0"
    assert series["label_rbac_compiler_last_round_timestamp_seconds"] == "1.7e+09"


def test_a_standby_has_no_lag_and_counts_errors(health: CompilerHealth, clock: Clock) -> None:
    health.changed()
    clock.now += 30
    health.round(False, 0, False, 0)
    assert health.pending_seconds() == 0.0
    health.failed()
    text = health.metrics().decode()
    assert "label_rbac_compiler_leader 0.0" in text
    assert "label_rbac_compiler_errors_total 1.0" in text
    assert "label_rbac_compiler_lag_seconds_count 0.0" in text


def test_a_takeover_is_pending_until_caught_up(health: CompilerHealth, clock: Clock) -> None:
    """A new leader checks every namespace with no change of its own to date it from: what the
    previous one left may be stale, so a stall there must show as pending too."""
    health.round(False, 0, False, 0)
    clock.now += 10
    health.round(True, 0, False, 0)  # took the lease: every namespace queued
    clock.now += 40
    health.round(True, 500, False, 0)
    assert health.pending_seconds() == 40.0
    health.changed()  # a change meanwhile does not make the backlog younger
    clock.now += 5
    health.round(True, 500, True, 0)
    assert health.pending_seconds() == 0.0
    assert "label_rbac_compiler_lag_seconds_sum 45.0" in health.metrics().decode()
