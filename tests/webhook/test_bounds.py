"""Hostile reviews through /authorize and /validate: what a worker keeps stays bounded.

kube-apiserver authorizes ``GET .../pods/web-a/<anything>`` before it routes (and 404s) the
request, so a tenant sends SubjectAccessReviews with subresources of her choosing, as long as
the API server takes a URL; /validate answers anyone who reaches the port. Neither may grow a
worker: the label-entry memo, the metric series and the process's memory stay flat.
"""

from __future__ import annotations

import gc
import io
import json
import logging
import random
import string
import tracemalloc
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient

from app import logs
from app.engine.context import ObjectRef, ParentUnavailable
from app.engine.model import OPERATIONS
from app.engine.policy import Permissions
from app.settings import Settings
from app.source.static import StaticSource
from app.webhook.metrics import MAX_RESOURCE_LABEL_CHARS, MAX_RESOURCE_LABELS, OTHER, Metrics
from app.webhook.server import create_app
from tests.support import binding, make_access_review, make_review, role, rule

PODS = {("t1", "web-a"): {"team": "a"}, ("t1", "web-b"): {"team": "b"}}
RBAC = [
    role("tenant", "t1", [rule("get list watch", "*")],
         {"pods": {"team": ["a"]}, "*/status": {"team": ["a"]}, "*": {"team": ["a"]}}),
    binding("mallory", "tenant", "User:mallory", namespace="t1"),
]  # fmt: skip


class Pods(StaticSource):
    """RBAC from files; the pods' labels as a metadata lookup returns them."""

    def fetch_metadata(self, ref: ObjectRef) -> Mapping[str, Any]:
        labels = PODS.get((ref.namespace, ref.name))
        if labels is None:
            raise ParentUnavailable(f"could not read {ref}: HTTP 404 NotFound")
        return {"metadata": {"name": ref.name, "namespace": ref.namespace, "labels": labels}}


@pytest.fixture
def served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[FlaskClient, Pods, Metrics]]:
    (tmp_path / "rbac.json").write_text(
        json.dumps({"kind": "List", "items": [obj for _, obj in RBAC]})
    )
    # Decision lines go nowhere: pytest's log capture would keep every one.
    decisions = logging.getLogger("label_rbac.decisions")
    monkeypatch.setattr(decisions, "handlers", [logging.NullHandler()])
    monkeypatch.setattr(decisions, "propagate", False)
    settings = Settings(rbac_dir=tmp_path)
    source = Pods(tmp_path, settings.compiler)
    source.start()
    metrics = Metrics()
    app = create_app(
        settings,
        source,
        (metrics.observe_decision,),
        metrics.render,
        access_observers=(metrics.observe_access,),
    )
    app.config["TESTING"] = True
    yield app.test_client(), source, metrics
    source.stop()


def tenant_permissions(source: Pods) -> Permissions:
    snapshot = source.snapshot()
    assert snapshot is not None
    (found,) = [r.permissions for r in snapshot.roles.values() if r.permissions is not None]
    return found


def authorize(client: FlaskClient, review: dict[str, Any]) -> dict[str, Any]:
    response = client.post("/authorize", json=review)
    assert response.status_code == 200, response.get_data(as_text=True)
    return dict(response.get_json()["status"])


def junk(rng: random.Random, size: int) -> str:
    return "".join(rng.choices(string.ascii_letters + string.digits + "-._~", k=size))


def hostile_get(rng: random.Random, name: str) -> dict[str, Any]:
    review = make_access_review("mallory", "get", "pods", namespace="t1", name=name)
    review["spec"]["resourceAttributes"]["subresource"] = junk(rng, 32 * 1024)
    return review


