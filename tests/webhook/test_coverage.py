"""The fence through POST /validate: while the webhook registration still leaves a resource out,
an RBAC write handing out a role that restricts it is refused with a retryable message; once the
registration covers it, the same write passes. Reviews are AdmissionReviews as the API server
sends them for RoleBinding and Role writes, by an administrator whose own access is unrestricted
(so the escalation check has nothing to say)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient

from app.engine.context import Registration
from app.engine.rbac import RBAC_GROUP, RoleRef
from app.source.static import StaticSource
from tests.support import binding, make_review, role, rule, served

WIDGETS = "widgets.example.com"
WRITES = "create update patch delete"
TEAM_A = {WIDGETS: {"team": ["a"]}}
RBAC = [
    role("admin", "t1", [rule("*", "*", "*")]),
    binding("admin", "admin", "User:admin", namespace="t1"),
    role("widgets-a", "t1", [rule(WRITES, "widgets", "example.com")], TEAM_A),
    # Bound before the role exists: a role created later under that name is bound at once.
    binding("early", "future", "User:erin", namespace="t1"),
]
REFERRED = frozenset({RoleRef("t1", "admin"), RoleRef("t1", "future")})


def pending(unjudged: frozenset[str]) -> type[StaticSource]:
    class Registered(StaticSource):
        """RBAC from files; the registration as the live configuration would say it."""

        def registration(self) -> Registration:
            return Registration(unjudged, REFERRED)

    return Registered


@pytest.fixture(
    params=[
        pytest.param((pending(frozenset({WIDGETS, "configmaps"})), True), id="not-yet-covered"),
        pytest.param((pending(frozenset({"configmaps"})), False), id="covered"),
        pytest.param((StaticSource, False), id="static-mode"),
    ]
)
def setup(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[FlaskClient, bool]]:
    source, fenced = request.param
    with served(tmp_path, [obj for _, obj in RBAC], source) as client:
        yield client, fenced


def review(operation: str, obj: tuple[str, dict[str, Any]], old: Any = None) -> dict[str, Any]:
    kind, body = obj
    resource = {"Role": "roles", "RoleBinding": "rolebindings"}[kind]
    document = make_review(
        "admin",
        operation,
        f"{resource}.{RBAC_GROUP}",
        namespace="t1",
        name=body["metadata"]["name"],
        kind=kind,
    )
    document["request"]["object"] = {**body, "apiVersion": f"{RBAC_GROUP}/v1"}
    if old is not None:
        document["request"]["oldObject"] = {**old[1], "apiVersion": f"{RBAC_GROUP}/v1"}
    return document


def verdict(client: FlaskClient, document: dict[str, Any]) -> dict[str, Any]:
    response = client.post("/validate", json=document)
    assert response.status_code == 200
    return response.get_json()["response"]


WIDENING = [
    pytest.param(
        review("CREATE", binding("bob", "widgets-a", "User:bob", namespace="t1")),
        "retry in a moment",
        id="binding-hands-out-the-restricted-role",
    ),
    pytest.param(
        review("CREATE", role("future", "t1", [rule(WRITES, "widgets", "example.com")], TEAM_A)),
        "or add the annotation entry first and grant the resource in a later write",
        id="role-created-already-bound",
    ),
    pytest.param(
        review(
            "UPDATE",
            role("future", "t1", [rule(WRITES, "widgets", "example.com")], TEAM_A),
            role("future", "t1", [rule("get", "configmaps")], TEAM_A),
        ),
        "or add the annotation entry first and grant the resource in a later write",
        id="bound-role-starts-granting",
    ),
]


@pytest.mark.parametrize(("document", "advice"), WIDENING)
def test_widening_writes_wait_for_the_registration(
    setup: tuple[FlaskClient, bool], document: dict[str, Any], advice: str
) -> None:
    client, fenced = setup
    answer = verdict(client, document)
    assert answer["allowed"] is not fenced, answer
    if fenced:
        assert answer["status"]["code"] == 403
        message = answer["status"]["message"]
        assert f'resource "{WIDGETS}" restricted by role t1/' in message
        assert "is not yet judged by label-rbac everywhere" in message
        assert advice in message


NARROWING = [
    pytest.param(
        review(
            "UPDATE",
            role("future", "t1", [rule(WRITES, "widgets", "example.com")], TEAM_A),
            role("future", "t1", [rule(WRITES, "widgets", "example.com")]),
        ),
        id="annotation-added-to-a-role-granting-already",
    ),
    pytest.param(
        review("CREATE", role("future", "t1", [rule("get", "configmaps")], TEAM_A)),
        id="annotation-entry-before-the-grant",
    ),
    pytest.param(
        review("CREATE", role("unbound", "t1", [rule(WRITES, "widgets", "example.com")], TEAM_A)),
        id="role-no-binding-refers-to",
    ),
    pytest.param(
        review("CREATE", binding("bob", "admin", "User:bob", namespace="t1")),
        id="binding-to-an-unrestricted-role",
    ),
]


@pytest.mark.parametrize("document", NARROWING)
def test_writes_that_widen_nothing_are_never_fenced(
    setup: tuple[FlaskClient, bool], document: dict[str, Any]
) -> None:
    client, _ = setup
    answer = verdict(client, document)
    assert answer["allowed"] is True, answer
