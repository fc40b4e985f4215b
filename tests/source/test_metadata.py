"""Label-scoped gets against the loopback API server: the metadata-only watch of the resource
read, its GET fallback while it does not know an object, and what it keeps in memory."""

from __future__ import annotations

from typing import Any

import pytest

from app.engine.authorize import authorize
from app.engine.context import Context, ObjectRef, ParentUnavailable
from app.engine.model import Access, AccessDecision, Resource, UserInfo, Verdict
from app.source.api import KubeClient
from app.source.cluster import ClusterSource
from app.source.metadata import MetadataInformer
from tests.kubeapi import FakeKubeAPI, wait_until
from tests.source.helpers import MakeSource, rolebinding

SECRET_DATA = {"password": "c2VjcmV0"}
ROLE = {
    "metadata": {
        "name": "secrets-a",
        "namespace": "default",
        "annotations": {"labelrbac.io/permissions": '{"secrets": {"team": ["a"]}}'},
    },
    "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list"]}],
}


def secret(name: str, **labels: str) -> dict[str, Any]:
    meta = {"name": name, "namespace": "default", "labels": labels}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "data": SECRET_DATA}


def object_path(name: str) -> str:
    return f"/api/v1/namespaces/default/secrets/{name}"


@pytest.fixture
def cluster(kubeapi: FakeKubeAPI, make_source: MakeSource) -> ClusterSource:
    kubeapi.add_collection("secrets", "/api/v1", "Secret", "v1", [secret("s-a", team="a")])
    kubeapi.apply("roles", ROLE)
    kubeapi.apply("rolebindings", rolebinding("alice-secrets", "alice", "secrets-a"))
    source = make_source()
    wait_until(lambda: _snapshot_has_role(source), what="the role in the snapshot")
    return source


def _snapshot_has_role(source: ClusterSource) -> bool:
    snapshot = source.snapshot()
    return snapshot is not None and any(r.name == "secrets-a" for r in snapshot.roles)


def get(source: ClusterSource, name: str) -> AccessDecision:
    snapshot = source.snapshot()
    assert snapshot is not None
    access = Access(UserInfo("alice"), "get", Resource("", "secrets"), "v1", "default", name)
    return authorize(access, Context(snapshot, metadata=source.fetch_metadata))


def gets_of(kubeapi: FakeKubeAPI, name: str) -> int:
    return len([r for r in kubeapi.recorded() if r.path == object_path(name)])


def informer_of(source: ClusterSource) -> MetadataInformer:
    (informer,) = source.metadata.informers
    return informer


def test_the_fake_serves_metadata_only_lists_and_watches(
    kubeapi: FakeKubeAPI, tmp_path: Any
) -> None:
    kubeapi.add_collection("secrets", "/api/v1", "Secret", "v1", [secret("s-a", team="a")])
    client = KubeClient.connect(kubeapi.write_kubeconfig(tmp_path / "kubeconfig"))
    try:
        items, version = client.list("/api/v1/secrets", 10, (2, 5), metadata_only=True)
        assert [(i["kind"], i["apiVersion"]) for i in items] == [
            ("PartialObjectMetadata", "meta.k8s.io/v1")
        ]
        assert "data" not in items[0] and items[0]["metadata"]["labels"] == {"team": "a"}
        full, _ = client.list("/api/v1/secrets", 10, (2, 5))
        assert full[0]["data"] == SECRET_DATA  # without as=, the whole object
        (sent,) = [r for r in kubeapi.recorded("secrets") if "as=" in r.accept]
        assert sent.accept.startswith(
            "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
        )

        stream = client.watch("/api/v1/secrets", version, 5, (2, 10), metadata_only=True)
        kubeapi.apply("secrets", secret("s-b", team="b"))
        event = next(iter(stream))
        stream.close()
        assert event["type"] == "ADDED"
        assert event["object"]["kind"] == "PartialObjectMetadata"
        assert "data" not in event["object"]
        assert event["object"]["metadata"]["name"] == "s-b"
    finally:
        client.close()


