"""The reporter's passes: the first judges every namespace, later ones only the namespaces a
change touched, keeping the others' reports as rendered (no API server: the caches are stubs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from app.engine.model import Resource
from app.reports.controller import SYSTEM_NAMESPACES, Labeled, Options, Reporter, Stored
from app.settings import Settings
from app.source.api import KubeClient
from tests.support import binding, role, rule, snapshot

CONFIGMAPS = Resource("", "configmaps")
SNAPSHOT = snapshot(
    *(item for ns in ("t1", "t2") for item in (
        role("team-a", ns, [rule("update", "configmaps")], {"configmaps": {"team": ["a"]}}),
        binding("alice", "team-a", "User:alice", namespace=ns),
    )),
)  # fmt: skip


class StubInformer:
    """A synced cache of configmaps, recording which namespaces each pass asked for."""

    synced, last_error = True, ""

    def __init__(self) -> None:
        self.items = {"t1/ok": Labeled("t1", {"team": "a"}), "t2/stray": Labeled("t2", {})}
        self.asked: list[frozenset[str] | None] = []

    def objects(self, namespaces: frozenset[str] | None = None) -> list[tuple[str, Labeled]]:
        self.asked.append(namespaces)
        return [(key.partition("/")[2], kept) for key, kept in self.items.items()
                if namespaces is None or kept.namespace in namespaces]  # fmt: skip


@pytest.fixture
def reporter(tmp_path: Path) -> tuple[Reporter, StubInformer]:
    client = KubeClient.__new__(KubeClient)  # never asked: nothing is started
    found = Reporter(client, Settings(), lease=None, options=Options())  # type: ignore[arg-type]
    found.source.snapshot = lambda: SNAPSHOT  # type: ignore[method-assign]
    informer = StubInformer()
    found._informers = {CONFIGMAPS: informer}  # type: ignore[dict-item]
    return found, informer


def failing(due: dict[Any, Any], namespace: str) -> list[str]:
    (body, _), *_ = [v for k, v in due.items() if k[1] == namespace and "policyreports" in k[0]]
    return [r["resources"][0]["name"] for r in body["results"] if r["result"] == "fail"]


def test_a_change_rejudges_only_its_namespace(reporter: tuple[Reporter, StubInformer]) -> None:
    found, informer = reporter
    first = found.render()
    assert first is not None and informer.asked == [None]  # every namespace, once
    assert failing(first, "t2") == ["stray"] and failing(first, "t1") == []
    informer.items["t1/bad"] = Labeled("t1", {"team": "b"})
    found._object_changed(None, informer.items["t1/bad"])
    second = found.render()
    assert second is not None and informer.asked[-1] == frozenset({"t1"})
    assert failing(second, "t1") == ["bad"]
    t2 = [k for k in first if k[1] == "t2"]
    assert all(second[k] is first[k] for k in t2)  # t2's reports are kept, not rendered again
    third = found.render()  # nothing changed: nothing judged but the cluster scope's errors
    assert third is not None and informer.asked[-1] == frozenset()
    assert {k: v[1] for k, v in third.items()} == {k: v[1] for k, v in second.items()}


def test_an_rbac_change_rejudges_the_namespaces_it_reaches(
    reporter: tuple[Reporter, StubInformer],
) -> None:
    found, informer = reporter
    assert found.render() is not None
    old = next(r for r in SNAPSHOT.roles.values() if r.ref.namespace == "t2")
    found._applied(SNAPSHOT_LIVE, [("Role", old, old)])
    assert found.render() is not None
    assert informer.asked[-1] == frozenset({"t2"})


class _Live:
    """What ``params.touched`` reads of the state after a change."""

    snapshot = SNAPSHOT


SNAPSHOT_LIVE: Any = _Live()


def test_system_namespaces_are_left_out(reporter: tuple[Reporter, StubInformer]) -> None:
    """Not judged, not reported: no report in kube-system for its unlabeled objects."""
    found, informer = reporter
    informer.items["kube-system/coredns"] = Labeled("kube-system", {})
    informer.items["label-rbac/own"] = Labeled("label-rbac", {})
    for excluded, reported in [
        (SYSTEM_NAMESPACES | {"label-rbac"}, {"t1", "t2"}),  # the command's default
        (frozenset(), {"t1", "t2", "kube-system", "label-rbac"}),  # --include-system-namespaces
    ]:
        options = Options(excluded=frozenset(excluded))
        judged = Reporter(found._client, Settings(), None, options)  # type: ignore[arg-type]
        judged.source.snapshot = lambda: SNAPSHOT  # type: ignore[method-assign]
        judged._informers = found._informers
        due = judged.render()
        assert due is not None and {k[1] for k in due} == reported


def test_a_stored_report_changed_by_another_is_written_again(
    reporter: tuple[Reporter, StubInformer],
) -> None:
    """Only the version our own write returned is ours: any other, or a deletion, makes the
    report due again."""
    found, _ = reporter
    key = ("wgpolicyk8s.io/v1alpha2/policyreports", "t1", "label-rbac")
    found._written[key], found._versions[key] = b"digest", "10"
    found._dirty.clear()
    found._stored_changed(None, Stored(key, "10"))  # our own write, seen by the watch
    assert found._written[key] == b"digest" and not found._dirty.is_set()
    found._stored_changed(Stored(key, "10"), Stored(key, "11"))  # someone else's
    assert key not in found._written and found._dirty.is_set()
    found._written[key], found._versions[key] = b"digest", "12"
    found._dirty.clear()
    found._stored_changed(Stored(key, "12"), None)  # deleted, or its label taken off
    assert key not in found._written and found._dirty.is_set()
