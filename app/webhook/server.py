"""The HTTP layer: a Flask app factory serving /validate, /authorize, /healthz, /readyz, /metrics.

The app holds no global state: ``create_app(settings, source)`` wires one RBAC source into one
app; admission (/validate) and authorization (/authorize) read the same snapshot. Malformed
envelopes get HTTP 400 with a JSON error; every policy outcome, including internal failures, is
an HTTP 200 review that fails closed.
"""

from __future__ import annotations

import io
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from flask import Flask, Response
from werkzeug.exceptions import HTTPException

from app import deepjson, logs
from app.engine.authorize import READ_CHECKS, ReadCheck, authorize
from app.engine.context import Context
from app.engine.decide import evaluate
from app.engine.model import AccessDecision, Decision, Request
from app.engine.nodeauthz import check_node_read
from app.engine.rbac import Snapshot
from app.settings import Settings
from app.source.base import RbacSource
from app.webhook.wire import ReviewError, build_response, parse_review
from app.webhook.wire_sar import AccessReview, build_access_response, parse_access_review

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

log = logging.getLogger("label_rbac.decisions")

NOT_SYNCED = "label-rbac policy cache not synced yet"

# A client that sends nothing for this long while its body is due is cut off, so that a stalled
# upload cannot hold a request thread (the API server's webhook timeout is 10 s by default).
BODY_READ_TIMEOUT = 10.0
# A body over the limit is read and thrown away, up to this much and this long, after the 413 is
# sent: a client that writes its whole body before it reads the answer (most HTTP/1.1 clients)
# then reads the 413 on an intact connection instead of meeting a reset (RFC 9112, section 9.6).
DRAIN_BYTES = 64 * 1024 * 1024
DRAIN_SECONDS = 10.0
# Parsing allocates per JSON value (some 70 bytes for an object, 50 for a short string), not per
# byte: 24 MiB of "{}," would become 8 million dicts, over 700 MB. Every comma and opening
# bracket of a legal review, inside strings or not, stands for at least one byte of what the API
# server stored (two objects of at most 1.5 MiB) or of the headers its envelope comes from (at
# most 1 MiB): 4.2 million at most. Bodies with more are refused before they are parsed.
MAX_JSON_VALUES = 4_500_000
# Bodies past either mark are parsed and decided one at a time in each worker process, so that
# the threads of a worker never hold several large parses at once.
HEAVY_BYTES = 3 * 1024 * 1024
HEAVY_VALUES = 200_000

# Called after every decision with (request, decision, seconds); metrics subscribe here.
DecisionObserver = Callable[[Request, Decision, float], None]
# Called after every SubjectAccessReview with (review, decision, seconds).
AccessObserver = Callable[[AccessReview, AccessDecision, float], None]
# Renders /metrics: (body, content type).
Exposition = Callable[[], tuple[bytes, str]]


def default_exposition() -> tuple[bytes, str]:
    # Imported on first scrape: prometheus_client fixes its multiprocess mode at import time,
    # which must come after ``serve`` has set PROMETHEUS_MULTIPROC_DIR (see app.webhook.metrics).
    from app.webhook.metrics import render

    return render()


def _json(payload: object, status: int = 200) -> Response:
    return Response(json.dumps(payload), status=status, mimetype="application/json")


def _error_body(status: int, message: str) -> dict[str, object]:
    return {"error": message, "code": status}


def _error(status: int, message: str) -> Response:
    return _json(_error_body(status, message), status)


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
    if decision.softened:
        record["mode"] = decision.mode
    if not decision.allowed or decision.softened:
        record["message"] = decision.message
    # app.logs writes ``fields`` into the JSON line (a denial's message replaces "decision").
    logs.info_fields(log, "decision", record)


