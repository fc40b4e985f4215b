"""Parent and metadata lookups keep a bounded amount, whatever a tenant names and writes.

A tenant chooses which objects are looked up (their names are in her requests) and how large
they are (a pod may take 1.5 MiB in etcd); a SubjectAccessReview names any resource at all. The
lookups go to the loopback API server (``tests.kubeapi``) as they would to a real one.
"""

from __future__ import annotations

from typing import Any

import pytest

from app.engine.context import ObjectRef, ParentUnavailable
from app.source.cluster import PARENT_CACHE_CHARS
from app.webhook.metrics import MAX_RESOURCE_LABEL_CHARS, MAX_RESOURCE_LABELS, OTHER, Metrics
from tests.kubeapi import FakeKubeAPI
from tests.source.helpers import POD, MakeSource, exec_request, pod


def big_pod(name: str, chars: int) -> dict[str, Any]:
    obj = pod(name, {"team": "a"})
    obj["metadata"]["annotations"] = {"filler": "x" * chars}
    return obj


def test_the_parent_cache_holds_a_bounded_weight_of_objects(
    kubeapi: FakeKubeAPI, make_source: MakeSource
) -> None:
    for i in range(40):
        kubeapi.put_object(POD.replace("/app", f"/big-{i}"), big_pod(f"big-{i}", 400_000))
    source = make_source()
    for i in range(40):  # 16 MB of pods, each looked up once within the TTL
        found = source.fetch_parent(exec_request(name=f"big-{i}"))
        assert found["metadata"]["name"] == f"big-{i}"
    parents = source._parents
    assert parents.weight <= PARENT_CACHE_CHARS
    assert 10 < len(parents) < 40  # the newest are kept, the oldest went
    # The newest is answered from the cache: no second GET.
    source.fetch_parent(exec_request(name="big-39"))
    gets = [r for r in kubeapi.recorded() if r.path.endswith("/big-39")]
    assert len(gets) == 1


def test_an_object_too_large_for_the_parent_cache_is_read_each_time(
    kubeapi: FakeKubeAPI, make_source: MakeSource
) -> None:
    kubeapi.put_object(POD, big_pod("app", PARENT_CACHE_CHARS // 8 + 1))
    source = make_source()
    for _ in range(2):
        assert source.fetch_parent(exec_request())["metadata"]["labels"] == {"team": "a"}
    assert len([r for r in kubeapi.recorded() if r.path == POD]) == 2
    assert len(source._parents) == 0


def test_lookups_of_made_up_resources_keep_the_metric_labels_bounded(
    kubeapi: FakeKubeAPI, make_source: MakeSource
) -> None:
    metrics = Metrics()
    source = make_source(observer=metrics)
    for i in range(MAX_RESOURCE_LABELS + 100):
        name = f"made-up-{i}" + ("x" * 2000 if i % 2 else "")
        ref = ObjectRef("example.com", "v1", name, "default", "obj")
        with pytest.raises(ParentUnavailable, match="HTTP 404"):  # a denial upstream
            source.fetch_metadata(ref)
    samples = [
        s
        for family in metrics.registry.collect()
        if family.name == "label_rbac_parent_lookups"
        for s in family.samples
        if s.name.endswith("_total")
    ]
    resources = {s.labels["resource"] for s in samples}
    assert OTHER in resources
    assert len(resources) <= MAX_RESOURCE_LABELS + 1
    assert max(map(len, resources)) <= MAX_RESOURCE_LABEL_CHARS
    assert sum(s.value for s in samples) == MAX_RESOURCE_LABELS + 100
