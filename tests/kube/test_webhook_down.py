"""With every replica down (README "When the webhook is down"), the shipped failure policies:
the enforce overlay refuses judged writes, the authorization webhook refuses judged reads, and
admins, the webhook's own namespace and exempt namespaces carry on."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import yaml

from tests.kube.cluster import LabelRbacCluster
from tests.kube.controlplane import ADMIN
from tests.kube.support import eventually, fresh_namespace, install_tenants, obj
from tests.process import stop


@pytest.fixture(scope="module")
def webhook_down(kube: LabelRbacCluster) -> Iterator[str]:
    """The tenants installed in a namespace, then the webhook stopped for this module's
    outage tests; started again after them."""
    namespace = fresh_namespace(kube)
    install_tenants(kube, namespace)
    assert kube.webhook is not None
    stop(kube.webhook.process)
    try:
        yield namespace
    finally:
        if kube.webhook is None or kube.webhook.process.poll() is not None:
            kube.restart_webhook()


def create(kube: LabelRbacCluster, user: str, document: dict[str, object]) -> tuple[int, str]:
    done = kube.kubectl(user, "create", "-f", "-", input=yaml.safe_dump(document))
    return done.returncode, done.stdout + done.stderr


def test_judged_writes_fail_closed(kube: LabelRbacCluster, webhook_down: str) -> None:
    for user in ("alice", ADMIN):
        status, output = create(
            kube, user, obj("ConfigMap", f"c-{user}", webhook_down, {"team": "a"})
        )
        assert status != 0
        assert 'failed calling webhook "labels.labelrbac.io"' in output


def test_judged_reads_fail_closed_admins_read_on(kube: LabelRbacCluster, webhook_down: str) -> None:
    def refused() -> None:
        # failurePolicy Deny: the API server turns the failed call into a refusal, answered as
        # 500 InternalError (its authorization filter reports an authorizer's error so).
        done = kube.kubectl("alice", "-n", webhook_down, "get", "configmaps", "-l", "team=a")
        assert done.returncode != 0, done.stdout
        assert done.stdout == ""
        assert done.stderr.startswith("Error from server (InternalError)"), done.stderr

    eventually(refused)  # an earlier answer may be reused for unauthorizedTTL
    admin = kube.kubectl(ADMIN, "-n", webhook_down, "get", "configmaps")
    assert admin.returncode == 0, admin.stderr


@pytest.mark.parametrize("where", ["label-rbac", "exempt"])
def test_the_webhooks_namespace_and_exempt_ones_are_left_alone(
    kube: LabelRbacCluster, webhook_down: str, where: str
) -> None:
    """A broken rollout can always be repaired; the documented opt-out keeps working."""
    ns = (
        "label-rbac"
        if where == "label-rbac"
        else fresh_namespace(kube, {"labelrbac.io/exempt": "true"})
    )
    name = f"repair-{webhook_down}"
    status, output = create(kube, ADMIN, obj("ConfigMap", name, ns))
    assert status == 0, output
    kube.kubectl(ADMIN, "-n", ns, "delete", "configmap", name)


def test_writes_are_judged_again_once_it_is_back(kube: LabelRbacCluster, webhook_down: str) -> None:
    kube.restart_webhook()

    def judged() -> None:
        status, output = create(kube, "alice", obj("ConfigMap", "c", webhook_down, {"team": "b"}))
        assert status != 0
        assert 'label team="b" is not permitted' in output

    eventually(judged)
    status, output = create(kube, "alice", obj("ConfigMap", "c", webhook_down, {"team": "a"}))
    assert status == 0, output