def log_access(review: AccessReview, decision: AccessDecision, seconds: float) -> None:
    """One structured line per SubjectAccessReview (it carries no bodies, only attributes)."""
    record: dict[str, object] = {"user": review.user.username}
    if review.access is not None:
        access = review.access
        record.update(
            verb=access.verb,
            resource=str(access.resource),
            namespace=access.namespace,
            name=access.name,
            selector=",".join(map(str, access.labels)) if access.labels else "",
        )
    elif review.non_resource is not None:
        record.update(verb=review.non_resource.verb, path=review.non_resource.path)
    record.update(
        verdict=decision.verdict.value, reason=decision.reason, ms=round(seconds * 1000, 3)
    )
    if decision.message:
        record["message"] = decision.message
    logs.info_fields(log, "authorization", record)


class Unavailable(Exception):
    """The policy cannot be decided right now (not synced, or too stale): fail closed."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class Decider:
    """Turns one engine request into a decision against the source's current snapshot."""

    def __init__(self, settings: Settings, source: RbacSource) -> None:
        self._source = source
        self._options = settings.engine_options
        self._max_staleness = settings.max_staleness
        # The node authorizer decides kubelets' requests before any label rule sees them.
        self._read_checks: tuple[ReadCheck, ...] = (
            (check_node_read, *READ_CHECKS) if settings.node_authorizer else READ_CHECKS
        )

    def _context(self) -> Context:
        """A context on the current snapshot; raises ``Unavailable`` when it cannot be trusted."""
        snapshot: Snapshot | None = self._source.snapshot()
        if snapshot is None:
            raise Unavailable("NotSynced", NOT_SYNCED)
        if self._max_staleness is not None:
            stale = self._source.status().stale_seconds
            if stale is not None and stale > self._max_staleness:
                raise Unavailable(
                    "Stale",
                    f"label-rbac policy cache is {stale:.0f}s stale (limit "
                    f"{self._max_staleness:.0f}s): the API server has not been reachable",
                )
        return Context(
            snapshot,
            self._options,
            self._source.fetch_parent,
            self._source.fetch_metadata,
            self._source.node_graph(),
            self._source.registration(),
        )

    def __call__(self, request: Request) -> Decision:
        try:
            return evaluate(request, self._context())
        except Unavailable as exc:
            return Decision.deny(exc.reason, exc.message, code=503)
        except Exception:
            # A bug must not turn into an allow or a 5xx: log (no bodies) and deny.
            log.exception("internal error deciding uid=%s", request.uid)
            return Decision.deny(
                "InternalError", "label-rbac could not evaluate this request", code=500
            )

    def access(self, review: AccessReview) -> AccessDecision:
        """Answer a SubjectAccessReview: no opinion for non-resource requests, else the
        authorization pipeline; fails closed (deny) when the policy cannot be read."""
        if review.access is None:
            return AccessDecision.no_opinion("NonResource", "non-resource requests are RBAC's")
        try:
            return authorize(review.access, self._context(), self._read_checks)
        except Unavailable as exc:
            return AccessDecision.deny(exc.reason, exc.message)
        except Exception:
            log.exception("internal error authorizing user=%s", review.user.username)
            return AccessDecision.deny(
                "InternalError", "label-rbac could not evaluate this request"
            )


class _ReadTimeout:
    """Bounds each read of the request body on the server's socket (gunicorn exposes it)."""

    def __init__(self, environ: WSGIEnvironment, seconds: float) -> None:
        found = environ.get("gunicorn.socket")
        self._sock: socket.socket | None = found if isinstance(found, socket.socket) else None
        self._seconds = seconds
        self._saved: float | None = None

    def __enter__(self) -> _ReadTimeout:
        if self._sock is not None:
            self._saved = self._sock.gettimeout()
            self._sock.settimeout(self._seconds)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._sock is not None:
            self._sock.settimeout(self._saved)


