"""Prometheus metrics: decisions, latency, the cluster cache and its watches.

Under gunicorn every worker counts for itself and ``/metrics`` (served by whichever worker takes
the scrape) adds them up from ``PROMETHEUS_MULTIPROC_DIR``; ``python -m app serve`` sets that up
before forking (app.webhook.serve). prometheus_client picks its multiprocess mode when it is first
imported, so this module is imported lazily, in the workers, never by app.webhook.server or
app.webhook.serve at import time.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
    multiprocess,
)
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from app import __version__
from app.engine.model import OPERATIONS, AccessDecision, Decision, Request
from app.webhook.wire_sar import AccessReview

LAST_EVENT = "label_rbac_last_event_timestamp_seconds"
LAST_EVENT_AGE = "label_rbac_last_event_age_seconds"

# Distinct ``resource`` label values one worker reports before it counts the rest as "other":
# /validate is reachable without authentication, a SubjectAccessReview names whatever resource
# the client's URL did, and made-up names must not grow the exposition (nor the multiprocess
# files) without bound. A cluster's webhook-scoped resources fit well within this. A value longer
# than any served resource can be (``res.group/sub``: 63 + 253 + 63 and the separators) is
# "other" at once. Every other label takes its values from a fixed set; an operation the API
# server does not send is "other" too.
MAX_RESOURCE_LABELS = 500
MAX_RESOURCE_LABEL_CHARS = 63 + 1 + 253 + 1 + 63
OTHER = "other"

# Decisions take well under a millisecond from the cache; parent lookups take a round trip.
DECISION_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


def multiprocess_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


class Metrics:
    """One worker's metrics. Implements the decision observer and the source observer."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        # A private registry by default: apps created in one process (tests) do not collide.
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.decisions = Counter(
            "label_rbac_decisions",
            "Admission decisions, by outcome, reason, operation, resource and mode (warn or "
            "audit: a denial that was not enforced).",
            # Alphabetical, as the multiprocess exposition orders them anyway.
            ["allowed", "mode", "operation", "reason", "resource"],
            registry=r,
        )
        self._resources: set[str] = set()
        self.decision_seconds = Histogram(
            "label_rbac_decision_seconds",
            "Time to decide one AdmissionReview (parsing to response).",
            buckets=DECISION_BUCKETS,
            registry=r,
        )
        self.authorizations = Counter(
            "label_rbac_authorizations",
            "SubjectAccessReview answers, by verdict (Allow, Deny, NoOpinion) and reason.",
            ["verdict", "reason"],
            registry=r,
        )
        self.authorization_seconds = Histogram(
            "label_rbac_authorization_seconds",
            "Time to answer one SubjectAccessReview (parsing to response).",
            buckets=DECISION_BUCKETS,
            registry=r,
        )
        # Gauges say how multiprocess mode combines workers: every worker holds its own cache.
        self.cache_size = Gauge(
            "label_rbac_cache_objects",
            "Objects in the RBAC cache, by kind (largest over live workers).",
            ["kind"],
            multiprocess_mode="livemax",
            registry=r,
        )
        self.watch_restarts = Counter(
            "label_rbac_watch_restarts",
            "Watches restarted, by kind and cause (expired, closed, disconnected, error, "
            "malformed, resync).",
            ["kind", "cause"],
            registry=r,
        )
        self.last_event = Gauge(
            LAST_EVENT,
            "Unix time the API server was last heard from about this kind: list, watch event, "
            "bookmark or watch (re)connection (oldest over live workers).",
            ["kind"],
            multiprocess_mode="livemin",
            registry=r,
        )
        self.cache_synced = Gauge(
            "label_rbac_cache_synced",
            "1 once every kind has been listed (lowest over live workers).",
            multiprocess_mode="livemin",
            registry=r,
        )
        # Constant: which build answers (multiprocess "max": one series, not one per worker).
        self.build_info = Gauge(
            "label_rbac_build_info",
            "Always 1; the labels say which build of label-rbac is running.",
            ["version", "python_version"],
            multiprocess_mode="max",
            registry=r,
        )
        self.build_info.labels(__version__, platform.python_version()).set(1)
        self.parent_lookups = Counter(
            "label_rbac_parent_lookups",
            "Parent and metadata lookups, by resource and result (ok, cached, watched, an HTTP "
            "status, unreachable, unsupported).",
            ["resource", "result"],
            registry=r,
        )
        self.connections_closed = Counter(
            "label_rbac_connections_closed",
            "Connections closed before their request was complete, by reason: deadline (the "
            "handshake and request not in within --request-deadline), evicted (the oldest waiting "
            "one, for room under --max-connections or --max-connections-per-peer), refused (no "
            "room: every connection busy), buffer (request bytes past the worker's budget), "
            "headers (over 32 KiB), malformed (framing refused: 400 or 501), descriptors (the "
            "oldest waiting one, for room when the process is out of file descriptors).",
            ["reason"],
            registry=r,
        )
        self.log_lines_dropped = Counter(
            "label_rbac_log_lines_dropped",
            "Log lines (decisions and others) dropped because the log queue was full: stdout or "
            "stderr was not being read.",
            registry=r,
        )

    # DecisionObserver

    def observe_decision(self, request: Request, decision: Decision, seconds: float) -> None:
        self.decisions.labels(
            "true" if decision.allowed else "false",
            decision.mode,
            request.operation if request.operation in OPERATIONS else OTHER,
            decision.reason,
            self._resource_label(str(request.resource)),
        ).inc()
        self.decision_seconds.observe(seconds)

    def observe_access(
        self, review: AccessReview, decision: AccessDecision, seconds: float
    ) -> None:
        self.authorizations.labels(decision.verdict.value, decision.reason).inc()
        self.authorization_seconds.observe(seconds)

    def _resource_label(self, resource: str) -> str:
        if resource in self._resources:
            return resource
        if len(self._resources) >= MAX_RESOURCE_LABELS or len(resource) > MAX_RESOURCE_LABEL_CHARS:
            return OTHER
        self._resources.add(resource)
        return resource

    # SourceObserver

    def contact(self, kind: str, timestamp: float) -> None:
        self.last_event.labels(kind).set(timestamp)

    def watch_restarted(self, kind: str, cause: str) -> None:
        self.watch_restarts.labels(kind, cause).inc()

    def cache_objects(self, kind: str, count: int) -> None:
        self.cache_size.labels(kind).set(count)

    def synced(self, synced: bool) -> None:
        self.cache_synced.set(1 if synced else 0)

    def parent_lookup(self, resource: str, result: str) -> None:
        self.parent_lookups.labels(self._resource_label(resource), result).inc()

    def connection_closed(self, reason: str) -> None:
        self.connections_closed.labels(reason).inc()

    def log_line_dropped(self) -> None:
        self.log_lines_dropped.inc()

    def render(self) -> tuple[bytes, str]:
        """The exposition for ``/metrics``: all workers' metrics in multiprocess mode."""
        if multiprocess_dir():
            return render()
        return _expose(self.registry)


