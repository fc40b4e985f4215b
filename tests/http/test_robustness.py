"""Malformed input never yields a 5xx or an allow it should not: every recorded review, mutated.

Each field of every recorded request (to a bounded depth) is replaced by values of the wrong
type; the webhook must answer 400 (not an AdmissionReview) or 200 with a decision, and a
mutation must never turn a recorded denial into an allow by breaking the envelope.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
from flask.testing import FlaskClient

from tests.support import REVIEWS, load_review

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