class _TooLarge:
    """A 413 response that, once sent, reads and discards the rest of the body (see DRAIN_*)."""

    def __init__(self, environ: WSGIEnvironment, body: bytes, unread: int | None) -> None:
        self._environ = environ
        self._body = body
        self._unread = unread  # None: unknown (chunked)

    def __iter__(self) -> Iterator[bytes]:
        yield self._body

    def close(self) -> None:
        if self._unread is not None and self._unread > DRAIN_BYTES:
            return  # hopeless: let the server close the connection now
        stream = self._environ["wsgi.input"]
        deadline = time.monotonic() + DRAIN_SECONDS
        drained = 0
        try:
            while drained < DRAIN_BYTES and (remaining := deadline - time.monotonic()) > 0:
                with _ReadTimeout(self._environ, min(remaining, BODY_READ_TIMEOUT)):
                    data = stream.read(min(256 * 1024, DRAIN_BYTES - drained))
                if not data:
                    return
                drained += len(data)
        except (OSError, ValueError):
            return  # the client went away or stalled: the server closes the connection


class BodyLimit:
    """WSGI middleware: reads the request body once, within ``max_bytes`` and with a read timeout.

    A declared ``Content-Length`` over the limit is refused before anything is read; a chunked
    body is refused as soon as it passes the limit. Either way the answer is a JSON 413 followed
    by a lingering read (``_TooLarge``), never a reset mid-request. The body handed on is complete
    and its length declared, so the app reads chunked and plain bodies alike.
    """

    def __init__(self, app: WSGIApplication, max_bytes: int) -> None:
        self._app = app
        self._max = max_bytes
        self._heavy = threading.Lock()

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        stream = environ.get("wsgi.input")
        if environ.get("REQUEST_METHOD") not in ("POST", "PUT", "PATCH") or stream is None:
            return self._app(environ, start_response)
        declared = environ.get("CONTENT_LENGTH") or ""
        length = int(declared) if declared.isascii() and declared.isdigit() else None
        if length is not None and length > self._max:
            return self._refuse(environ, start_response, length)
        try:
            with _ReadTimeout(environ, BODY_READ_TIMEOUT):
                # Content-Length: exactly that many bytes; chunked: one byte past the limit.
                body = stream.read(length if length is not None else self._max + 1)
        except OSError:
            return self._respond(start_response, 408, "the request body was not received in time")
        if len(body) > self._max:
            return self._refuse(environ, start_response, None)
        # Commas and brackets, those in strings too: C-speed passes, an upper bound of the values.
        values = body.count(b",") + body.count(b"[") + body.count(b"{")
        if values > MAX_JSON_VALUES:
            message = f"request body has more than {MAX_JSON_VALUES} JSON values"
            return self._respond(start_response, 413, message)
        environ["wsgi.input"] = io.BytesIO(body)
        environ["CONTENT_LENGTH"] = str(len(body))
        environ.pop("HTTP_TRANSFER_ENCODING", None)
        if len(body) <= HEAVY_BYTES and values <= HEAVY_VALUES:
            return self._app(environ, start_response)
        with self._heavy:  # the view parses, decides and renders within this call
            return self._app(environ, start_response)

    def _refuse(
        self, environ: WSGIEnvironment, start_response: StartResponse, unread: int | None
    ) -> Iterable[bytes]:
        body = self._body(413, f"request body larger than {self._max} bytes (--max-body-bytes)")
        start_response("413 Request Entity Too Large", self._headers(body))
        return _TooLarge(environ, body, unread)

    def _respond(self, start_response: StartResponse, status: int, message: str) -> list[bytes]:
        body = self._body(status, message)
        start_response(f"{status} {_REASONS[status]}", self._headers(body))
        return [body]

    @staticmethod
    def _body(status: int, message: str) -> bytes:
        return json.dumps({"error": message, "code": status}).encode()

    @staticmethod
    def _headers(body: bytes) -> list[tuple[str, str]]:
        return [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]


_REASONS = {408: "Request Timeout", 413: "Request Entity Too Large"}


# What a review endpoint answers: an HTTP status and the JSON document to send.
Answer = tuple[int, object]
# A review endpoint: the request body in, the answer out.
Endpoint = Callable[[bytes], Answer]

_STATUS_LINES = {
    200: "200 OK",
    400: "400 Bad Request",
    405: "405 Method Not Allowed",
    500: "500 Internal Server Error",
}


