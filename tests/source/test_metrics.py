"""Metrics: what the source and the decisions report, /metrics, and gunicorn's multiprocess mode."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.engine.context import ParentUnavailable
from app.settings import Settings
from app.source.static import StaticSource
from app.webhook.metrics import Metrics
from app.webhook.serve import multiprocess_dir
from app.webhook.server import create_app
from tests.kubeapi import FakeKubeAPI, wait_until
from tests.source.helpers import METRIC_NAMES, MakeSource, exec_request
from tests.support import ROOT, lint_metric_family, make_review


def test_source_reports_cache_watches_and_lookups(
    kubeapi: FakeKubeAPI, make_source: MakeSource
) -> None:
    metrics = Metrics()
    sample = metrics.registry.get_sample_value
    source = make_source(observer=metrics)
    assert sample("label_rbac_cache_synced") == 1
    assert sample("label_rbac_cache_objects", {"kind": "ClusterRole"}) == 62
    assert sample("label_rbac_cache_objects", {"kind": "Node"}) == 2
    heard = sample("label_rbac_last_event_timestamp_seconds", {"kind": "Role"})
    assert heard is not None and abs(time.time() - heard) < 60

    wait_until(lambda: kubeapi.open_watches("roles"), what="roles watch")
    kubeapi.expire_watches("roles")
    restarts = {"kind": "Role", "cause": "expired"}
    wait_until(lambda: sample("label_rbac_watch_restarts_total", restarts), what="restart")

    with pytest.raises(ParentUnavailable):
        source.fetch_parent(exec_request())
    assert sample("label_rbac_parent_lookups_total", {"resource": "pods", "result": "404"}) == 1

    text = metrics.render()[0].decode()
    for name in METRIC_NAMES[2:]:
        assert name in text, name
    assert 'label_rbac_last_event_age_seconds{kind="Role"}' in text
    families = list(text_string_to_metric_families(text))
    assert [p for f in families for p in lint_metric_family(f)] == []


def test_metrics_endpoint_counts_decisions(make_source: MakeSource) -> None:
    metrics = Metrics()
    source = make_source(observer=metrics)
    app = create_app(Settings(), source, (metrics.observe_decision,), metrics.render)
    client = app.test_client()
    review = make_review("alice", "CREATE", "configmaps", namespace="default", labels={"team": "b"})
    assert client.post("/validate", json=review).json["response"]["allowed"] is False
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.content_type.startswith("text/plain")
    text = response.get_data(as_text=True)
    denied = (
        '{allowed="false",mode="enforce",operation="CREATE",reason="LabelNotPermitted",'
        'resource="configmaps"}'
    )
    assert f"label_rbac_decisions_total{denied} 1.0" in text
    assert "label_rbac_decision_seconds_count 1.0" in text


def test_metrics_endpoint_by_default() -> None:
    """``create_app(settings, source)`` alone serves /metrics (this process's registry)."""
    examples = ROOT / "manifests" / "examples"
    source = StaticSource(examples, Settings().compiler)
    source.start()
    response = create_app(Settings(rbac_dir=examples), source).test_client().get("/metrics")
    assert response.status_code == 200 and response.content_type.startswith("text/plain")


def test_prometheus_client_is_not_imported_before_the_workers() -> None:
    """Its multiprocess mode is fixed at import, which must follow PROMETHEUS_MULTIPROC_DIR."""
    code = (
        "import sys, app.cli, app.webhook.serve, app.webhook.server; "
        "print('prometheus_client' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.stdout.strip() == "False", result.stderr


def test_multiprocess_dir_is_temporary_unless_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    with multiprocess_dir() as made:
        assert os.environ["PROMETHEUS_MULTIPROC_DIR"] == str(made) and made.is_dir()
    assert not made.exists() and "PROMETHEUS_MULTIPROC_DIR" not in os.environ

    given = tmp_path / "metrics"
    given.mkdir()
    (given / "counter_123.db").write_bytes(b"left over")
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(given))
    with multiprocess_dir() as used:
        assert used == given and not list(given.iterdir())
    assert given.is_dir()


def test_workers_add_up_and_dead_workers_leave_live_gauges(tmp_path: Path) -> None:
    """Two forked "workers" write; a third process renders, as /metrics does under gunicorn."""
    script = textwrap.dedent(
        """
        import json, os
        from app.webhook.metrics import Metrics, mark_worker_dead, render

        pids = []
        for objects in (3, 5):
            pid = os.fork()
            if pid == 0:
                metrics = Metrics()
                metrics.cache_objects("Role", objects)
                metrics.synced(True)
                metrics.decisions.labels(
                    "true", "enforce", "CREATE", "Unrestricted", "configmaps"
                ).inc()
                os._exit(0)
            os.waitpid(pid, 0)
            pids.append(pid)
        before = render()[0].decode()
        mark_worker_dead(pids[1])
        print(json.dumps([before, render()[0].decode()]))
        """
    )
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    before, after = json.loads(result.stdout)
    unrestricted = (
        'label_rbac_decisions_total{allowed="true",mode="enforce",operation="CREATE",'
        'reason="Unrestricted",resource="configmaps"}'
    )
    assert f"{unrestricted} 2.0" in before
    assert 'label_rbac_cache_objects{kind="Role"} 5.0' in before
    assert 'label_rbac_cache_objects{kind="Role"} 3.0' in after
    assert f"{unrestricted} 2.0" in after
