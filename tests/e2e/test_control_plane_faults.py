"""label-rbac under faults of the control plane around it, through the real API server: its
serving certificate rotated, the API server restarted, etcd's history compacted while the
webhook's watches are away (410 Gone, a re-list). Decisions stay right, readiness stays honest.

One replica, in a control plane of this module's own (these tests restart and freeze things).
"""

from __future__ import annotations

import base64
import json
import os
import signal
import ssl
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from app.webhook.certs import Authority
from tests.e2e.load import RIGHT, judge, probes
from tests.kube.cluster import SERVICE_NAME, LabelRbacCluster
from tests.kube.conftest import require_control_plane
from tests.kube.controlplane import ADMIN
from tests.kube.support import eventually, fresh_namespace, install_tenants
from tests.process import Server

NAMES = [SERVICE_NAME, "127.0.0.1", "localhost"]


class Solo:
    """The cluster, the CA its serving certificates come from, a namespace with the tenants."""

    def __init__(self, cluster: LabelRbacCluster, authority: Authority) -> None:
        self.cluster = cluster
        self.authority = authority
        self.namespace = ""

    @property
    def webhook(self) -> Server:
        assert self.cluster.webhook is not None
        return self.cluster.webhook


@pytest.fixture(scope="module")
def solo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Solo]:
    require_control_plane()
    cluster = LabelRbacCluster(tmp_path_factory.mktemp("faults"))
    # The serving certificate from a CA kept here, so that a renewal can be issued by it.
    authority = Authority.create()
    cluster.tls.ca.write_bytes(authority.pem())
    rotate(cluster, authority)
    with cluster:
        setup = Solo(cluster, authority)
        setup.namespace = fresh_namespace(cluster)
        install_tenants(cluster, setup.namespace)
        yield setup


def rotate(cluster: LabelRbacCluster, authority: Authority) -> int:
    """A new serving certificate and key from ``authority``, swapped in file by file as a
    renewal writes them; its serial number."""
    cert, key = authority.issue(NAMES)
    for path, data in ((cluster.tls.key, key), (cluster.tls.cert, cert)):
        partial = path.with_name(path.name + ".new")
        partial.touch(mode=0o600)
        partial.write_bytes(data)
        os.replace(partial, path)
    return x509.load_pem_x509_certificate(cert).serial_number


def served_serial(server: Server) -> int:
    """The serial number of the certificate the webhook presents to a new connection."""
    with server.connect() as sock:
        der = sock.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def assert_decisions(solo: Solo, team: str = "a", other: str = "b") -> None:
    """Alice's writes and reads inside and outside ``team``, each answered as it must be (a
    refusal carries label-rbac's message: the webhook answered, its failure policy did not)."""
    cp = solo.cluster.control_plane
    for probe in probes(solo.namespace, team, other):
        status, body = cp.request("alice", probe.method, probe.path, probe.body)
        outcome, detail = judge(probe, status, body)
        assert outcome == RIGHT, (probe.name, team, detail)
        if probe.name == "write-other":
            assert f'label team="{other}" is not permitted' in body["message"], body


def ready(server: Server) -> bool:
    try:
        status, _ = server.request("GET", "/readyz", timeout=3)
    except (OSError, ssl.SSLError):
        return False
    return status == 200


def grant_configmaps(solo: Solo, team: str) -> None:
    """Role team-a's configmaps bucket becomes ``team`` (an admin's edit of the annotation)."""
    permissions = json.dumps({"configmaps": {"team": [team]}})
    patch = {"metadata": {"annotations": {"labelrbac.io/permissions": permissions}}}
    status, body = solo.cluster.control_plane.request(
        ADMIN,
        "PATCH",
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{solo.namespace}/roles/team-a",
        patch,
        content_type="application/merge-patch+json",
    )
    assert status == 200, body


def test_a_rotated_certificate_is_served_and_the_api_server_keeps_calling(solo: Solo) -> None:
    before = served_serial(solo.webhook)
    serial = rotate(solo.cluster, solo.authority)
    assert serial != before
    eventually(lambda: assert_equal(served_serial(solo.webhook), serial))
    assert_decisions(solo)  # over the API server's kept-alive connections
    # A new API server process dials anew: each handshake now meets only the renewed
    # certificate, verified against the caBundle of the same CA, unchanged.
    solo.cluster.control_plane.restart_apiserver()
    eventually(lambda: assert_decisions(solo), timeout=30)
    assert served_serial(solo.webhook) == serial


