"""The labels that decide identity loans, through a real API server.

alice (the example tenants' team-a) also holds a Role ``accounts`` that lets her write
ServiceAccounts and request their tokens; its annotation names pods only, so her ServiceAccount
writes have no label limits, but she lends (runs pods as, requests tokens for) only accounts
labeled team=a. A token request is judged by the account's labels, which the webhook reads from
its metadata-only watch; relabelling or deleting an account is judged as lending it.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.kube.cluster import LabelRbacCluster
from tests.kube.controlplane import ADMIN
from tests.kube.support import eventually, install_tenants, obj
from tests.support import binding, role, rule


def accounts_role(namespace: str) -> list[dict[str, Any]]:
    accounts = role(
        "accounts",
        namespace,
        [rule("*", "serviceaccounts"), rule("create", "serviceaccounts/token")],
        {"pods": {"team": ["a"]}},
    )
    bound = binding("accounts", "accounts", "User:alice", namespace=namespace)
    return [{"apiVersion": "rbac.authorization.k8s.io/v1", **o} for _, o in (accounts, bound)]


@pytest.fixture
def accounts(kube: LabelRbacCluster, namespace: str) -> str:
    install_tenants(kube, namespace)
    kube.apply(ADMIN, accounts_role(namespace))
    kube.apply(
        ADMIN,
        [
            obj("ServiceAccount", "robot-a", namespace, {"team": "a"}),
            obj("ServiceAccount", "robot-b", namespace, {"team": "b"}),
        ],
    )

    def judged_by_accounts() -> None:  # the webhook has seen the Role and its binding
        done = kube.kubectl("alice", "-n", namespace, "create", "token", "robot-b")
        assert done.returncode != 0 and f"role {namespace}/accounts" in done.stderr, done.stderr

    eventually(judged_by_accounts)
    return namespace


def labels_of(kube: LabelRbacCluster, namespace: str, name: str) -> dict[str, str]:
    _, found = kube.control_plane.request(
        ADMIN, "GET", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}"
    )
    return dict(found["metadata"].get("labels", {}))


@pytest.mark.parametrize(
    ("name", "denial"),
    [
        pytest.param("robot-a", None, id="own-bucket"),
        pytest.param(
            "robot-b",
            'user "alice" may not create serviceaccounts/token "robot-b" in namespace "{ns}": '
            "the existing object's label team=\"b\" is not permitted",
            id="other-bucket",
        ),
    ],
)
def test_token_requests_are_judged_by_the_accounts_labels(
    kube: LabelRbacCluster, accounts: str, name: str, denial: str | None
) -> None:
    done = kube.kubectl("alice", "-n", accounts, "create", "token", name)
    if denial is None:
        assert done.returncode == 0, done.stderr
        assert done.stdout.count(".") == 2  # a JWT
    else:
        assert done.returncode != 0
        assert denial.format(ns=accounts) in done.stderr, done.stderr


def account_denial(verb: str, name: str, version: str, has: str, ns: str) -> str:
    """What alice is told (the tenants' guide: ``AccountNotLent``)."""
    changing = "deleting" if verb == "delete" else "relabelling"
    return (
        f'user "alice" may not {verb} serviceaccounts "{name}" in namespace "{ns}": the account '
        f"as {version} {has}: {changing} a ServiceAccount is judged as lending it, and the user "
        f"may lend only ServiceAccounts labeled team in [a] (role {ns}/accounts)"
    )


@pytest.mark.parametrize(
    ("command", "name", "denial"),
    [
        pytest.param(
            ("label", "serviceaccount", "robot-b", "team=a", "--overwrite"),
            "robot-b",
            ("update", "stored", 'has label team="b"'),
            id="take-another-buckets-account",
        ),
        pytest.param(
            ("label", "serviceaccount", "robot-a", "team=b", "--overwrite"),
            "robot-a",
            ("update", "written", 'has label team="b"'),
            id="give-hers-away",
        ),
        pytest.param(
            ("delete", "serviceaccount", "robot-b"),
            "robot-b",
            ("delete", "stored", 'has label team="b"'),
            id="free-another-buckets-name",
        ),
        pytest.param(
            ("label", "serviceaccount", "robot-a", "tier=web"), "robot-a", None, id="within-hers"
        ),
        pytest.param(
            ("annotate", "serviceaccount", "robot-b", "note=x"), "robot-b", None, id="no-label"
        ),
    ],
)
def test_relabelling_an_account_is_judged_as_lending_it(
    kube: LabelRbacCluster,
    accounts: str,
    command: tuple[str, ...],
    name: str,
    denial: tuple[str, str, str] | None,
) -> None:
    before = labels_of(kube, accounts, name)
    done = kube.kubectl("alice", "-n", accounts, *command)
    if denial is None:
        assert done.returncode == 0, done.stderr
        return
    assert done.returncode != 0
    verb, version, has = denial
    assert account_denial(verb, name, version, has, accounts) in done.stderr, done.stderr
    assert labels_of(kube, accounts, name) == before
    # The account she could not take is still not hers to lend.
    token = kube.kubectl("alice", "-n", accounts, "create", "token", "robot-b")
    assert token.returncode != 0 and 'label team="b" is not permitted' in token.stderr
