"""The labels that decide access to something else, through a real API server.

alice (the example tenants' team-a) also holds a Role ``accounts`` that lets her write
ServiceAccounts and request their tokens; its annotation names pods only, so her ServiceAccount
writes have no label limits, but she lends (runs pods as, requests tokens for) only accounts
labeled team=a. A token request is judged by the account's labels, which the webhook reads from
its metadata-only watch; relabelling or deleting an account is judged as lending it. A pod's
labels decide ``pods/exec`` too: relabelling one is judged by that entry as well.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from tests.kube.cluster import LabelRbacCluster
from tests.kube.controlplane import ADMIN
from tests.kube.support import eventually, install_tenants, obj
from tests.support import GHOST_OWNER as GHOST
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
            'the existing object\'s label team="b" is not permitted',
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


def owner_write(kind: str, name: str, namespace: str) -> tuple[tuple[str, ...], str | None]:
    """alice's write setting ``GHOST`` as the owner of ServiceAccount ``name``: kubectl's
    arguments and its standard input."""
    patch = ("-n", namespace, "patch", "serviceaccount", name, "--type", kind, "-p")
    if kind == "merge":
        return (*patch, json.dumps({"metadata": {"ownerReferences": [GHOST]}})), None
    if kind == "json":
        op = {"op": "add", "path": "/metadata/ownerReferences", "value": [GHOST]}
        return (*patch, json.dumps([op])), None
    applied = obj("ServiceAccount", name, namespace)
    applied["metadata"]["ownerReferences"] = [GHOST]
    args = ("-n", namespace, "apply", "--server-side", "--field-manager", "alice", "-f", "-")
    return args, yaml.safe_dump(applied)


def owners_of(kube: LabelRbacCluster, namespace: str, name: str) -> list[dict[str, Any]]:
    _, found = kube.control_plane.request(
        ADMIN, "GET", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}"
    )
    return list(found["metadata"].get("ownerReferences", []))


@pytest.mark.parametrize("kind", ["merge", "json", "apply"])
def test_giving_another_buckets_account_an_owner_is_judged_as_deleting_it(
    kube: LabelRbacCluster, accounts: str, kind: str
) -> None:
    """alice writes ServiceAccounts but may not delete robot-b: an owner that does not exist
    would have the garbage collector delete it for her (and free its name, which she could then
    create as hers). Her own account takes the owner."""
    args, stdin = owner_write(kind, "robot-b", accounts)
    done = kube.kubectl("alice", *args, input=stdin)
    assert done.returncode != 0, done.stdout
    assert (
        f'user "alice" may not update serviceaccounts "robot-b" in namespace "{accounts}": it '
        'changes metadata.ownerReferences (adds ConfigMap "ghost" (v1, uid '
        '"00000000-0000-4000-8000-000000000000")), and the garbage collector deletes'
    ) in done.stderr, done.stderr
    assert (
        account_denial("delete", "robot-b", "stored", 'has label team="b"', accounts)
        + (". Leave metadata.ownerReferences as stored")
        in done.stderr
    ), done.stderr
    assert owners_of(kube, accounts, "robot-b") == []
    args, stdin = owner_write(kind, "robot-a", accounts)
    done = kube.kubectl("alice", *args, input=stdin)
    assert done.returncode == 0, done.stderr
    assert [ref["uid"] for ref in owners_of(kube, accounts, "robot-a")] == [GHOST["uid"]]


def test_holding_another_buckets_account_with_a_finalizer_is_refused(
    kube: LabelRbacCluster, accounts: str
) -> None:
    """A finalizer would keep robot-b, and the tokens it authenticates, after its team deletes
    it: only someone who may delete it may hold it."""
    patch = json.dumps({"metadata": {"finalizers": ["example.com/hold"]}})
    for name, refused in (("robot-b", True), ("robot-a", False)):
        done = kube.kubectl(
            "alice", "-n", accounts, "patch", "serviceaccount", name, "--type", "merge", "-p", patch
        )
        assert (done.returncode != 0) is refused, done.stderr
        if refused:
            assert 'metadata.finalizers (adds "example.com/hold")' in done.stderr, done.stderr


def test_relabelling_a_pod_into_the_bucket_it_may_be_exec_into_is_refused(
    kube: LabelRbacCluster, namespace: str
) -> None:
    """erin manages the pods of teams a and b but may exec only into team a's: the pod's labels
    decide ``pods/exec``, so she may not relabel a team b pod into team a."""
    pods = role(
        "pods-ab",
        namespace,
        [rule("*", "pods pods/exec")],
        {"pods": {"team": ["a", "b"]}, "pods/exec": {"team": ["a"]}},
    )
    bound = binding("erin", "pods-ab", "User:erin", namespace=namespace)
    rbac = [{"apiVersion": "rbac.authorization.k8s.io/v1", **o} for _, o in (pods, bound)]
    kube.apply(ADMIN, rbac)
    spec = {"containers": [{"name": "c", "image": "busybox"}]}
    kube.apply(ADMIN, [obj("Pod", "web-b", namespace, {"team": "b"}, spec=spec)])

    def judged_by_pods_ab() -> None:  # the webhook has seen the Role and its binding
        probe = yaml.safe_dump(obj("Pod", "probe", namespace, {"team": "c"}, spec=spec))
        done = kube.kubectl("erin", "create", "--dry-run=server", "-f", "-", input=probe)
        assert done.returncode != 0 and f"role {namespace}/pods-ab" in done.stderr, done.stderr

    eventually(judged_by_pods_ab)
    done = kube.kubectl("erin", "-n", namespace, "label", "pod", "web-b", "team=a", "--overwrite")
    assert done.returncode != 0, done.stdout
    assert (
        f'user "erin" may not update pods "web-b" in namespace "{namespace}": the existing '
        'object\'s label team="b" is not permitted where its subresources are concerned, '
        f"and relabelling would bring it within them (role {namespace}/pods-ab allows "
        "pods: team in [a, b] and pods/exec: team in [a])"
    ) in done.stderr, done.stderr
    done = kube.kubectl("erin", "-n", namespace, "label", "pod", "web-b", "tier=web")
    assert done.returncode == 0, done.stderr
