"""Fixtures for the cluster source: a fake API server on loopback and sources connected to it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.engine.policy import DEFAULT_ANNOTATION_KEY
from app.engine.rbac import Compiler
from app.source.api import KubeClient
from app.source.cluster import ClusterSource
from tests.kubeapi import FakeKubeAPI
from tests.source.helpers import FAST, TOKEN, MakeSource


@pytest.fixture
def kubeapi() -> Iterator[FakeKubeAPI]:
    api = FakeKubeAPI(token=TOKEN).start()
    yield api
    api.stop()


@pytest.fixture
def make_source(kubeapi: FakeKubeAPI, tmp_path: Path) -> Iterator[MakeSource]:
    """Connect a ``ClusterSource`` to the fake through a generated kubeconfig and start it."""
    sources: list[ClusterSource] = []

    def make(
        api: FakeKubeAPI = kubeapi, *, start: bool = True, sync: bool = True, **options: Any
    ) -> ClusterSource:
        tuning = options.pop("tuning", FAST)
        kubeconfig = api.write_kubeconfig(tmp_path / f"kubeconfig-{len(sources)}")
        source = ClusterSource(
            KubeClient.connect(kubeconfig),
            Compiler((DEFAULT_ANNOTATION_KEY,)),
            tuning=tuning,
            **options,
        )
        sources.append(source)
        if start:
            source.start()
            if sync:
                assert source.wait_synced(15), source.status()
        return source

    yield make
    for source in sources:
        source.stop()