class _WithLastEventAge(Collector):
    """Passes families through and derives the age of the last event at scrape time.

    A worker cannot keep an age gauge current in the others' files; the timestamp gauge is
    exact, and the age is computed when scraped.
    """

    def __init__(self, source: CollectorRegistry | Collector) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        now = time.time()
        since = GaugeMetricFamily(
            LAST_EVENT_AGE,
            "Seconds since the API server was last heard from about this kind.",
            labels=["kind"],
        )
        families: Iterable[Metric] = self._source.collect()
        for family in families:
            yield family
            if family.name == LAST_EVENT:
                for sample in family.samples:
                    since.add_metric([sample.labels["kind"]], max(0.0, now - sample.value))
        yield since


def _constant(pid: int) -> Callable[[], int]:
    return lambda: pid


class ServerProcesses(Collector):
    """``process_*`` for the whole server: the gunicorn arbiter and all its workers, summed.

    Under gunicorn the scrape is served by one worker, whose own process metrics would say
    little; ``/proc`` of the arbiter lists the workers. Outside gunicorn: this process.
    """

    def __init__(self, arbiter: int | None) -> None:
        self._arbiter = arbiter

    def _pids(self) -> list[int]:
        if self._arbiter is None:
            return [os.getpid()]
        try:
            children = Path(f"/proc/{self._arbiter}/task/{self._arbiter}/children").read_text()
        except OSError:
            return [os.getpid()]
        return [self._arbiter, *map(int, children.split())]

    def collect(self) -> Iterator[Metric]:
        summed: dict[str, Metric] = {}
        for pid in self._pids():
            for family in ProcessCollector(pid=_constant(pid), registry=None).collect():
                known = summed.get(family.name)
                if known is None:
                    summed[family.name] = family
                elif family.name not in ("process_start_time_seconds", "process_max_fds"):
                    # The arbiter's start time and limits stand for the server; the rest adds up.
                    sample = known.samples[0]
                    known.samples[0] = sample._replace(value=sample.value + family.samples[0].value)
        yield from summed.values()


def _expose(source: CollectorRegistry | Collector, processes: bool = True) -> tuple[bytes, str]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_WithLastEventAge(source))
    if processes:
        registry.register(ServerProcesses(os.getppid() if multiprocess_dir() else None))
    return generate_latest(registry), CONTENT_TYPE_LATEST


def render() -> tuple[bytes, str]:
    """All workers' metrics when multiprocess, else this process's default registry."""
    directory = multiprocess_dir()
    if directory:
        return _expose(multiprocess.MultiProcessCollector(None, path=directory))
    # The default registry has its own process collector.
    return _expose(REGISTRY, processes=False)


def mark_worker_dead(pid: int) -> None:
    """gunicorn ``child_exit``: drop a dead worker's live gauges from the aggregate."""
    if multiprocess_dir():
        multiprocess.mark_process_dead(pid)
