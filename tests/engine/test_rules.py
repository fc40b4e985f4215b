"""``rules.allowances``: a user's rules in a namespace, each with the labels its grant is held to
(what ``check --list`` prints)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.engine.kinds import snapshot_from_objects
from app.engine.model import Resource, UserInfo
from app.engine.policy import resource_pattern
from app.engine.rbac import Compiler
from app.engine.rules import allowances

COMPILER = Compiler(("labelrbac.io/permissions",))


def role(rules: list[dict[str, Any]], permissions: object = None, **annotations: str) -> Any:
    if permissions is not None:
        annotations["labelrbac.io/permissions"] = json.dumps(permissions)
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "r", "namespace": "t1", "annotations": annotations},
        "rules": rules,
    }  # fmt: skip


BINDING = {
    "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
    "metadata": {"name": "b", "namespace": "t1"},
    "subjects": [{"kind": "User", "name": "u", "apiGroup": "rbac.authorization.k8s.io"}],
    "roleRef": {"kind": "Role", "name": "r", "apiGroup": "rbac.authorization.k8s.io"},
}  # fmt: skip


def rule(verbs: list[str], resources: list[str], groups: tuple[str, ...] = ("",)) -> Any:
    return {"apiGroups": list(groups), "resources": resources, "verbs": verbs}


def rows(role_object: Any, unrestricted: str = "", namespace: str = "t1") -> set[tuple[str, ...]]:
    snapshot = snapshot_from_objects([("Role", role_object), ("RoleBinding", BINDING)], COMPILER)
    free = [resource_pattern(unrestricted)] if unrestricted else []

    def reads_unrestricted(resource: Resource) -> bool:
        return any(entry.rank(resource) for entry in free)

    found = allowances(snapshot, UserInfo("u"), namespace, reads_unrestricted)
    return {(a.resource, " ".join(a.verbs), a.limits) for a in found}


TEAM_A = {"configmaps": {"team": ["a"]}}


@pytest.mark.parametrize(
    ("role_object", "unrestricted", "expected"),
    [
        pytest.param(role([rule(["get", "create"], ["configmaps"])]), "",
                     {("configmaps", "create get", "any")}, id="no-annotation"),
        pytest.param(role([rule(["get", "create"], ["configmaps", "secrets"])], TEAM_A), "",
                     {("configmaps", "create get", "team in [a]"),
                      ("secrets", "create get", "any")}, id="entry-per-resource"),
        pytest.param(role([rule(["get", "bind", "use", "frobnicate"], ["configmaps"])], TEAM_A),
                     "", {("configmaps", "get", "team in [a]"),
                          ("configmaps", "bind frobnicate use", "any (not label-scoped)")},
                     id="verbs-no-label-narrows"),
        pytest.param(role([rule(["get", "list", "update"], ["configmaps"])], TEAM_A),
                     "configmaps", {("configmaps", "update", "team in [a]"),
                                    ("configmaps", "get list", "any (not label-scoped)")},
                     id="unrestricted-reads"),
        pytest.param(role([rule(["*"], ["*"], ("*",))], TEAM_A), "",
                     {("*.*", "*", "configmaps: team in [a]; other resources: any")},
                     id="wildcard"),
        pytest.param(role([rule(["*"], ["*"], ("*",))], {"*": {"team": ["a"]}}), "",
                     {("*.*", "*", "team in [a]")}, id="wildcard-universal-entry"),
        pytest.param(role([rule(["create"], ["pods/exec"])], {"pods": {"team": ["a"]}}), "",
                     {("pods/exec", "create", "team in [a]")}, id="subresource"),
        pytest.param(role([rule(["get"], ["deployments"], ("apps",))],
                          {"deployments.apps": {"tier": ["web*"]}}), "",
                     {("deployments.apps", "get", "tier in [web*]")}, id="group"),
        pytest.param(role([rule(["create"], ["configmaps"])], "not json"), "",
                     {("configmaps", "create", "none: role t1/r grants nothing here")},
                     id="invalid-annotation"),
    ],
)  # fmt: skip
def test_allowances(role_object: Any, unrestricted: str, expected: set[tuple[str, ...]]) -> None:
    found = rows(role_object, unrestricted)
    # An invalid annotation's message is long: compare up to the error itself.
    short = {(r, v, lim.split(" (")[0] if lim.startswith("none") else lim) for r, v, lim in found}
    assert short == expected


def test_only_the_namespaces_bindings_count() -> None:
    assert rows(role([rule(["get"], ["configmaps"])]), namespace="t2") == set()


def test_system_masters_may_do_everything() -> None:
    snapshot = snapshot_from_objects([], COMPILER)
    found = allowances(snapshot, UserInfo("root", ("system:masters",)), "t1", lambda _: False)
    assert [(a.resource, a.verbs, a.limits, a.role) for a in found] == [
        ("*.*", ("*",), "any (not label-scoped)", None)
    ]
