"""The workload rules against recorded v1.35 traffic, through the Flask app.

The RBAC is the recorded scenario's (tests/scenarios/v135-rbac.yaml: Role ``t1/team-a`` for the
group ``tenants``). With a static source nothing can be looked up; with the cluster
source the objects the rules read come from the loopback API server, as metadata only.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient

from app.settings import Settings
from app.source.static import StaticSource, read_manifests
from app.webhook.server import create_app
from tests.kubeapi import FakeKubeAPI
from tests.source.helpers import MakeSource
from tests.support import V135_RBAC, V135_REVIEWS

CLUSTER = Settings(kubeconfig=Path("kubeconfig"))

pytestmark = pytest.mark.skipif(not V135_REVIEWS.is_dir(), reason="v1.35 fixtures not present")


def recorded(stem: str) -> dict[str, Any]:
    return json.loads((V135_REVIEWS / f"{stem}.json").read_text())


def post(client: FlaskClient, review: dict[str, Any]) -> dict[str, Any]:
    response = client.post("/validate", json=review)
    assert response.status_code == 200, response.get_data(as_text=True)
    answer = response.get_json()["response"]
    assert answer["uid"] == review["request"]["uid"]
    return answer


@pytest.fixture
def static_client() -> FlaskClient:
    source = StaticSource(V135_RBAC, CLUSTER.compiler)
    source.start()
    return create_app(CLUSTER, source).test_client()


def test_c033_deployment_with_a_foreign_pod_template_is_refused(
    static_client: FlaskClient,
) -> None:
    """Deployment d-a is labeled team=a, its pod template team=b: the confused deputy."""
    answer = post(static_client, recorded("c033-tenant-create-deployments"))
    assert answer["allowed"] is False
    assert answer["status"]["code"] == 403
    assert answer["status"]["message"] == (
        'user "alice" may not create deployments.apps "d-a" in namespace "t1": its pod template '
        '(spec.template) has label team="b", not permitted for pods (role t1/team-a allows team '
        "in [a])"
    )


def test_c033_with_the_template_in_bucket_still_needs_a_confined_selector(
    static_client: FlaskClient,
) -> None:
    review = recorded("c033-tenant-create-deployments")
    spec = review["request"]["object"]["spec"]
    spec["template"]["metadata"]["labels"]["team"] = "a"
    answer = post(static_client, review)
    assert answer["allowed"] is False
    assert (
        "its spec.selector (app=d-a) can match pods of other labels"
        in (answer["status"]["message"])
    )
    spec["selector"]["matchLabels"]["team"] = "a"
    assert post(static_client, review)["allowed"] is True


def test_c038_pod_mounting_a_restricted_secret_needs_cluster_access(
    static_client: FlaskClient,
) -> None:
    """alice's get on secrets is label-restricted, and the static mode cannot read s-ref."""
    answer = post(static_client, recorded("c038-tenant-update-pods-ephemeralcontainers"))
    assert answer["allowed"] is False
    assert (
        'it uses configmaps "cm-a", whose labels cannot be checked' in (answer["status"]["message"])
    )
    assert "static --rbac-dir" in answer["status"]["message"]


# --- With the cluster source and the loopback API server -----------------------------------------


def metadata_object(kind: str, name: str, labels: dict[str, str], **body: Any) -> dict[str, Any]:
    meta = {"name": name, "namespace": "t1", "labels": labels}
    return {"apiVersion": "v1", "kind": kind, "metadata": meta, **body}


@pytest.fixture
def cluster(kubeapi: FakeKubeAPI, make_source: MakeSource) -> FlaskClient:
    for kind, obj in read_manifests(V135_RBAC):
        if kind in ("Role", "RoleBinding"):
            kubeapi.apply(kind.lower() + "s", obj)
    core = "/api/v1/namespaces/t1"
    kubeapi.put_object(f"{core}/secrets/s-ref", metadata_object("Secret", "s-ref", {"team": "a"}))
    kubeapi.put_object(
        f"{core}/configmaps/cm-a", metadata_object("ConfigMap", "cm-a", {"team": "a"})
    )
    kubeapi.put_object(
        f"{core}/secrets/s-other",
        metadata_object("Secret", "s-other", {"team": "b"}, data={"password": "c2VjcmV0"}),
    )
    created = recorded("c033-tenant-create-deployments")["request"]["object"]
    kubeapi.put_object("/apis/apps/v1/namespaces/t1/deployments/d-a", created)
    source = make_source()
    snapshot = source.snapshot()
    assert snapshot is not None and snapshot.roles
    return create_app(CLUSTER, source).test_client()


def test_c038_references_are_read_as_metadata(kubeapi: FakeKubeAPI, cluster: FlaskClient) -> None:
    answer = post(cluster, recorded("c038-tenant-update-pods-ephemeralcontainers"))
    assert answer["allowed"] is True, answer
    looked_up = [r for r in kubeapi.recorded() if "/namespaces/t1/" in r.path]
    assert sorted(r.path.rsplit("/", 2)[-2] for r in looked_up) == ["configmaps", "secrets"]
    assert all("as=PartialObjectMetadata" in r.accept for r in looked_up)


def test_debug_container_reading_another_bucket_secret_is_refused(cluster: FlaskClient) -> None:
    review = recorded("c038-tenant-update-pods-ephemeralcontainers")
    pod = review["request"]["object"]
    debug = copy.deepcopy(pod["spec"]["ephemeralContainers"][-1])
    debug["name"] = "thief"
    debug["envFrom"] = [{"secretRef": {"name": "s-other"}}]
    pod["spec"]["ephemeralContainers"].append(debug)
    answer = post(cluster, review)
    assert answer["allowed"] is False
    assert answer["status"]["message"] == (
        'user "alice" may not update pods/ephemeralcontainers "web-a" in namespace "t1": it uses '
        'secrets "s-other", which has label team="b", not permitted for get secrets (role '
        "t1/team-a allows team in [a])"
    )


def test_c036_scaling_a_deployment_with_a_foreign_template_is_refused(
    kubeapi: FakeKubeAPI, cluster: FlaskClient
) -> None:
    """c033 got in before this rule existed: scaling it would make team=b pods."""
    answer = post(cluster, recorded("c036-tenant-update-deployments-scale"))
    assert answer["allowed"] is False
    assert (
        'its stored pod template (spec.template) has label team="b"'
        in (answer["status"]["message"])
    )
    # Read once for the label rule and the template (cached), as a whole parent.
    gets = [r for r in kubeapi.recorded() if r.path.endswith("/deployments/d-a")]
    assert len(gets) == 1


def test_unreadable_reference_is_refused_with_the_api_server_answer(
    kubeapi: FakeKubeAPI, cluster: FlaskClient
) -> None:
    kubeapi.get_faults["/api/v1/namespaces/t1/configmaps/cm-a"] = 403
    answer = post(cluster, recorded("c038-tenant-update-pods-ephemeralcontainers"))
    assert answer["allowed"] is False
    assert answer["status"]["message"].endswith(
        'it uses configmaps "cm-a", whose labels cannot be checked: could not read configmaps '
        '"cm-a" in namespace "t1": HTTP 403 Forbidden'
    )
