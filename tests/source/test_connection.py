"""Connecting: kubeconfig through the official client, TLS verification, authentication."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from app.engine.policy import DEFAULT_ANNOTATION_KEY
from app.engine.rbac import Compiler
from app.settings import Settings
from app.source.api import ConfigError, KubeClient
from app.source.cluster import ClusterSource
from app.webhook.certs import CertPaths, generate
from tests.kubeapi import FakeKubeAPI, wait_until
from tests.source.helpers import FAST, TOKEN


@pytest.fixture
def certs(tmp_path: Path) -> CertPaths:
    return generate(tmp_path / "api-certs", ["127.0.0.1"])


@pytest.fixture
def tls_api(certs: CertPaths) -> Iterator[FakeKubeAPI]:
    api = FakeKubeAPI(tls=(certs.ca, certs.cert, certs.key), token=TOKEN).start()
    yield api
    api.stop()


def unsynced_status(kubeconfig: Path) -> str:
    source = ClusterSource(
        KubeClient.connect(kubeconfig), Compiler((DEFAULT_ANNOTATION_KEY,)), tuning=FAST
    )
    source.start()
    try:
        wait_until(lambda: "(" in source.status().detail, what="a failed list")
        assert source.snapshot() is None and not source.status().ready
        return source.status().detail
    finally:
        source.stop()


def test_from_settings_syncs_over_tls_before_start_returns(
    tls_api: FakeKubeAPI, tmp_path: Path
) -> None:
    settings = Settings(kubeconfig=tls_api.write_kubeconfig(tmp_path / "kubeconfig"))
    source = ClusterSource.from_settings(settings)
    started = time.monotonic()
    source.start()  # a worker only takes requests once it can answer them
    try:
        assert source.snapshot() is not None, source.status()
        assert time.monotonic() - started < 10
        assert {r.authorization for r in tls_api.recorded()} == {f"Bearer {TOKEN}"}
    finally:
        source.stop()


def test_an_unverified_server_is_not_trusted(tls_api: FakeKubeAPI, tmp_path: Path) -> None:
    kubeconfig = tls_api.write_kubeconfig(tmp_path / "kubeconfig")
    config = yaml.safe_load(kubeconfig.read_text())
    del config["clusters"][0]["cluster"]["certificate-authority"]
    kubeconfig.write_text(yaml.safe_dump(config))
    detail = unsynced_status(kubeconfig)
    assert "TLS error" in detail and "CERTIFICATE_VERIFY_FAILED" in detail
    assert tls_api.recorded() == []


def test_a_rejected_token_keeps_the_source_unready(tls_api: FakeKubeAPI, tmp_path: Path) -> None:
    kubeconfig = tls_api.write_kubeconfig(tmp_path / "kubeconfig")
    tls_api.token = "another-token"
    assert "HTTP 401 Unauthorized" in unsynced_status(kubeconfig)


def test_connection_settings_are_required(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no cluster connection"):
        KubeClient.connect()
    with pytest.raises(ConfigError, match="cannot load cluster connection settings"):
        KubeClient.connect(tmp_path / "missing")
