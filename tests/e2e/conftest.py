"""Fixtures of the fault tests: a control plane of their own per module (they kill things)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.balancer import binary
from tests.e2e.replicas import Replicated, replicated
from tests.kube.conftest import require, require_control_plane


@pytest.fixture(scope="module")
def ha(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicated]:
    """Two replicas behind HAProxy, registered as both webhooks' URL, in a fresh control plane."""
    require_control_plane()
    require(binary, "high-availability tests")
    with replicated(tmp_path_factory.mktemp("ha")) as setup:
        yield setup
