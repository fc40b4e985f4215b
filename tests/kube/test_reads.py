"""Label-scoped reads through a real API server (README "Reads: the authorization webhook").

The shipped AuthorizationConfiguration puts label-rbac between the Node authorizer and RBAC:
alice's reads of configmaps in a namespace she shares with bob are narrowed to team=a.
"""

from __future__ import annotations

import pytest

from tests.kube.cluster import LabelRbacCluster
from tests.kube.controlplane import ADMIN
from tests.kube.support import install_tenants, obj


@pytest.fixture
def shared(kube: LabelRbacCluster, namespace: str) -> str:
    """alice's and bob's configmaps side by side."""
    install_tenants(kube, namespace)
    kube.apply(
        ADMIN,
        [obj("ConfigMap", f"c-{team}", namespace, {"team": team}) for team in ("a", "b")],
    )
    return namespace


def test_a_list_within_the_bucket_shows_the_buckets_objects(
    kube: LabelRbacCluster, shared: str
) -> None:
    done = kube.kubectl("alice", "-n", shared, "get", "configmaps", "-l", "team=a", "-o", "name")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["configmap/c-a"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(
            (),
            'may list configmaps in namespace "{ns}" only with a label selector within team '
            "in [a] (add -l team=a)",
            id="no-selector",
        ),
        pytest.param(
            ("-l", "team=b"),
            'may list configmaps in namespace "{ns}" only with a label selector within team in [a]',
            id="other-bucket",
        ),
        pytest.param(
            ("-l", "team in (a,b)"),
            'may list configmaps in namespace "{ns}" only with a label selector within team in [a]',
            id="wider-than-the-bucket",
        ),
    ],
)
def test_a_list_wider_than_the_bucket_is_forbidden(
    kube: LabelRbacCluster, shared: str, args: tuple[str, ...], message: str
) -> None:
    done = kube.kubectl("alice", "-n", shared, "get", "configmaps", *args)
    assert done.returncode != 0
    assert 'Error from server (Forbidden): configmaps is forbidden: User "alice"' in done.stderr
    assert message.format(ns=shared) in done.stderr


def test_a_get_by_name_is_judged_by_the_objects_labels(kube: LabelRbacCluster, shared: str) -> None:
    own = kube.kubectl("alice", "-n", shared, "get", "configmap", "c-a", "-o", "name")
    assert own.returncode == 0, own.stderr
    other = kube.kubectl("alice", "-n", shared, "get", "configmap", "c-b")
    assert other.returncode != 0
    assert (
        f'user "alice" may not get configmaps "c-b" in namespace "{shared}": the existing '
        'object\'s label team="b" is not permitted (role ' in other.stderr
    )
    assert "c-b" in kube.kubectl("bob", "-n", shared, "get", "configmap", "c-b").stdout


@pytest.mark.parametrize(
    ("user", "args", "answer"),
    [
        pytest.param("alice", ("get", "configmaps/c-a"), "yes", id="own-object"),
        pytest.param(
            "alice",
            ("get", "configmaps/c-b"),
            'no - user "alice" may not get configmaps "c-b" in namespace "{ns}": the existing '
            'object\'s label team="b" is not permitted (role {ns}/team-a allows team in [a])',
            id="other-buckets-object",
        ),
        pytest.param(
            "alice",
            ("list", "configmaps"),
            'no - user "alice" may list configmaps in namespace "{ns}" only with a label '
            "selector within team in [a] (add -l team=a)",
            id="list-without-selector",
        ),
        pytest.param("bob", ("get", "configmaps/c-b"), "yes", id="bob-own-object"),
        pytest.param("alice", ("create", "configmaps"), "yes", id="writes-left-to-admission"),
    ],
)
def test_auth_can_i_asks_the_same_chain(
    kube: LabelRbacCluster, shared: str, user: str, args: tuple[str, ...], answer: str
) -> None:
    """SelfSubjectAccessReviews go through the same authorizers; kubectl prints the reason."""
    done = kube.kubectl(user, "-n", shared, "auth", "can-i", *args)
    assert done.stdout.strip() == answer.format(ns=shared), done.stdout + done.stderr


def test_deleting_by_selector_stays_in_the_bucket(kube: LabelRbacCluster, shared: str) -> None:
    """``kubectl delete -l`` lists with the selector, then deletes what it found."""
    everything = kube.kubectl("alice", "-n", shared, "delete", "configmaps", "--all")
    assert everything.returncode != 0
    assert "only with a label selector within team in [a] (add -l team=a)" in everything.stderr
    own = kube.kubectl("alice", "-n", shared, "delete", "configmaps", "-l", "team=a")
    assert own.returncode == 0, own.stderr
    assert own.stdout.split("\n")[0] == 'configmap "c-a" deleted'
    left = kube.kubectl(ADMIN, "-n", shared, "get", "configmaps", "-o", "name")
    assert "configmap/c-b" in left.stdout.split()
    assert "configmap/c-a" not in left.stdout.split()