def test_made_up_subresources_neither_grow_the_memo_nor_the_worker(
    served: tuple[FlaskClient, Pods, Metrics],
) -> None:
    client, source, metrics = served
    rng = random.Random(16)
    for _ in range(10):  # warm: the memo's classes, Flask's and the engine's first allocations
        authorize(client, hostile_get(rng, "web-a"))
        authorize(client, hostile_get(rng, "web-b"))
    gc.collect()
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        for i in range(100):  # 200 reviews, 6 MiB of distinct subresources
            allowed = authorize(client, hostile_get(rng, "web-a"))
            refused = authorize(client, hostile_get(rng, "web-b"))
            # Decided as any subresource of the pod: by the pod's labels, under "pods".
            assert allowed == {"allowed": False}  # no opinion: RBAC decides
            assert refused["denied"] is True and 'team="b"' in refused["reason"], refused
            if i == 0:
                gc.collect()
                after_one, _ = tracemalloc.get_traced_memory()
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - max(base, after_one)
    finally:
        tracemalloc.stop()
    assert grown < 2_000_000, f"200 hostile reviews kept {grown} bytes"
    memo = tenant_permissions(source)._memo
    assert len(memo) <= 2, memo.keys()  # pods with "some subresource", and pods itself
    reasons = {
        s.labels["reason"]: s.value
        for family in metrics.registry.collect()
        if family.name == "label_rbac_authorizations"
        for s in family.samples
        if s.name.endswith("_total")
    }
    assert reasons == {"LabelsPermitted": 110, "LabelNotPermitted": 110}


def test_the_label_entry_memo_answers_real_subresources_by_their_entries(
    served: tuple[FlaskClient, Pods, Metrics],
) -> None:
    client, source, _ = served
    for sub in ("status", "log", "made-up", "status"):
        review = make_access_review("mallory", "get", f"pods/{sub}", namespace="t1", name="web-b")
        status = authorize(client, review)
        assert status["denied"] is True
        assert 'team="b"' in status["reason"]
    assert len(tenant_permissions(source)._memo) == 2  # "status" and every other subresource


def test_reviews_with_made_up_fields_keep_the_metric_series_bounded(
    served: tuple[FlaskClient, Pods, Metrics],
) -> None:
    client, _, metrics = served
    rng = random.Random(5)
    for i in range(MAX_RESOURCE_LABELS + 200):
        review = make_review(
            "anyone", rng.choice(["CREATE", junk(rng, 12)]), f"r{i}" + "x" * (i % 3) * 1000,
            namespace="t1", labels={"team": "a"},
        )  # fmt: skip
        assert client.post("/validate", json=review).status_code == 200
    samples = [
        s
        for family in metrics.registry.collect()
        if family.name == "label_rbac_decisions"
        for s in family.samples
        if s.name.endswith("_total")
    ]
    operations = {s.labels["operation"] for s in samples}
    resources = {s.labels["resource"] for s in samples}
    assert operations <= OPERATIONS | {OTHER} and OTHER in operations
    assert OTHER in resources and len(resources) <= MAX_RESOURCE_LABELS + 1
    assert max(map(len, resources)) <= MAX_RESOURCE_LABEL_CHARS
    assert sum(s.value for s in samples) == MAX_RESOURCE_LABELS + 200
    body, _ = metrics.render()
    assert len(body) < 400_000  # some 500 short series, whatever the reviews named


def test_dropped_log_lines_are_counted_in_the_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    """As ``serve`` wires it: a full log queue drops lines and the metric says how many."""
    metrics = Metrics()
    logs.set_drop_observer(metrics.log_line_dropped)
    monkeypatch.setattr(logs, "MAX_QUEUED_LINES", 0)  # every line meets a full queue
    try:
        log = logging.getLogger("label_rbac.test.bounds")
        monkeypatch.setattr(log, "handlers", [logs.queued_handler(io.StringIO())])
        monkeypatch.setattr(log, "propagate", False)
        log.setLevel(logging.INFO)
        for i in range(7):
            logs.info_fields(log, "decision", {"i": i})
        log.warning("and a record")
    finally:
        logs.set_drop_observer(None)
        logs.stop()
    body, _ = metrics.render()
    assert b"label_rbac_log_lines_dropped_total 8.0" in body
