"""The tier's prerequisites: what is missing is said, and a binary is used only if it checks out.

These run everywhere (no etcd or API server needed).
"""

from __future__ import annotations

import lzma
from pathlib import Path

import pytest

from tests.kube import controlplane
from tests.kube.controlplane import Unavailable


def test_a_missing_etcd_is_named_with_how_to_get_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on it
    with pytest.raises(
        Unavailable, match=r"^etcd is not on \$PATH \(apt-get install etcd-server\)$"
    ):
        controlplane.available()


def test_a_configured_binary_must_be_executable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    binary = tmp_path / "kube-apiserver"
    binary.write_text("not a program")
    monkeypatch.setenv("KUBE_APISERVER", str(binary))
    with pytest.raises(Unavailable, match="is not an executable file"):
        controlplane.apiserver_binary()
    binary.chmod(0o755)
    assert controlplane.apiserver_binary() == binary


def test_an_archive_whose_binary_does_not_match_the_published_sha256_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    archive = tmp_path / "kube-apiserver.xz"
    archive.write_bytes(lzma.compress(b"#!/bin/sh\necho tampered\n"))
    monkeypatch.delenv("KUBE_APISERVER", raising=False)
    monkeypatch.setattr(controlplane, "ARCHIVE", archive)
    monkeypatch.setattr(controlplane, "CACHE", tmp_path / "cache")
    with pytest.raises(Unavailable, match="does not have sha256 13b1632a"):
        controlplane.apiserver_binary()
    assert list((tmp_path / "cache").iterdir()) == []  # nothing half-trusted is left behind


def test_no_archive_and_no_binary_says_where_to_put_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("KUBE_APISERVER", raising=False)
    monkeypatch.setattr(controlplane, "ARCHIVE", tmp_path / "missing.xz")
    monkeypatch.setattr(controlplane, "CACHE", tmp_path / "cache")
    with pytest.raises(Unavailable, match=r"set \$KUBE_APISERVER to a v1\.36\.2 binary"):
        controlplane.apiserver_binary()
