"""Bulk loads pause the garbage collector, always give it back as it was, and freeze what they
kept so that no later collection walks it again."""

from __future__ import annotations

import gc
import threading
import weakref
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


class Kept:
    """An object a load keeps (weak references tell when it is freed)."""

    def __init__(self) -> None:
        self.parts = [object(), object()]


def test_what_a_load_kept_is_frozen_out_of_the_collectors_sight() -> None:
    before = gc.get_freeze_count()
    with bulk_load():
        kept = [Kept() for _ in range(1000)]
    assert gc.get_freeze_count() >= before + 1000 * 2  # each object and its list at least
    walked = {id(obj) for obj in gc.get_objects()}  # what a whole collection walks
    assert not any(id(obj) in walked or id(obj.parts) in walked for obj in kept)


def test_a_frozen_object_is_still_freed_when_nothing_refers_to_it() -> None:
    with bulk_load():
        kept = Kept()
    assert gc.get_freeze_count() > 0
    gone = weakref.ref(kept)
    del kept  # as a role replaced by the watch is dropped: reference counting frees it
    assert gone() is None


def test_cycles_made_after_a_load_are_still_collected() -> None:
    with bulk_load():
        pass
    cycle = Kept()
    cycle.parts.append(cycle)
    gone = weakref.ref(cycle)
    del cycle
    assert gone() is not None  # only the collector can free a cycle
    gc.collect()
    assert gone() is None
