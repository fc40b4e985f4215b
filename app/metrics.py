"""Prometheus metrics: decisions, latency, the cluster cache and its watches.

Under gunicorn every worker counts for itself and ``/metrics`` (served by whichever worker takes
the scrape) adds them up from ``PROMETHEUS_MULTIPROC_DIR``; ``python -m app serve`` sets that up
before forking (app.serve). prometheus_client picks its multiprocess mode when it is first
imported, so this module is imported lazily, in the workers, never by app.server or app.serve
at import time.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from app.engine.model import AccessDecision, Decision, Request
from app.wire_sar import AccessReview

LAST_EVENT = "label_rbac_last_event_timestamp_seconds"
SINCE_LAST_EVENT = "label_rbac_seconds_since_last_event"

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
            "Admission decisions, by outcome, reason and mode (warn or audit: a denial that was "
            "not enforced).",
            ["allowed", "reason", "mode"],
            registry=r,
        )
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
        self.parent_lookups = Counter(
            "label_rbac_parent_lookups",
            "Parent and metadata lookups, by resource and result (ok, cached, watched, an HTTP "
            "status, unreachable, unsupported).",
            ["resource", "result"],
            registry=r,
        )

    # DecisionObserver

    def observe_decision(self, request: Request, decision: Decision, seconds: float) -> None:
        self.decisions.labels(
            "true" if decision.allowed else "false", decision.reason, decision.mode
        ).inc()
        self.decision_seconds.observe(seconds)

    def observe_access(
        self, review: AccessReview, decision: AccessDecision, seconds: float
    ) -> None:
        self.authorizations.labels(decision.verdict.value, decision.reason).inc()
        self.authorization_seconds.observe(seconds)

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
        self.parent_lookups.labels(resource, result).inc()

    def render(self) -> tuple[bytes, str]:
        """The exposition for ``/metrics``: all workers' metrics in multiprocess mode."""
        if multiprocess_dir():
            return render()
        return _expose(self.registry)


class _WithSinceLastEvent(Collector):
    """Passes families through and derives seconds-since-last-event at scrape time.

    A worker cannot keep a "seconds since" gauge current in the others' files; the timestamp
    gauge is exact, and the age is computed when scraped.
    """

    def __init__(self, source: CollectorRegistry | Collector) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        now = time.time()
        since = GaugeMetricFamily(
            SINCE_LAST_EVENT,
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


def _expose(source: CollectorRegistry | Collector) -> tuple[bytes, str]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_WithSinceLastEvent(source))
    return generate_latest(registry), CONTENT_TYPE_LATEST


def render() -> tuple[bytes, str]:
    """All workers' metrics when multiprocess, else this process's default registry."""
    directory = multiprocess_dir()
    if directory:
        return _expose(multiprocess.MultiProcessCollector(None, path=directory))
    return _expose(REGISTRY)


def mark_worker_dead(pid: int) -> None:
    """gunicorn ``child_exit``: drop a dead worker's live gauges from the aggregate."""
    if multiprocess_dir():
        multiprocess.mark_process_dead(pid)
