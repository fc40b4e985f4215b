"""Hostile globs through the whole decision path: a tenant's annotation cannot stall a worker.

A namespace admin may legitimately write a Role whose annotation holds the worst globs the schema
allows (an extra key only narrows her grant), and anyone may send labels of the longest legal
length. Every review below goes through /validate as the API server would send it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient

from app.engine.policy import DEFAULT_ANNOTATION_KEY, MAX_WILDCARDS
from app.engine.rbac import RBAC_GROUP
from tests.support import binding, make_review, role, rule, served

# The classic near miss, schema-legal: every star may take any share of a run of "a".
STARS = "*a" * (MAX_WILDCARDS - 1) + "*b"
QUESTIONS = "*a?" * (MAX_WILDCARDS // 2) + "b"
NEAR_MISS = "a" * 63
HIT = "a" * 62 + "b"
# Resource patterns at their length limits, as hostile as the wildcard bound allows.
RESOURCE = ("*s" * (MAX_WILDCARDS // 2) + "s" * 63)[:63]
GROUP = ("*.e" * (MAX_WILDCARDS // 2) + ".e" * 200)[:253]


@pytest.fixture
def client(tmp_path: Path) -> Iterator[FlaskClient]:
    objects = [
        role(
            "hostile",
            "t1",
            rules=[
                rule("*", "configmaps"),
                rule("create update", "roles", RBAC_GROUP),
            ],
            permissions={
                "configmaps": {"team": [STARS, QUESTIONS]},
                f"{RESOURCE}.{GROUP}": {"team": [QUESTIONS]},
            },
        ),
        binding("hostile", "hostile", "User:mallory", namespace="t1"),
    ]
    with served(tmp_path, [obj for _, obj in objects]) as client:
        yield client


def decide(client: FlaskClient, review: dict[str, Any]) -> dict[str, Any]:
    response = client.post("/validate", json=review)
    assert response.status_code == 200, response.get_data(as_text=True)
    return response.get_json()["response"]


def role_review(annotation: str) -> dict[str, Any]:
    obj = {
        "metadata": {
            "name": "narrower",
            "namespace": "t1",
            "annotations": {DEFAULT_ANNOTATION_KEY: annotation},
        },
        "rules": [rule("create", "configmaps")],
    }
    return make_review(
        "mallory",
        "CREATE",
        f"roles.{RBAC_GROUP}",
        namespace="t1",
        name="narrower",
        kind="Role",
        labels={},
        extra_object=obj,
    )


def test_hostile_globs_are_decided_correctly_and_fast(client: FlaskClient) -> None:
    def configmap(value: str) -> dict[str, Any]:
        return make_review(
            "mallory", "CREATE", "configmaps", namespace="t1", labels={"team": value}
        )

    # A narrower copy of her own hostile globs: the escalation check must compare them.
    narrower = json.dumps({"configmaps": {"team": [STARS[:-1] + "ab", QUESTIONS], "x": ["y"]}})
    wider = json.dumps({"configmaps": {"team": ["*a*"]}})
    too_long = json.dumps({"*" * 10 + "s" * 10_000: {"team": ["a"]}})

    started = time.process_time()
    for _ in range(10):
        assert decide(client, configmap(NEAR_MISS))["allowed"] is False
        assert decide(client, configmap(HIT))["allowed"] is True
        assert decide(client, role_review(narrower))["allowed"] is True
        assert decide(client, role_review(wider))["allowed"] is False
        refused = decide(client, role_review(too_long))
        assert refused["allowed"] is False and refused["status"]["code"] == 422
    elapsed = time.process_time() - started
    # 50 reviews; the regular expressions these globs used to become would not finish one.
    assert elapsed < 5.0, f"50 reviews took {elapsed:.2f}s"