class ReviewEndpoints:
    """WSGI: serves ``POST /validate`` and ``POST /authorize`` itself, everything else via Flask.

    Flask's per-request machinery (request context, URL adapter and routing, request and
    response objects, teardown) cost a worker about as much CPU as the decision itself, and
    these two endpoints need none of it: a body in, a JSON document out. Other methods and
    paths (GET /validate's 405, /healthz, /readyz, /metrics, 404s) are Flask's as before.
    ``BodyLimit`` sits in front, so the body read here is complete and within the limit.
    """

    def __init__(self, app: WSGIApplication, endpoints: dict[str, Endpoint]) -> None:
        self._app = app
        self._endpoints = endpoints

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        endpoint = self._endpoints.get(path)
        if endpoint is None:
            return self._app(environ, start_response)
        if environ.get("REQUEST_METHOD") != "POST":
            answer: Answer = (405, _error_body(405, f"{path} accepts POST only"))
            return self._send(start_response, answer, [("Allow", "POST")])
        try:
            answer = endpoint(environ["wsgi.input"].read())
        except Exception:
            # A bug: never an allow; the API server applies the webhook's failurePolicy.
            log.exception("internal error serving %s", path)
            answer = (500, _error_body(500, "internal error"))
        return self._send(start_response, answer)

    @staticmethod
    def _send(
        start_response: StartResponse, answer: Answer, extra: list[tuple[str, str]] | None = None
    ) -> list[bytes]:
        status, document = answer
        body = json.dumps(document).encode()
        headers = [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
        start_response(_STATUS_LINES[status], headers + (extra or []))
        return [body]


def _load_body(body: bytes) -> object:
    """The request body as JSON, or the 400 answer saying why it is not."""
    try:
        return deepjson.loads(body)
    except deepjson.TooDeep as exc:
        return _BadRequest(f"body is not usable JSON: {exc}")
    except ValueError:
        return _BadRequest("body is not valid JSON")


class _BadRequest:
    """Why a body is no review (HTTP 400): kept apart from any JSON document a body can hold."""

    def __init__(self, message: str) -> None:
        self.answer: Answer = (400, _error_body(400, message))


def create_app(
    settings: Settings,
    source: RbacSource,
    observers: tuple[DecisionObserver, ...] = (),
    exposition: Exposition = default_exposition,
    access_observers: tuple[AccessObserver, ...] = (),
) -> Flask:
    deepjson.prepare()  # before gunicorn starts the request threads: see app.deepjson
    app = Flask("label_rbac")
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
    decide = Decider(settings, source)
    notify = (log_decision, *observers)
    notify_access = (log_access, *access_observers)

    def validate(body: bytes) -> Answer:
        started = time.perf_counter()
        document = _load_body(body)
        if isinstance(document, _BadRequest):
            return document.answer
        try:
            review = parse_review(document)
        except ReviewError as exc:
            return 400, _error_body(400, f"not an AdmissionReview: {exc}")
        decision = decide(review.request)
        elapsed = time.perf_counter() - started
        for observer in notify:
            observer(review.request, decision, elapsed)
        return 200, build_response(review.api_version, review.request.uid, decision)

    def authorize_review(body: bytes) -> Answer:
        started = time.perf_counter()
        document = _load_body(body)
        if isinstance(document, _BadRequest):
            return document.answer
        try:
            review = parse_access_review(document)
        except ReviewError as exc:
            return 400, _error_body(400, f"not a SubjectAccessReview: {exc}")
        decision = decide.access(review)
        elapsed = time.perf_counter() - started
        for access_observer in notify_access:
            access_observer(review, decision, elapsed)
        return 200, build_access_response(review.api_version, decision)

    endpoints: dict[str, Endpoint] = {"/validate": validate, "/authorize": authorize_review}
    reviews = ReviewEndpoints(app.wsgi_app, endpoints)
    app.wsgi_app = BodyLimit(reviews, settings.max_body_bytes)  # type: ignore[method-assign]

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
