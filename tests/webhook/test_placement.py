"""Placement over the webhook's /validate: real AdmissionReview payloads, RBAC and Nodes read
from a directory of manifests as ``serve --rbac-dir`` reads them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support import binding, make_review, meta, role, rule, served

POOL = "node-restriction.kubernetes.io/pool"
PLACED = {"nodeLabels": {POOL: ["a"]}}


def objects() -> list[dict[str, Any]]:
    nodes = [
        {"apiVersion": "v1", "kind": "Node", "metadata": meta(name, labels={POOL: pool})}
        for name, pool in (("a1", "a"), ("b1", "b"))
    ]
    found = [
        role("team-a", "t1", [rule("*", "pods")], {"pods": {"team": ["a"]}}, placement=PLACED),
        binding("alice", "team-a", "User:alice", namespace="t1"),
        role("broken", "t1", [rule("*", "pods")], placement={"nodeLabels": {POOL: ["a b"]}}),
        binding("vic", "broken", "User:vic", namespace="t1"),
    ]
    return [*nodes, *(obj | {"apiVersion": "rbac.authorization.k8s.io/v1"} for _, obj in found)]


def pod_review(user: str, **spec: Any) -> dict[str, Any]:
    extra = {"spec": {"containers": [{"name": "c", "image": "nginx"}], **spec}}
    return make_review(
        user, "CREATE", "pods", namespace="t1", name="p", kind="Pod", labels={"team": "a"},
        extra_object=extra,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("review", "code", "message"),
    [
        pytest.param(pod_review("alice", nodeSelector={POOL: "a"}), None, "", id="pinned"),
        pytest.param(pod_review("alice", nodeName="a1"), None, "", id="node-in-pool"),
        pytest.param(
            pod_review("alice", nodeName="b1"), 403, f'{POOL}="b", not in [a]', id="other-node"
        ),
        pytest.param(
            pod_review("alice"), 403, f"add nodeSelector {POOL}: a (role t1/team-a", id="unpinned"
        ),
        pytest.param(
            pod_review("vic", nodeSelector={POOL: "a"}),
            403,
            "invalid labelrbac.io/placement annotation: schema violation at nodeLabels/",
            id="void-role",
        ),
    ],
)
def test_validate(tmp_path: Path, review: dict[str, Any], code: int | None, message: str) -> None:
    with served(tmp_path, objects()) as client:
        response = client.post("/validate", json=review)
    assert response.status_code == 200
    answer = response.get_json()["response"]
    assert answer["uid"] == review["request"]["uid"]
    if code is None:
        assert answer["allowed"] is True, answer
    else:
        assert answer["allowed"] is False
        assert answer["status"]["code"] == code
        assert message in answer["status"]["message"], answer


def test_a_role_write_with_an_invalid_placement_is_refused_422(tmp_path: Path) -> None:
    _, bad = role("bad", "t1", [rule("get", "pods")], placement='{"tolerations": [{}]}')
    review = make_review(
        "admin", "CREATE", "roles.rbac.authorization.k8s.io", namespace="t1", name="bad",
        kind="Role", labels={},
    )  # fmt: skip
    review["request"]["object"] = bad
    with served(tmp_path, objects()) as client:
        answer = client.post("/validate", json=review).get_json()["response"]
    assert answer["allowed"] is False and answer["status"]["code"] == 422
    assert "schema violation at tolerations/0: 'key' is a required property" in json.dumps(answer)
