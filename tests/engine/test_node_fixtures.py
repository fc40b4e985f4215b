"""Recorded kube-apiserver traffic through the whole engine: what a node-restriction webhook sees.

Run "b" had the in-tree NodeRestriction off, so every kubelet request reached the webhook. The
snapshot is built from objects recorded in that run (the annotated kube-system Namespace and both
Nodes); the lookup serves pod ``default/app`` as it was created.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from app.engine.context import Context, ParentUnavailable
from app.engine.decide import evaluate
from app.engine.model import Decision, Request
from app.engine.rbac import Snapshot
from app.webhook.wire import parse_review
from tests.support import REVIEWS, load_review, snapshot

# Fixture → None when it must be allowed, else a part of the denial message.
EXPECTED: Mapping[str, str | None] = {
    "b001-update-namespaces": None,
    "b002-create-nodes": None,
    "b003-create-nodes": None,
    "b004-update-nodes": 'node "node1" is not allowed to modify labels: node-role.kubernetes.io/',
    "b005-update-nodes": 'node "node1" is not allowed to modify node "node2"',
    "b006-update-nodes-status": None,
    "b007-create-pods": "can not create mirror pods with labels k8s-app",
    "b008-create-pods": None,
    "b009-update-pods-status": None,
    "b010-update-pods-status": 'node "node1" cannot update labels through pod status',
    "b011-delete-pods": None,
    "b012-create-pods-eviction": None,
}


def recorded(name: str, which: str = "object") -> tuple[str, dict[str, Any]]:
    """A ``(kind, object)`` pair for the snapshot, as stored by the recorded request."""
    obj = load_review(name)["request"][which]
    return obj["kind"], obj


RUN_B = snapshot(
    recorded("b001-update-namespaces"),
    recorded("b002-create-nodes"),
    recorded("b003-create-nodes"),
)
APP = recorded("b008-create-pods")[1]


def lookup(request: Request) -> Mapping[str, Any]:
    if (request.namespace, request.name) == ("default", "app"):
        return APP
    raise ParentUnavailable(f'pod "{request.name}" in namespace "{request.namespace}" not found')


def decide(name: str, snap: Snapshot = RUN_B, **context: Any) -> Decision:
    return evaluate(parse_review(load_review(name)).request, Context(snap, **context))


def test_every_run_b_fixture_is_covered() -> None:
    assert sorted(path.stem for path in REVIEWS.glob("b0*.json")) == sorted(EXPECTED)


def test_snapshot_holds_the_recorded_namespace_and_nodes() -> None:
    assert RUN_B.namespaces["kube-system"]["node.kubernetes.io/mirror.allowed-label-keys"] == (
        "component,tier"
    )
    assert RUN_B.nodes["node1"].uid == "8aefcc65-67a5-4183-8f8a-9a9f69d9145e"
    assert set(RUN_B.nodes) == {"node1", "node2"}


@pytest.mark.parametrize(
    ("name", "refused"), [pytest.param(n, r, id=n) for n, r in EXPECTED.items()]
)
def test_run_b(name: str, refused: str | None) -> None:
    decision = decide(name, lookup=lookup)
    if refused is None:
        assert decision.allowed, decision.message
    else:
        assert (decision.allowed, decision.code, decision.reason) == (False, 403, "NodeRestriction")
        assert refused in decision.message


def test_eviction_without_pod_lookup_is_refused() -> None:
    decision = decide("b012-create-pods-eviction")  # the default: no cluster access
    assert (decision.allowed, decision.code, decision.reason) == (False, 403, "ParentUnavailable")
    assert decision.message.startswith(
        'node "node1" can only evict pods with spec.nodeName set to itself, and pod "app" in '
        'namespace "default" could not be read to check it: '
    )


def test_run_a_mirror_pod_refused_without_namespace_annotation() -> None:
    # a016 is b007's pod from the run where kube-system was never annotated.
    run_a = snapshot(
        ("Namespace", {"metadata": {"name": "kube-system"}}), recorded("a015-create-nodes")
    )
    decision = decide("a016-create-pods", run_a)
    assert not decision.allowed
    assert 'the namespace has no "node.kubernetes.io/mirror.allowed-label-keys" annotation' in (
        decision.message
    )
