"""The HTTP layer: a Flask app factory serving /validate, /healthz, /readyz and /metrics.

The app holds no global state: ``create_app(settings, source)`` wires one RBAC source into one
app. Malformed envelopes get HTTP 400 with a JSON error; every policy outcome, including internal
failures, is an HTTP 200 AdmissionReview that fails closed.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

from flask import Flask, Response, request
from werkzeug.exceptions import HTTPException

from app.engine.context import Context
from app.engine.decide import evaluate
from app.engine.model import Decision, Request
from app.settings import Settings
from app.source.base import RbacSource
from app.wire import ReviewError, build_response, parse_review

log = logging.getLogger("label_rbac.decisions")

NOT_SYNCED = "label-rbac policy cache not synced yet"

# Called after every decision with (request, decision, seconds); metrics subscribe here.
DecisionObserver = Callable[[Request, Decision, float], None]
# Renders /metrics: (body, content type).
Exposition = Callable[[], tuple[bytes, str]]


def default_exposition() -> tuple[bytes, str]:
    # Imported on first scrape: prometheus_client fixes its multiprocess mode at import time,
    # which must come after ``serve`` has set PROMETHEUS_MULTIPROC_DIR (see app.metrics).
    from app.metrics import render

    return render()


def _json(payload: object, status: int = 200) -> Response:
    return Response(json.dumps(payload), status=status, mimetype="application/json")


def _error(status: int, message: str) -> Response:
    return _json({"error": message, "code": status}, status)


def log_decision(request: Request, decision: Decision, seconds: float) -> None:
    """One structured line per decision. Metadata only: object bodies (Secrets!) never."""
    record = {
        "uid": request.uid,
        "user": request.user.username,
        "operation": request.operation,
        "resource": str(request.resource),
        "namespace": request.namespace,
        "name": request.name,
        "dryRun": request.dry_run,
        "allowed": decision.allowed,
        "reason": decision.reason,
        "ms": round(seconds * 1000, 3),
    }
    if not decision.allowed:
        record["message"] = decision.message
    log.info(json.dumps(record, separators=(",", ":")))


class Decider:
    """Turns one engine request into a decision against the source's current snapshot."""

    def __init__(self, settings: Settings, source: RbacSource) -> None:
        self._source = source
        self._options = settings.engine_options
        self._max_staleness = settings.max_staleness

    def __call__(self, request: Request) -> Decision:
        snapshot = self._source.snapshot()
        if snapshot is None:
            return Decision.deny("NotSynced", NOT_SYNCED, code=503)
        if self._max_staleness is not None:
            stale = self._source.status().stale_seconds
            if stale is not None and stale > self._max_staleness:
                return Decision.deny(
                    "Stale",
                    f"label-rbac policy cache is {stale:.0f}s stale (limit "
                    f"{self._max_staleness:.0f}s): the API server has not been reachable",
                    code=503,
                )
        try:
            return evaluate(
                request,
                Context(
                    snapshot,
                    self._options,
                    self._source.fetch_parent,
                    self._source.fetch_metadata,
                ),
            )
        except Exception:
            # A bug must not turn into an allow or a 5xx: log (no bodies) and deny.
            log.exception("internal error deciding uid=%s", request.uid)
            return Decision.deny(
                "InternalError", "label-rbac could not evaluate this request", code=500
            )


def create_app(
    settings: Settings,
    source: RbacSource,
    observers: tuple[DecisionObserver, ...] = (),
    exposition: Exposition = default_exposition,
) -> Flask:
    app = Flask("label_rbac")
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
    decide = Decider(settings, source)
    notify = (log_decision, *observers)

    @app.post("/validate")
    def validate() -> Response:
        started = time.perf_counter()
        try:
            document = json.loads(request.get_data(cache=False))
        except ValueError:
            return _error(400, "body is not valid JSON")
        try:
            review = parse_review(document)
        except ReviewError as exc:
            return _error(400, f"not an AdmissionReview: {exc}")
        decision = decide(review.request)
        elapsed = time.perf_counter() - started
        for observer in notify:
            observer(review.request, decision, elapsed)
        return _json(build_response(review.api_version, review.request.uid, decision))

    @app.get("/healthz")
    def healthz() -> Response:
        return _json({"status": "ok"})

    @app.get("/readyz")
    def readyz() -> Response:
        status = source.status()
        body = {"ready": status.ready, "detail": status.detail}
        if status.stale_seconds is not None:
            body["staleSeconds"] = round(status.stale_seconds, 3)
        return _json(body, 200 if status.ready else 503)

    @app.get("/metrics")
    def metrics() -> Response:
        body, content_type = exposition()
        return Response(body, content_type=content_type)

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException) -> Response:
        return _error(exc.code or 400, exc.description or exc.name)

    return app
