"""Malformed and hostile input never yields a 5xx or an allow it should not.

Each field of every recorded request (to a bounded depth) is replaced by values of the wrong
type; the webhook must answer 400 (not an AdmissionReview) or 200 with a decision, and a
mutation must never turn a recorded denial into an allow by breaking the envelope. JSON nested as
deep as the API server allows is decided like any other review.
"""

from __future__ import annotations

import copy
import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from flask.testing import FlaskClient

from app.deepjson import API_SERVER_MAX_DEPTH
from app.engine.policy import DEFAULT_ANNOTATION_KEY
from app.engine.rbac import Compiler, Snapshot
from app.settings import Settings
from app.source.static import StaticSource
from app.webhook.server import HEAVY_BYTES, MAX_JSON_VALUES, create_app
from app.webhook.wire import MAX_MESSAGE_CHARS
from tests.conftest import EXAMPLES
from tests.support import REVIEWS, load_review, make_review, role, rule

WRONG_VALUES: tuple[Any, ...] = (None, 7, "x", [None], {"": None})


def paths(value: Any, prefix: tuple[Any, ...] = (), depth: int = 3) -> Iterator[tuple[Any, ...]]:
    """Every key path into ``value`` down to ``depth`` (list items: the first one only)."""
    if depth == 0:
        return
    if isinstance(value, dict):
        for key, child in value.items():
            yield (*prefix, key)
            yield from paths(child, (*prefix, key), depth - 1)
    elif isinstance(value, list) and value:
        yield (*prefix, 0)
        yield from paths(value[0], (*prefix, 0), depth - 1)


def mutated(review: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    copied = copy.deepcopy(review)
    target = copied
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return copied


@pytest.mark.parametrize("name", sorted(p.stem for p in REVIEWS.glob("*.json")))
def test_mutated_reviews_never_fail_open_or_5xx(client: FlaskClient, name: str) -> None:
    review = load_review(name)
    baseline = client.post("/validate", json=review).get_json()["response"]["allowed"]
    for path in paths(review["request"], ("request",)):
        for value in WRONG_VALUES:
            response = client.post("/validate", json=mutated(review, path, value))
            assert response.status_code in (200, 400), (path, value, response.status_code)
            if response.status_code == 200:
                body = response.get_json()
                # Handled on purpose, not by the last-resort "internal error" denial.
                assert body["response"].get("status", {}).get("code") != 500, (path, value)
                assert body["response"]["uid"] == (
                    review["request"]["uid"] if path != ("request", "uid") else value
                )
                if not baseline and path[:2] != ("request", "userInfo"):
                    # Breaking part of a denied request must not make it pass, except by
                    # changing who asks (a different user may well be allowed).
                    assert body["response"]["allowed"] is False or _changes_subject(path), path


def _changes_subject(path: tuple[Any, ...]) -> bool:
    """Mutations that legitimately change what is being decided (resource, object, verb...)."""
    return len(path) >= 2 and path[1] in {
        "resource", "subResource", "operation", "namespace", "name", "object", "oldObject", "kind",
    }  # fmt: skip


def _nested(depth: int) -> str:
    return '{"a":' * depth + "{}" + "}" * depth


@pytest.mark.parametrize(
    ("user", "allowed"),
    [pytest.param("alice", True, id="permitted"), pytest.param("bob", False, id="denied")],
)
def test_objects_nested_as_deep_as_the_api_server_allows_are_decided(
    client: FlaskClient, user: str, allowed: bool
) -> None:
    labels = {"team": "a"}
    review = make_review(
        user, "UPDATE", "configmaps", namespace="t1", labels=labels, old_labels=labels
    )
    review["request"]["object"]["spec"] = review["request"]["oldObject"]["spec"] = "DEEP"
    body = json.dumps(review).replace('"DEEP"', _nested(API_SERVER_MAX_DEPTH))
    response = client.post("/validate", data=body, content_type="application/json")
    assert response.status_code == 200
    assert response.get_json()["response"]["allowed"] is allowed
    # What the request path then walks recursively copes with it too.
    document = json.loads(body)
    assert copy.deepcopy(document) == document
    assert json.loads(json.dumps(document)) == document


def test_nesting_beyond_any_api_server_is_400(client: FlaskClient) -> None:
    review = make_review("alice", "CREATE", "configmaps", namespace="t1", labels={"team": "a"})
    review["request"]["object"]["spec"] = "DEEP"
    body = json.dumps(review).replace('"DEEP"', _nested(100_000))
    response = client.post("/validate", data=body, content_type="application/json")
    assert response.status_code == 400
    assert "nested deeper than" in response.get_json()["error"]


def test_a_deeply_nested_annotation_is_invalid_with_a_bounded_message(client: FlaskClient) -> None:
    annotation = "[" * 20_000 + "]" * 20_000
    review = make_review("alice", "CREATE", "roles.rbac.authorization.k8s.io", namespace="t1",
                         name="deep", labels={}, kind="Role")  # fmt: skip
    review["request"]["object"]["metadata"]["annotations"] = {DEFAULT_ANNOTATION_KEY: annotation}
    status = client.post("/validate", json=review).get_json()["response"]["status"]
    assert status["code"] == 422
    assert status["message"].startswith('Role "deep" is invalid: invalid labelrbac.io/permissions')
    assert len(status["message"]) <= MAX_MESSAGE_CHARS
    assert status["message"].endswith("more characters)")


def test_a_too_deep_annotation_grants_nothing() -> None:
    compiled = Compiler((DEFAULT_ANNOTATION_KEY,)).role(
        role("deep", "t1", [rule("*", "configmaps")], "[" * 200_000 + "]" * 200_000)[1], "Role"
    )
    assert compiled.error is not None and "nested too deeply" in compiled.error


def test_a_body_with_more_json_values_than_any_review_is_413(client: FlaskClient) -> None:
    body = b"[" + b"0," * MAX_JSON_VALUES + b"0]"
    response = client.post("/validate", data=body, content_type="application/json")
    assert response.status_code == 413
    assert response.get_json()["error"] == (
        f"request body has more than {MAX_JSON_VALUES} JSON values"
    )


class _Overlap(StaticSource):
    """Counts how many requests are being decided at once."""

    def __init__(self) -> None:
        super().__init__(EXAMPLES, Settings().compiler)
        self.lock = threading.Lock()
        self.now = self.most = 0

    def snapshot(self) -> Snapshot | None:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        time.sleep(0.2)
        with self.lock:
            self.now -= 1
        return super().snapshot()


@pytest.mark.parametrize(
    ("padding", "parallel"),
    [pytest.param(10, True, id="small-bodies-in-parallel"),
     pytest.param(HEAVY_BYTES, False, id="large-bodies-one-at-a-time")],
)  # fmt: skip
def test_large_bodies_are_decided_one_at_a_time(padding: int, parallel: bool) -> None:
    source = _Overlap()
    source.start()
    app = create_app(Settings(rbac_dir=EXAMPLES), source)
    review = make_review("alice", "CREATE", "configmaps", namespace="t1", labels={"team": "a"},
                         extra_object={"data": {"pad": "x" * padding}})  # fmt: skip
    body = json.dumps(review).encode()

    def post() -> int:
        return app.test_client().post("/validate", data=body).status_code

    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(lambda _: post(), range(4))) == [200] * 4
    assert (source.most > 1) is parallel, source.most
