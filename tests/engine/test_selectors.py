"""Selector confinement: the label values a selector confines a key to, and the roles it fits."""

from __future__ import annotations

from typing import Any

import pytest

from app.engine.labels import find_grants
from app.engine.model import Resource, UserInfo
from app.engine.selectors import (
    DOES_NOT_EXIST,
    EXISTS,
    IN,
    NOT_IN,
    Requirement,
    SelectorError,
    confinement,
    from_label_selector,
)
from tests.support import binding, role, rule, snapshot

ALICE = UserInfo("alice", ("tenants",))
CONFIGMAPS = Resource("", "configmaps")


def req(key: str, op: str, *values: str) -> Requirement:
    return Requirement(key, op, values)


@pytest.mark.parametrize(
    ("selector", "confined"),
    [
        pytest.param(None, None, id="no-selector"),
        pytest.param((), None, id="empty-selector"),
        pytest.param((req("team", IN, "a"),), {"a"}, id="equals"),
        pytest.param((req("team", IN, "a", "b"),), {"a", "b"}, id="in-two"),
        pytest.param((req("team", IN, "a", "b"), req("team", IN, "b")), {"b"}, id="in-intersect"),
        pytest.param((req("team", IN, "a"), req("team", IN, "b")), set(), id="contradiction"),
        pytest.param((req("team", NOT_IN, "b"),), None, id="notin-confines-nothing"),
        pytest.param((req("team", EXISTS),), None, id="exists-confines-nothing"),
        pytest.param((req("team", DOES_NOT_EXIST),), {None}, id="does-not-exist-is-absent"),
        pytest.param(
            (req("team", EXISTS), req("team", DOES_NOT_EXIST)), set(), id="exists-and-not"
        ),
        pytest.param((req("team", IN, "a"), req("team", DOES_NOT_EXIST)), set(), id="in-and-not"),
        pytest.param(
            (req("team", IN, "a"), req("team", NOT_IN, "a")), {"a"}, id="notin-no-narrowing"
        ),
        pytest.param((req("app", IN, "x"),), None, id="other-key"),
    ],
)
def test_confinement(selector: Any, confined: set[str | None] | None) -> None:
    found = confinement(selector, "team")
    assert (None if found is None else set(found)) == confined


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        pytest.param(None, (), id="none"),
        pytest.param({"matchLabels": {"team": "a"}}, (req("team", IN, "a"),), id="match-labels"),
        pytest.param({"team": "a"}, (req("team", IN, "a"),), id="plain-map"),
        pytest.param(
            {"matchExpressions": [{"key": "team", "operator": "In", "values": ["a", "b"]}]},
            (req("team", IN, "a", "b"),),
            id="expressions",
        ),
        pytest.param(
            {"matchLabels": {"app": "x"}, "matchExpressions": [{"key": "t", "operator": "Exists"}]},
            (req("app", IN, "x"), req("t", EXISTS)),
            id="both",
        ),
    ],
)
def test_from_label_selector(obj: Any, expected: tuple[Requirement, ...]) -> None:
    assert from_label_selector(obj) == expected


@pytest.mark.parametrize(
    "obj",
    [
        pytest.param([], id="not-an-object"),
        pytest.param({"matchLabels": {"team": 1}}, id="non-string-value"),
        pytest.param({"matchExpressions": {}}, id="expressions-not-a-list"),
        pytest.param({"matchExpressions": ["x"]}, id="expression-not-an-object"),
        pytest.param({"matchExpressions": [{"key": "t", "operator": "Like"}]}, id="bad-operator"),
        pytest.param(
            {"matchExpressions": [{"key": "t", "operator": "In"}]}, id="in-without-values"
        ),
        pytest.param(
            {"matchExpressions": [{"key": "t", "operator": "Exists", "values": ["a"]}]},
            id="exists-with-values",
        ),
        pytest.param({"matchExpressions": [{"operator": "Exists"}]}, id="no-key"),
    ],
)
def test_malformed_selectors_are_refused(obj: Any) -> None:
    with pytest.raises(SelectorError):
        from_label_selector(obj)


TEAM_A = role(
    "team-a", "t1", rules=[rule("*", "configmaps")], permissions={"configmaps": {"team": ["a"]}}
)
STAGING = role(
    "staging",
    "t1",
    rules=[rule("list", "configmaps")],
    permissions={"configmaps": {"team": ["b"], "env": ["staging-*"]}},
)
BINDINGS = (
    binding("a", "team-a", "Group:tenants", namespace="t1"),
    binding("s", "staging", "Group:tenants", namespace="t1"),
)


@pytest.mark.parametrize(
    ("selector", "allow_unlabeled", "passing"),
    [
        pytest.param(None, False, [], id="no-selector"),
        pytest.param((req("team", IN, "a"),), False, ["team-a"], id="own-bucket"),
        pytest.param((req("team", IN, "a", "b"),), False, [], id="reaches-other-bucket"),
        pytest.param((req("team", IN, "b"),), False, [], id="second-key-unconfined"),
        pytest.param(
            (req("team", IN, "b"), req("env", IN, "staging-1", "staging-2")),
            False,
            ["staging"],
            id="value-glob-permits-literals",
        ),
        pytest.param(
            (req("team", IN, "b"), req("env", IN, "prod")), False, [], id="value-glob-refuses"
        ),
        pytest.param((req("team", DOES_NOT_EXIST),), False, [], id="unlabeled-refused"),
        pytest.param((req("team", DOES_NOT_EXIST),), True, ["team-a"], id="unlabeled-tolerated"),
        pytest.param((req("team", IN, "a"), req("team", IN, "b")), False, ["team-a"], id="empty"),
    ],
)
def test_grants_within_selector(selector: Any, allow_unlabeled: bool, passing: list[str]) -> None:
    snap = snapshot(TEAM_A, STAGING, *BINDINGS)
    grants = find_grants(snap, ALICE, "t1", ("list",), CONFIGMAPS, "")
    assert [r.ref.name for r, _ in grants.within(selector, allow_unlabeled)] == passing
