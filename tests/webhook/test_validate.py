"""The HTTP layer in-process: /validate, the two error channels, health endpoints, logging."""

from __future__ import annotations

import io
import json
import logging
from typing import Any

import pytest
from flask.testing import FlaskClient

from app.engine.context import ParentUnavailable
from app.engine.model import Request
from app.logs import JsonFormatter
from app.settings import Settings
from app.source.static import StaticSource
from app.webhook.server import NOT_SYNCED, Answer, ReviewEndpoints, create_app
from tests.conftest import EXAMPLES
from tests.support import make_review


def post(client: FlaskClient, review: Any) -> Any:
    response = client.post("/validate", json=review)
    assert response.status_code == 200, response.get_data(as_text=True)
    return response.get_json()


@pytest.mark.parametrize(
    ("review", "allowed"),
    [
        pytest.param(
            make_review("alice", "CREATE", "configmaps", namespace="t1", labels={"team": "a"}),
            True,
            id="alice-creates-in-her-bucket",
        ),
        pytest.param(
            make_review("bob", "CREATE", "configmaps", namespace="t1", labels={"team": "a"}),
            False,
            id="bob-creates-in-alices-bucket",
        ),
        pytest.param(
            make_review(
                "bob",
                "UPDATE",
                "configmaps",
                namespace="t1",
                labels={"team": "b"},
                old_labels={"team": "a"},
            ),
            False,
            id="bob-steals-by-relabelling",
        ),
        pytest.param(
            make_review("bob", "DELETE", "configmaps", namespace="t1", old_labels={"team": "a"}),
            False,
            id="bob-deletes-alices",
        ),
        pytest.param(
            make_review(
                "carol", "CREATE", "configmaps", groups=("auditors",), namespace="t1", labels={}
            ),
            True,
            id="no-granting-role-left-to-rbac",
        ),
    ],
)
def test_validate_decides(client: FlaskClient, review: dict[str, Any], allowed: bool) -> None:
    body = post(client, review)
    assert body["apiVersion"] == review["apiVersion"]
    assert body["kind"] == "AdmissionReview"
    assert body["response"]["uid"] == review["request"]["uid"]
    assert body["response"]["allowed"] is allowed
    if not allowed:
        assert body["response"]["status"]["code"] == 403
        assert body["response"]["status"]["reason"] == "Forbidden"


def test_denial_message_is_actionable(client: FlaskClient) -> None:
    review = make_review(
        "bob", "CREATE", "configmaps", namespace="t1", name="c2", labels={"team": "a"}
    )
    message = post(client, review)["response"]["status"]["message"]
    assert message == (
        'user "bob" may not create configmaps "c2" in namespace "t1": label team="a" is not '
        "permitted (role t1/team-b allows team in [b])"
    )


def test_v1beta1_is_echoed(client: FlaskClient) -> None:
    review = make_review(
        "alice",
        "CREATE",
        "configmaps",
        namespace="t1",
        labels={"team": "a"},
        api_version="admission.k8s.io/v1beta1",
    )
    assert post(client, review)["apiVersion"] == "admission.k8s.io/v1beta1"


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        pytest.param(b"{not json", "application/json", id="not-json"),
        pytest.param(b"[]", "application/json", id="array"),
        pytest.param(b'{"kind": "Pod"}', "application/json", id="wrong-kind"),
        pytest.param(
            json.dumps({**make_review("a", "CREATE", "pods"), "apiVersion": "v2"}).encode(),
            "application/json",
            id="unknown-api-version",
        ),
        pytest.param(
            json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).encode(),
            "application/json",
            id="no-request",
        ),
        pytest.param(b"\xff\xfe\x00", "application/octet-stream", id="binary"),
        pytest.param(b"", "application/json", id="empty"),
    ],
)
def test_malformed_envelope_is_400_json(
    client: FlaskClient, body: bytes, content_type: str
) -> None:
    response = client.post("/validate", data=body, content_type=content_type)
    assert response.status_code == 400
    assert response.is_json and response.get_json()["code"] == 400


def test_missing_uid_is_400(client: FlaskClient) -> None:
    review = make_review("alice", "CREATE", "configmaps", namespace="t1", labels={})
    del review["request"]["uid"]
    assert client.post("/validate", json=review).status_code == 400


def test_oversized_body_is_413_json(source: StaticSource) -> None:
    app = create_app(Settings(rbac_dir=EXAMPLES, max_body_bytes=1024), source)
    review = make_review(
        "alice",
        "CREATE",
        "configmaps",
        namespace="t1",
        labels={"team": "a"},
        extra_object={"data": {"blob": "x" * 4096}},
    )
    response = app.test_client().post("/validate", json=review)
    assert response.status_code == 413
    assert response.get_json()["code"] == 413