def assert_equal(seen: object, expected: object) -> None:
    assert seen == expected, (seen, expected)


def test_after_an_api_server_restart_the_watches_resume(solo: Solo) -> None:
    solo.cluster.control_plane.stop_apiserver()
    # Decisions from the last synced state while the API server is away: still ready.
    assert ready(solo.webhook)
    solo.cluster.control_plane.start_apiserver()
    assert ready(solo.webhook)
    assert_decisions(solo)
    # A change made after the restart is enforced: the watches are live again, not stale.
    grant_configmaps(solo, "c")
    eventually(lambda: assert_decisions(solo, team="c", other="a"), timeout=30)
    grant_configmaps(solo, "a")
    eventually(lambda: assert_decisions(solo, team="a", other="c"), timeout=30)


def etcd(solo: Solo, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """One call to etcd's HTTP gateway (v3 JSON API)."""
    port = solo.cluster.control_plane.etcd_port
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(), method="POST"
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        result: dict[str, Any] = json.loads(response.read())
    return result


def webhook_configuration(solo: Solo) -> dict[str, Any]:
    status, body = solo.cluster.control_plane.request(
        ADMIN, "GET", "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
    )
    assert status == 200, body
    (config,) = [c for c in body["items"] if c["metadata"]["name"].startswith("label-rbac")]
    config.update(
        apiVersion="admissionregistration.k8s.io/v1", kind="ValidatingWebhookConfiguration"
    )
    for key in ("resourceVersion", "uid", "creationTimestamp", "generation", "managedFields"):
        config["metadata"].pop(key, None)
    return config


# The API server's 410 for a watch from etcd at a compacted revision (its watch cache says
# "too old resource version" instead).
COMPACTED = "The resourceVersion for the provided watch is too old"


def relists(log: Path) -> int:
    """How many watches the webhook re-listed after a compaction's 410 Gone (its log,
    app.source.informer)."""
    return sum(
        1 for line in log.read_text().splitlines() if "re-listing" in line and COMPACTED in line
    )


def test_compacted_history_is_relisted_and_decisions_follow(solo: Solo) -> None:
    cp = solo.cluster.control_plane
    webhook = solo.webhook
    config = webhook_configuration(solo)
    name = config["metadata"]["name"]
    log = Path(webhook.log)
    relists_before = relists(log)
    # The webhook frozen: its watches stay where they were while RBAC changes. Its admission
    # checks are unregistered meanwhile (a frozen webhook would time every RBAC write out).
    os.killpg(webhook.process.pid, signal.SIGSTOP)
    try:
        path = f"/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/{name}"
        status, body = cp.request(ADMIN, "DELETE", path)
        assert status == 200, body
        for round_ in range(30):
            grant_configmaps(solo, f"r{round_}")
        grant_configmaps(solo, "d")
        key = base64.b64encode(b"/").decode()
        revision = int(etcd(solo, "/v3/kv/range", {"key": key})["header"]["revision"])
        etcd(solo, "/v3/kv/compaction", {"revision": revision, "physical": True})
        # The watches' connections end with the API server. The new one serves watches from
        # etcd itself (no watch cache, whose history would start afresh anyway), so what
        # answers 410 is the compaction.
        cp.extra_args = (*cp.extra_args, "--watch-cache=false")
        cp.restart_apiserver()
    finally:
        os.killpg(webhook.process.pid, signal.SIGCONT)
    # Resumed from a resourceVersion that is gone: 410, a re-list, the new state.
    eventually(lambda: assert_equal(relists(log) > relists_before, True), timeout=30)
    eventually(lambda: assert_equal(ready(webhook), True), timeout=30)
    cp.apply(ADMIN, [config])
    eventually(lambda: assert_decisions(solo, team="d", other="a"), timeout=30)
    grant_configmaps(solo, "a")
    eventually(lambda: assert_decisions(solo, team="a", other="d"), timeout=30)