def test_known_objects_are_judged_from_the_watch(
    kubeapi: FakeKubeAPI, cluster: ClusterSource
) -> None:
    get(cluster, "s-a")  # starts the metadata informer for secrets
    informer = wait_until(lambda: cluster.metadata.informers and informer_of(cluster).synced)
    assert informer
    before = gets_of(kubeapi, "s-a")
    for _ in range(3):
        assert get(cluster, "s-a").reason == "LabelsPermitted"
    assert gets_of(kubeapi, "s-a") == before  # no round trip per read
    # The informer listed and watched metadata only, and keeps nothing but labels.
    requests = kubeapi.recorded("secrets")
    assert requests and all("as=PartialObjectMetadata" in r.accept for r in requests)
    assert informer_of(cluster).values() == [{"team": "a"}]


@pytest.mark.parametrize(
    ("labels", "verdict", "reason"),
    [
        pytest.param({"team": "a"}, Verdict.NO_OPINION, "LabelsPermitted", id="own-bucket"),
        pytest.param({"team": "b"}, Verdict.DENY, "LabelNotPermitted", id="other-bucket"),
        pytest.param(None, Verdict.DENY, "LabelsUnavailable", id="does-not-exist"),
    ],
)
def test_objects_the_watch_does_not_know_are_read_by_get(
    kubeapi: FakeKubeAPI,
    cluster: ClusterSource,
    labels: dict[str, str] | None,
    verdict: Verdict,
    reason: str,
) -> None:
    get(cluster, "s-a")
    wait_until(lambda: cluster.metadata.informers and informer_of(cluster).synced)
    if labels is not None:
        # Created a moment ago: the watch has not delivered it yet.
        kubeapi.change_silently("secrets", secret("fresh", **labels))
    decision = get(cluster, "fresh")
    assert (decision.verdict, decision.reason) == (verdict, reason), decision
    (sent,) = [r for r in kubeapi.recorded() if r.path == object_path("fresh")]
    assert "as=PartialObjectMetadata;" in sent.accept


def test_relabelled_objects_are_judged_by_their_new_labels(
    kubeapi: FakeKubeAPI, cluster: ClusterSource
) -> None:
    assert get(cluster, "s-a").verdict is Verdict.NO_OPINION
    wait_until(lambda: cluster.metadata.informers and informer_of(cluster).synced)
    kubeapi.apply("secrets", secret("s-a", team="b"))
    denied = wait_until(lambda: get(cluster, "s-a").verdict is Verdict.DENY, timeout=2)
    assert denied
    kubeapi.apply("secrets", secret("s-a", team="a"))
    assert wait_until(lambda: get(cluster, "s-a").verdict is Verdict.NO_OPINION, timeout=2)
    kubeapi.delete("secrets", "s-a", "default")
    kubeapi.apply("secrets", secret("s-a", team="b"))  # deleted, then made again elsewhere
    assert wait_until(lambda: get(cluster, "s-a").verdict is Verdict.DENY, timeout=2)


def test_cache_reads_only_what_it_may_and_falls_back(
    kubeapi: FakeKubeAPI, make_source: MakeSource
) -> None:
    # No secrets collection served: the informer cannot list (404), every read is a GET.
    kubeapi.put_object(object_path("db"), secret("db", team="a"))
    source = make_source()
    ref = ObjectRef("", "v1", "secrets", "default", "db")
    first = source.fetch_metadata(ref)
    assert first == {"metadata": secret("db", team="a")["metadata"]}
    assert not informer_of(source).synced


def test_only_watched_resources_get_an_informer(
    kubeapi: FakeKubeAPI, make_source: MakeSource
) -> None:
    kubeapi.add_collection("secrets", "/api/v1", "Secret", "v1", [secret("s-a", team="a")])
    kubeapi.add_collection("configmaps", "/api/v1", "ConfigMap", "v1")
    source = make_source(watched_labels=frozenset({("", "secrets")}))
    source.fetch_metadata(ObjectRef("", "v1", "secrets", "default", "s-a"))
    with pytest.raises(ParentUnavailable, match="404"):
        source.fetch_metadata(ObjectRef("", "v1", "configmaps", "default", "none"))
    assert [i.spec.resource for i in source.metadata.informers] == ["secrets"]
    assert kubeapi.recorded("configmaps") == []  # never listed: read by GET only
