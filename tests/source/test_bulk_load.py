"""Bulk loads pause the garbage collector and always give it back as it was."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.engine.rbac import Compiler
from app.source.base import bulk_load
from app.source.static import StaticSource


@pytest.fixture(autouse=True)
def collector_on() -> Iterator[None]:
    gc.enable()
    yield
    gc.enable()


def test_the_collector_is_paused_during_a_load_and_back_after_it() -> None:
    with bulk_load():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_overlapping_loads_resume_the_collector_when_the_last_ends() -> None:
    first_in, second_done, results = threading.Event(), threading.Event(), []

    def first() -> None:
        with bulk_load():
            first_in.set()
            second_done.wait(5)
            results.append(gc.isenabled())  # the other load ended: still paused for this one

    thread = threading.Thread(target=first)
    thread.start()
    first_in.wait(5)
    with bulk_load():
        assert not gc.isenabled()
    second_done.set()
    thread.join()
    assert results == [False]
    assert gc.isenabled()


def test_a_failing_load_resumes_the_collector() -> None:
    with pytest.raises(RuntimeError), bulk_load():
        raise RuntimeError("list failed")
    assert gc.isenabled()


def test_a_collector_switched_off_before_stays_off() -> None:
    gc.disable()
    with bulk_load():
        pass
    assert not gc.isenabled()


def test_a_static_load_runs_paused_and_resumes(tmp_path: Path) -> None:
    seen = []

    class Watching(Compiler):
        def role(self, obj, kind=None):  # type: ignore[no-untyped-def]
            seen.append(gc.isenabled())
            return super().role(obj, kind)

    (tmp_path / "role.yaml").write_text(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\n"
        "metadata: {name: r, namespace: t1}\nrules: []\n"
    )
    source = StaticSource(tmp_path, Watching(("labelrbac.io/permissions",)))
    source.start()
    snapshot = source.snapshot()
    assert snapshot is not None and len(snapshot.roles) == 1
    assert seen == [False] and gc.isenabled()
