"""The escalation check through a real API server (README "Escalation check").

dana (group t1-admins) holds Role team-a and may write Roles and RoleBindings in the namespace
(Role tenant-admin): RBAC lets her grant what she holds, label-rbac only within team=a.
"""

from __future__ import annotations

import json

import pytest
import yaml

from tests.kube.cluster import LabelRbacCluster
from tests.kube.support import install_tenants, obj


@pytest.fixture
def tenants(kube: LabelRbacCluster, namespace: str) -> str:
    install_tenants(kube, namespace)
    return namespace


def role(ns: str, name: str, permissions: object | None) -> dict[str, object]:
    annotations = (
        {} if permissions is None else {"labelrbac.io/permissions": json.dumps(permissions)}
    )
    document = obj(
        "Role",
        name,
        ns,
        api_version="rbac.authorization.k8s.io/v1",
        rules=[{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create", "update"]}],
    )
    document["metadata"]["annotations"] = annotations  # type: ignore[index]
    return document


def binding(ns: str, role_name: str, user: str) -> dict[str, object]:
    return obj(
        "RoleBinding",
        f"{role_name}-{user}",
        ns,
        api_version="rbac.authorization.k8s.io/v1",
        subjects=[{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": user}],
        roleRef={"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role_name},
    )


def create_as_dana(kube: LabelRbacCluster, document: dict[str, object]) -> tuple[int, str]:
    done = kube.kubectl("dana", "create", "-f", "-", input=yaml.safe_dump(document))
    return done.returncode, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("permissions", "allowed", "message"),
    [
        pytest.param({"configmaps": {"team": ["a"]}}, True,
                     "role.rbac.authorization.k8s.io/r created", id="within-her-bucket"),
        pytest.param({"configmaps": {"team": ["b"]}}, False,
                     "their own access is limited to team in [a]", id="another-bucket"),
        pytest.param(None, False,
                     'user "dana" may not grant configmaps without a label restriction: their own '
                     'access is limited to team in [a] (escalation check; holding the "escalate" '
                     "verb on roles bypasses it)", id="unrestricted"),
    ],
)  # fmt: skip
def test_a_role_may_grant_only_within_the_authors_bucket(
    kube: LabelRbacCluster, tenants: str, permissions: object, allowed: bool, message: str
) -> None:
    status, output = create_as_dana(kube, role(tenants, "r", permissions))
    assert (status == 0) is allowed, output
    assert message in output
    if not allowed:
        assert 'admission webhook "rbac.labelrbac.io" denied the request' in output


@pytest.mark.parametrize(
    ("role_name", "allowed", "message"),
    [
        pytest.param("team-a", True, "rolebinding.rbac.authorization.k8s.io/team-a-carol created",
                     id="her-own-role"),
        pytest.param("team-b", False, "their own access is limited to team in [a]",
                     id="another-teams-role"),
    ],
)  # fmt: skip
def test_a_binding_may_hand_out_only_the_authors_bucket(
    kube: LabelRbacCluster, tenants: str, role_name: str, allowed: bool, message: str
) -> None:
    status, output = create_as_dana(kube, binding(tenants, role_name, "carol"))
    assert (status == 0) is allowed, output
    assert message in output


def test_widening_an_existing_role_is_refused_like_a_create(
    kube: LabelRbacCluster, tenants: str
) -> None:
    assert create_as_dana(kube, role(tenants, "r", {"configmaps": {"team": ["a"]}}))[0] == 0
    patch = {
        "metadata": {
            "annotations": {"labelrbac.io/permissions": '{"configmaps": {"team": ["a", "b"]}}'}
        }
    }
    done = kube.kubectl("dana", "-n", tenants, "patch", "role", "r", "-p", json.dumps(patch))
    assert done.returncode != 0
    assert "their own access is limited to team in [a]" in done.stderr
