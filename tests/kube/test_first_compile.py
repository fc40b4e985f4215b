"""A first compile through a real kube-apiserver: many new namespaces proven seen in batches.

Forty namespaces, each with an annotated Role bound to alice, exist before the compiler starts,
so it writes them all at once and proves a batch of them seen by the policies with an epoch
(``app.compiled.proof``) instead of an update of each. Checked: the policy refuses a dry run
asking for an epoch never set; every namespace ends marked, and judged by the policy at once; and
most namespaces' parameters were sent once (the API server's audit log).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest

from app.compiled.admission_policy import COMPILER, EPOCH, EPOCH_MESSAGE
from app.compiled.proof import BATCH, MERGE
from app.engine.params import MARK
from tests.kube.cluster import Compilers
from tests.kube.conftest import require_control_plane, wait_for
from tests.kube.controlplane import ADMIN, ControlPlane, User
from tests.kube.test_compile import install_compiled, rbac
from tests.support import binding, role, rule

N = 40
NAMESPACES = [f"first-{i:02d}" for i in range(N)]
USERS = (
    User(ADMIN, ("system:masters",)),
    User(COMPILER, ("system:serviceaccounts", "system:serviceaccounts:label-rbac")),
    User("alice", ("tenants",)),
)
PARAMS = "/apis/labelrbac.io/v1alpha1/namespaces/{}/labelrbacparams/label-rbac"


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    require_control_plane()
    workdir = tmp_path_factory.mktemp("first-compile")
    cp = ControlPlane(workdir, users=USERS)
    cp.start()
    compilers = Compilers(cp, workdir)
    try:
        install_compiled(cp, *NAMESPACES)
        for namespace in NAMESPACES:
            team = role(
                "team-a", namespace, [rule("*", "configmaps")], {"configmaps": {"team": ["a"]}}
            )
            cp.apply(
                ADMIN, [rbac(team), rbac(binding("a", "team-a", "User:alice", namespace=namespace))]
            )
        compilers.start("one")
        wait_for(lambda: set(NAMESPACES) <= marked(cp), "every namespace marked", timeout=120)
        yield cp
    finally:
        compilers.stop_all()
        cp.stop()


def marked(cp: ControlPlane) -> set[str]:
    _, listing = cp.request(ADMIN, "GET", f"/api/v1/namespaces?labelSelector={MARK}%3Dtrue")
    return {item["metadata"]["name"] for item in listing["items"]}


def refusal(cp: ControlPlane, namespace: str) -> str:
    body = {"metadata": {"name": "c", "labels": {"team": "b"}}, "data": {}}
    path = f"/api/v1/namespaces/{namespace}/configmaps?dryRun=All"
    status, answer = cp.request("alice", "POST", path, body)
    return "" if status < 300 else str(answer.get("message", answer))


def test_every_namespace_is_marked_and_judged_by_the_policy(compiled: ControlPlane) -> None:
    for namespace in NAMESPACES:
        assert 'label team="b" is not permitted' in refusal(compiled, namespace)
        assert "ValidatingAdmissionPolicy 'label-rbac'" in refusal(compiled, namespace)


def test_most_parameters_are_sent_once(compiled: ControlPlane) -> None:
    """Proven in batches: no update of each namespace's new parameters, but for a few."""
    applies: Counter[str] = Counter()
    for event in compiled.audit_events():
        ref = event.get("objectRef") or {}
        if (
            event["stage"] == "ResponseComplete"
            and event["user"]["username"] == COMPILER
            and ref.get("resource") == "labelrbacparams"
            and "force=true" in event["requestURI"]
            and ref.get("namespace") in NAMESPACES
        ):
            applies[ref["namespace"]] += 1
    assert set(applies) == set(NAMESPACES)
    assert len([n for n, count in applies.items() if count > 1]) <= BATCH


@pytest.mark.parametrize("asked", [pytest.param("never-set", id="never-set"),
                                   pytest.param("", id="the-one-set")])  # fmt: skip
def test_the_policy_admits_a_dry_run_asking_for_an_epoch_once_it_is_seen(
    compiled: ControlPlane, asked: str
) -> None:
    """The sentinels of the proofs carry their last epoch: asking for it passes, asking for
    one never set is refused."""
    _, listing = compiled.request(ADMIN, "GET", "/apis/labelrbac.io/v1alpha1/labelrbacparams")
    sentinels = [i for i in listing["items"] if EPOCH in i["metadata"].get("annotations", {})]
    assert sentinels
    found = sentinels[0]["metadata"]
    body = {"metadata": {"labels": {EPOCH: asked or found["annotations"][EPOCH]}}}
    path = f"{PARAMS.format(found['namespace'])}?dryRun=All"
    status, answer = compiled.request(COMPILER, "PATCH", path, body, content_type=MERGE)
    if asked:
        assert status == 403 and EPOCH_MESSAGE in answer["message"]
    else:
        assert status == 200
