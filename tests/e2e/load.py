"""Steady tenant traffic through the API server, each answer checked against the right one.

A tenant (alice, team=a in manifests/examples/tenants.yaml) writes ConfigMaps (a server-side
dry run, so nothing accumulates in etcd; admission webhooks are called all the same) labeled
with her team, which must be allowed, and with another team, which the admission webhook must
refuse; and lists ConfigMaps by her label (allowed) and by another team's (refused by the
authorization webhook). Every answer is one of:

- ``right``: the decision label-rbac must make;
- ``wrong``: the opposite decision (an allow where a refusal is due, or the reverse);
- ``failed``: no decision (the API server could not reach the webhook, or did not answer).

Each result is recorded with the phase it started in and its latency, for the HA tests and
``python -m bench ha``.
"""

from __future__ import annotations

import ssl
import statistics
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.kube.controlplane import ControlPlane

RIGHT, WRONG, FAILED = "right", "wrong", "failed"


@dataclass(frozen=True)
class Probe:
    """One request and the status its decision must bring."""

    name: str
    method: str
    path: str
    body: dict[str, Any] | None
    allowed: bool


def probes(namespace: str, team: str = "a", other: str = "b") -> list[Probe]:
    """Alice's four requests in ``namespace``: write and read, inside and outside her bucket."""

    def configmap(label: str) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"generateName": "load-", "labels": {"team": label}},
        }

    def selected(label: str) -> str:
        return f"{base}?labelSelector={urllib.parse.quote(f'team={label}')}"

    base = f"/api/v1/namespaces/{namespace}/configmaps"
    return [
        Probe("write-own", "POST", f"{base}?dryRun=All", configmap(team), True),
        Probe("write-other", "POST", f"{base}?dryRun=All", configmap(other), False),
        Probe("read-own", "GET", selected(team), None, True),
        Probe("read-other", "GET", selected(other), None, False),
    ]


@dataclass(frozen=True)
class Result:
    phase: str
    probe: str
    outcome: str
    started: float  # time.time()
    seconds: float
    detail: str


def judge(probe: Probe, status: int, body: Any) -> tuple[str, str]:
    """(outcome, detail) of one answer."""
    message = body.get("message", "") if isinstance(body, dict) else str(body)
    if status in (200, 201):
        return (RIGHT, "") if probe.allowed else (WRONG, f"{status}: allowed")
    if status == 403:
        # A refusal by label-rbac, not a failure: the admission webhook's message, or the
        # authorization webhook's "forbidden" (its reason is in the audit log).
        return (WRONG, f"403: {message}") if probe.allowed else (RIGHT, "")
    return FAILED, f"{status}: {message}"[:300]


@dataclass
class Load:
    """``threads`` loops of ``probes`` as ``user`` until ``stop()`` (or ``limit`` requests)."""

    control_plane: ControlPlane
    probes: list[Probe]
    user: str = "alice"
    threads: int = 2
    limit: int = 100_000
    phase: str = "start"
    results: list[Result] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _workers: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> Load:
        for index in range(self.threads):
            worker = threading.Thread(target=self._run, args=(index,), daemon=True)
            worker.start()
            self._workers.append(worker)
        return self

    def stop(self) -> None:
        self._stop.set()
        for worker in self._workers:
            worker.join(timeout=60)

    def _run(self, index: int) -> None:
        turn = index
        while not self._stop.is_set() and len(self.results) < self.limit:
            probe = self.probes[turn % len(self.probes)]
            turn += 1
            phase, wall, started = self.phase, time.time(), time.monotonic()
            try:
                status, body = self.control_plane.request(
                    self.user, probe.method, probe.path, probe.body, timeout=30
                )
                outcome, detail = judge(probe, status, body)
            except (OSError, ssl.SSLError) as exc:
                outcome, detail = FAILED, f"API server unreachable: {exc}"
            with self._lock:
                self.results.append(
                    Result(phase, probe.name, outcome, wall, time.monotonic() - started, detail)
                )

    def count(self, phase: str | None = None) -> int:
        return len(self.of(phase))

    def of(self, phase: str | None = None, outcome: str | None = None) -> list[Result]:
        with self._lock:
            return [
                r
                for r in self.results
                if (phase is None or r.phase == phase) and (outcome is None or r.outcome == outcome)
            ]

    def wait_for(self, requests: int, timeout: float = 60) -> None:
        """Until ``requests`` more answers have come in (the load is really flowing)."""
        target = self.count() + requests
        deadline = time.monotonic() + timeout
        while self.count() < target:
            if time.monotonic() > deadline:
                raise AssertionError(f"only {self.count()} of {target} requests answered")
            time.sleep(0.05)


def percentile(values: list[float], fraction: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def summary(load: Load, phases: list[str]) -> list[dict[str, Any]]:
    """Per phase: requests, right/wrong/failed, latency p50 and p99 (ms)."""
    rows = []
    for phase in phases:
        results = load.of(phase)
        outcomes = Counter(r.outcome for r in results)
        seconds = [r.seconds for r in results]
        rows.append(
            {
                "phase": phase,
                "requests": len(results),
                RIGHT: outcomes[RIGHT],
                WRONG: outcomes[WRONG],
                FAILED: outcomes[FAILED],
                "p50_ms": round(statistics.median(seconds) * 1000, 1) if seconds else 0.0,
                "p99_ms": round(percentile(seconds, 0.99) * 1000, 1),
            }
        )
    return rows


def until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} after {timeout}s")
        time.sleep(0.05)
