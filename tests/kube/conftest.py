"""Fixtures of the real-API-server tier: one control plane per session, a namespace per test.

Without etcd, kubectl or the kube-apiserver binary the tier is skipped with the reason (a
laptop); with ``LABEL_RBAC_REQUIRE_KUBE=1`` (CI) a missing prerequisite fails instead.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.kube.cluster import LabelRbacCluster
from tests.kube.controlplane import ADMIN, Unavailable, available
from tests.kube.support import fresh_namespace

REQUIRE = "LABEL_RBAC_REQUIRE_KUBE"


def require(check: Callable[[], object], what: str) -> None:
    """Skip ``what`` (or, with $LABEL_RBAC_REQUIRE_KUBE=1, fail) when ``check`` finds a
    prerequisite missing (raises ``Unavailable``)."""
    try:
        check()
    except Unavailable as exc:
        if os.environ.get(REQUIRE) == "1":
            pytest.fail(f"real kube-apiserver tier required (${REQUIRE}=1): {exc}")
        pytest.skip(f"{what}: {exc}")


def require_control_plane() -> None:
    """Skip (or, with $LABEL_RBAC_REQUIRE_KUBE=1, fail) unless a control plane can start."""
    require(available, "real kube-apiserver tier")


def _cluster(workdir: Path, **options: object) -> Iterator[LabelRbacCluster]:
    require_control_plane()
    with LabelRbacCluster(workdir, **options) as cluster:  # type: ignore[arg-type]
        yield cluster


@pytest.fixture(scope="session")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabelRbacCluster]:
    """label-rbac installed (manifests/enforce, manifests/authorization) in a loopback control
    plane, the webhook as the real server process."""
    yield from _cluster(tmp_path_factory.mktemp("kube"))


@pytest.fixture(scope="session")
def kube_node_authorizer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabelRbacCluster]:
    """The same, with label-rbac as the node authorizer (manifests/node-authorizer)."""
    yield from _cluster(tmp_path_factory.mktemp("kube-node-authorizer"), node_authorizer=True)


@pytest.fixture
def namespace(kube: LabelRbacCluster) -> Iterator[str]:
    name = fresh_namespace(kube)
    yield name
    # Without a controller manager the namespace stays Terminating: its objects are simply
    # left behind in this throwaway etcd.
    kube.kubectl(ADMIN, "delete", "namespace", name, "--wait=false")


def wait_for(
    check: Callable[[], bool], what: str, timeout: float = 30, every: float = 0.05
) -> float:
    """Seconds until ``check`` held, asked every ``every`` seconds."""
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < timeout, f"timed out waiting for {what}"
        time.sleep(every)
    return time.monotonic() - start
