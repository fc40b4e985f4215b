"""Enforcement modes through /validate: the AdmissionReview the API server gets, the decision
log line and the metrics, with a per-role mode from manifests and the global setting."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from app.logs import JsonFormatter
from app.settings import Settings
from app.source.static import StaticSource
from app.webhook.metrics import Metrics
from app.webhook.server import create_app
from tests.support import binding, make_review, role, rule


def rbac_dir(tmp_path: Path) -> Path:
    objects = [
        role("team-a", "t1", [rule("create", "configmaps")], {"configmaps": {"team": ["a"]}}),
        role("team-b", "t1", [rule("create", "configmaps")], {"configmaps": {"team": ["b"]}},
             mode="warn"),
        binding("alice", "team-a", "User:alice", namespace="t1"),
        binding("bob", "team-b", "User:bob", namespace="t1"),
    ]  # fmt: skip
    directory = tmp_path / "rbac"
    directory.mkdir()
    for kind, obj in objects:
        (directory / f"{kind}-{obj['metadata']['name']}.json").write_text(
            json.dumps({"apiVersion": "rbac.authorization.k8s.io/v1", **obj})
        )
    return directory


@pytest.mark.parametrize(
    ("user", "global_mode", "allowed", "mode"),
    [
        pytest.param("alice", "enforce", False, "enforce", id="enforce-role"),
        pytest.param("bob", "enforce", True, "warn", id="warn-role"),
        pytest.param("alice", "audit", True, "audit", id="global-audit"),
    ],
)
def test_validate_with_modes(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    user: str,
    global_mode: str,
    allowed: bool,
    mode: str,
) -> None:
    settings = Settings(mode=global_mode)
    source = StaticSource(rbac_dir(tmp_path), settings.compiler)
    source.start()
    metrics = Metrics()
    client = create_app(settings, source, (metrics.observe_decision,), metrics.render).test_client()
    labels = {"team": "z"}
    review = make_review(user, "CREATE", "configmaps", namespace="t1", name="c", labels=labels)
    with caplog.at_level(logging.INFO, logger="label_rbac"):
        body = client.post("/validate", json=review).get_json()
    response = body["response"]
    assert response["allowed"] is allowed
    message = f'user "{user}" may not create configmaps "c" in namespace "t1": label team="z"'
    if not allowed:
        assert response["status"]["message"].startswith(message)
        assert "auditAnnotations" not in response
    else:
        annotations = response["auditAnnotations"]
        assert annotations["mode"] == mode
        assert annotations["would-deny-reason"] == "LabelNotPermitted"
        assert annotations["would-deny"].startswith(message)
        assert ("warnings" in response) is (mode == "warn")
    (line,) = [r for r in caplog.records if r.name == "label_rbac.decisions"]
    record = json.loads(JsonFormatter().format(line))
    assert record["message"].startswith(message)
    assert record.get("mode", "enforce") == mode
    text = client.get("/metrics").get_data(as_text=True)
    sample = (
        f'allowed="{str(allowed).lower()}",mode="{mode}",operation="CREATE",'
        'reason="LabelNotPermitted",resource="configmaps"'
    )
    assert f"label_rbac_decisions_total{{{sample}}} 1.0" in text
