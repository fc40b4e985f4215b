"""Recorded kubelet SubjectAccessReviews (kube-apiserver v1.35, no in-tree Node authorizer) through
the node authorizer, with the graph built from the recording's pods.

Pod ``t1/web-a`` is the one the API server stored (the ``oldObject`` of the recorded pods/status
update): on node1, secret volume ``s-ref``, envFrom configmap ``cm-a``, and no service account
(that recording ran without the ServiceAccount admission plugin, so the token request of c049 is
related to nothing and the in-tree authorizer would refuse it too). ``t1/web-b`` runs on node2.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import pytest

from app.engine.context import Context
from app.engine.model import Access, Verdict
from app.engine.nodeauthz import check_node_read
from app.engine.nodegraph import NodeGraph, compile_pod
from app.webhook.wire_sar import parse_access_review
from tests.support import ACCESS_REVIEWS, V135_REVIEWS, load_access_review, pod, snapshot

WEB_A = json.loads((V135_REVIEWS / "c048-node-update-pods-status.json").read_text())["request"][
    "oldObject"
]
GRAPH = NodeGraph.from_objects([("Pod", WEB_A), ("Pod", pod("web-b", node="node2"))])
CTX = Context(snapshot(), nodes=GRAPH)
NO_RELATIONSHIP = "no relationship found between node 'node1' and this object"

# Fixture → (verdict, part of the message); None: the node authorizer has no opinion.
EXPECTED: Mapping[str, tuple[Verdict, str] | None] = {
    "c039-node-get-secrets": (Verdict.ALLOW, ""),
    "c040-node-get-secrets": (Verdict.DENY, NO_RELATIONSHIP),
    "c041-node-get-configmaps": (Verdict.ALLOW, ""),
    "c042-node-list-pods": (Verdict.ALLOW, ""),
    "c043-node-list-pods": (
        Verdict.DENY,
        "can only list/watch pods with spec.nodeName field selector",
    ),
    "c044-node-get-nodes": (Verdict.ALLOW, ""),
    "c045-node-get-nodes": (
        Verdict.DENY,
        "node 'node1' cannot read 'node2', only its own Node object",
    ),
    "c046-node-list-nodes": (Verdict.ALLOW, ""),
    "c047-node-patch-pods-status": (Verdict.ALLOW, ""),
    "c049-node-create-serviceaccounts-token": (Verdict.DENY, NO_RELATIONSHIP),
}


def access_of(name: str) -> Access | None:
    """The recorded review as an ``Access`` (None for a non-resource request)."""
    return parse_access_review(load_access_review(name)).access


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_recorded_node_requests(name: str) -> None:
    req = access_of(name)
    assert req is not None
    decision = check_node_read(req, CTX)
    expected = EXPECTED[name]
    assert expected is not None and decision is not None
    assert decision.verdict is expected[0], decision
    assert expected[1] in decision.message


def test_every_recorded_node_review_is_covered() -> None:
    recorded = {p.stem for p in ACCESS_REVIEWS.glob("c*-node-*.json")}
    assert recorded - set(EXPECTED) == {"c050-node-get-nonresource"}
    assert access_of("c050-node-get-nonresource") is None


@pytest.mark.parametrize("name", sorted(p.stem for p in ACCESS_REVIEWS.glob("c*-tenant-*.json")))
def test_tenant_reviews_are_not_the_node_authorizers_business(name: str) -> None:
    req = access_of(name)
    if req is not None:
        assert check_node_read(req, CTX) is None


def test_the_recorded_pod_moving_away_takes_its_secret_along() -> None:
    graph = NodeGraph.from_objects([("Pod", WEB_A)])
    ctx = Context(snapshot(), nodes=graph)
    req = access_of("c039-node-get-secrets")
    assert req is not None
    decision = check_node_read(req, ctx)
    assert decision is not None and decision.verdict is Verdict.ALLOW
    moved = {**WEB_A, "spec": {**WEB_A["spec"], "nodeName": "node2"}}
    graph.update_pod(compile_pod(WEB_A), compile_pod(moved))
    decision = check_node_read(req, ctx)
    assert decision is not None and decision.verdict is Verdict.DENY
