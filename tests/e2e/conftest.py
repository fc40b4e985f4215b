"""Fixtures of the fault tests: a control plane of their own per module (they kill things)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.e2e.balancer import binary
from tests.e2e.replicas import Replicated, replicated
from tests.kube.conftest import REQUIRE, require_control_plane
from tests.kube.controlplane import Unavailable


def require_balancer() -> None:
    try:
        binary()
    except Unavailable as exc:
        if os.environ.get(REQUIRE) == "1":
            pytest.fail(f"real kube-apiserver tier required (${REQUIRE}=1): {exc}")
        pytest.skip(f"high-availability tests: {exc}")


@pytest.fixture(scope="module")
def ha(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicated]:
    """Two replicas behind HAProxy, registered as both webhooks' URL, in a fresh control plane."""
    require_control_plane()
    require_balancer()
    with replicated(tmp_path_factory.mktemp("ha")) as setup:
        yield setup