@pytest.mark.parametrize("path", ["/validate", "/authorize"])
@pytest.mark.parametrize("method", ["GET", "PUT", "PATCH", "DELETE"])
def test_review_endpoints_take_post_only(client: FlaskClient, method: str, path: str) -> None:
    response = client.open(path, method=method, json={})
    assert response.status_code == 405 and response.headers["Allow"] == "POST"
    assert response.get_json() == {"error": f"{path} accepts POST only", "code": 405}


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        pytest.param("GET", "/nope", 404, id="unknown-path"),
        pytest.param("POST", "/nope", 404, id="post-to-unknown-path"),
        pytest.param("POST", "/validate/", 404, id="trailing-slash"),
        pytest.param("POST", "/healthz", 405, id="post-to-healthz"),
    ],
)
def test_other_paths_and_methods_are_flasks_json_errors(
    client: FlaskClient, method: str, path: str, status: int
) -> None:
    response = client.open(path, method=method, json={})
    assert response.status_code == status and response.is_json
    assert response.get_json()["code"] == status


def test_a_bug_in_an_endpoint_is_a_500_without_the_body(caplog: pytest.LogCaptureFixture) -> None:
    def broken(body: bytes) -> Answer:
        raise KeyError("bug")

    def fallback(environ: Any, start_response: Any) -> list[bytes]:
        raise AssertionError("review paths never reach the app behind")

    reviews = ReviewEndpoints(fallback, {"/validate": broken})
    statuses: list[str] = []
    secret = b'{"data": {"password": "hunter2"}}'
    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": "/validate", "wsgi.input": io.BytesIO(secret)}
    with caplog.at_level(logging.ERROR, logger="label_rbac.decisions"):
        body = b"".join(reviews(environ, lambda status, headers: statuses.append(status)))
    assert statuses == ["500 Internal Server Error"]
    assert json.loads(body) == {"error": "internal error", "code": 500}
    assert "internal error serving /validate" in caplog.text and "hunter2" not in caplog.text


def test_health_and_readiness(client: FlaskClient) -> None:
    assert client.get("/healthz").status_code == 200
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.get_json()["ready"] is True


def test_not_synced_fails_closed_with_503() -> None:
    settings = Settings(rbac_dir=EXAMPLES)
    unstarted = StaticSource(EXAMPLES, settings.compiler)  # never loaded: no snapshot
    client = create_app(settings, unstarted).test_client()
    assert client.get("/readyz").status_code == 503
    assert client.get("/healthz").status_code == 200
    review = make_review("alice", "CREATE", "configmaps", namespace="t1", labels={"team": "a"})
    response = post(client, review)["response"]
    assert response["allowed"] is False
    assert response["status"]["code"] == 503
    assert response["status"]["message"] == NOT_SYNCED


class ExplodingLookup(StaticSource):
    """A source whose parent lookup hits a bug (not a ParentUnavailable)."""

    def fetch_parent(self, request: Request) -> dict[str, Any]:
        raise RuntimeError("boom")


class FailingLookup(StaticSource):
    def fetch_parent(self, request: Request) -> dict[str, Any]:
        raise ParentUnavailable(f'could not read pods "{request.name}": HTTP 403')


def _exec_review() -> dict[str, Any]:
    review = make_review(
        "alice", "CONNECT", "pods/exec", namespace="t1", name="web-0", kind="PodExecOptions"
    )
    review["request"]["object"] = {"kind": "PodExecOptions", "command": ["sh"]}
    return review


def test_internal_error_denies_with_200_not_5xx() -> None:
    settings = Settings(rbac_dir=EXAMPLES)
    source = ExplodingLookup(EXAMPLES, settings.compiler)
    source.start()
    response = post(create_app(settings, source).test_client(), _exec_review())["response"]
    assert response["allowed"] is False
    assert response["status"]["code"] == 500


def test_parent_lookup_failure_names_what_could_not_be_read() -> None:
    settings = Settings(rbac_dir=EXAMPLES)
    source = FailingLookup(EXAMPLES, settings.compiler)
    source.start()
    response = post(create_app(settings, source).test_client(), _exec_review())["response"]
    assert response["allowed"] is False
    assert 'could not read pods "web-0": HTTP 403' in response["status"]["message"]


def test_one_log_line_per_decision_without_bodies(
    client: FlaskClient, caplog: pytest.LogCaptureFixture
) -> None:
    secret_value = "c3VwZXItc2VjcmV0LXBhc3N3b3Jk"
    review = make_review(
        "bob",
        "CREATE",
        "secrets",
        namespace="t1",
        name="db",
        labels={"team": "a"},
        extra_object={"data": {"password": secret_value}},
    )
    with caplog.at_level(logging.INFO, logger="label_rbac"):
        post(client, review)
    lines = [r for r in caplog.records if r.name == "label_rbac.decisions"]
    assert len(lines) == 1
    record = json.loads(JsonFormatter().format(lines[0]))
    assert record["level"] == "info" and record["time"].endswith("Z")
    assert record["uid"] == review["request"]["uid"]
    assert (record["user"], record["operation"], record["resource"]) == ("bob", "CREATE", "secrets")
    assert (record["namespace"], record["name"], record["allowed"]) == ("t1", "db", False)
    assert record["reason"] == "LabelNotPermitted"
    assert secret_value not in caplog.text
