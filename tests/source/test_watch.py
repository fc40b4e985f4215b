"""The informers against a real HTTP server speaking list/watch: sync, events, 410, lost streams."""

from __future__ import annotations

import json
import logging
import socket
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from app.engine.model import UserInfo
from app.engine.nodegraph import NodeGraph
from app.engine.rbac import RoleRef, Snapshot
from app.source.api import KubeClient, WatchStream
from app.source.informer import Tuning
from tests.kubeapi import FakeKubeAPI, wait_until
from tests.source.helpers import FAST, TOKEN, MakeSource, bindings_of, informer, rolebinding
from tests.support import API


def test_snapshot_is_none_until_every_kind_is_listed(
    kubeapi: FakeKubeAPI, make_source: MakeSource
) -> None:
    source = make_source(start=False)
    assert source.snapshot() is None
    assert not source.status().ready
    source.start()
    assert source.wait_synced(15)
    snapshot = source.snapshot()
    assert isinstance(snapshot, Snapshot)
    assert len([r for r in snapshot.roles if r.namespace]) == 8
    assert len([r for r in snapshot.roles if not r.namespace]) == 62
    assert bindings_of(source, "alice") == {"tenant-a"}
    assert snapshot.namespaces["kube-system"] == {
        "node.kubernetes.io/mirror.allowed-label-keys": "component,tier"
    }
    assert set(snapshot.nodes) == {"node1", "node2"}
    role = snapshot.roles[RoleRef("default", "tenant-a")]
    assert role.permissions is not None and role.version == "210"
    status = source.status()
    assert status.ready and status.stale_seconds is None
    assert "8 roles, 62 clusterroles, 8 rolebindings, 44 clusterrolebindings" in status.detail


def test_requests_are_authenticated_gets_and_watches_ask_for_bookmarks(
    kubeapi: FakeKubeAPI, make_source: MakeSource
) -> None:
    # Every collection the fake serves is watched; the registration by name.
    make_source(node_graph=NodeGraph(), webhook_configuration="label-rbac")
    for resource in kubeapi.collections:
        wait_until(lambda r=resource: kubeapi.recorded(r, watch=True), what=f"{resource} watch")
    requests = kubeapi.recorded()
    assert {r.method for r in requests} == {"GET"}
    assert {r.authorization for r in requests} == {f"Bearer {TOKEN}"}
    for resource in kubeapi.collections:
        (listed,) = kubeapi.recorded(resource, watch=False)
        named = {"fieldSelector": "metadata.name=label-rbac"}
        selector = named if resource == "validatingwebhookconfigurations" else {}
        assert listed.query == {**selector, "limit": "500"}
        watch = kubeapi.recorded(resource, watch=True)[0].query
        assert {k: watch[k] for k in selector} == selector
        assert watch["resourceVersion"] == "212"
        assert watch["allowWatchBookmarks"] == "true"
        assert 300 <= int(watch["timeoutSeconds"]) <= 450


def test_lists_are_paged(kubeapi: FakeKubeAPI, make_source: MakeSource) -> None:
    source = make_source(tuning=replace(FAST, page_size=10))
    snapshot = source.snapshot()
    assert snapshot is not None
    assert len([r for r in snapshot.roles if not r.namespace]) == 62
    pages = kubeapi.recorded("clusterroles", watch=False)
    assert [p.query.get("continue", "") for p in pages] == ["", *map(str, range(10, 61, 10))]


def test_a_list_is_reduced_page_by_page(kubeapi: FakeKubeAPI, tmp_path: Path) -> None:
    """``list_each`` hands each item over as its page arrives, before the next page is asked
    for, so an informer holds compiled objects, not a whole list of raw ones."""
    client = KubeClient.connect(kubeapi.write_kubeconfig(tmp_path / "kubeconfig"))
    path = "/apis/rbac.authorization.k8s.io/v1/clusterroles"
    pages_when_seen: list[int] = []

    def each(item: dict[str, Any]) -> str:
        pages_when_seen.append(len(kubeapi.recorded("clusterroles", watch=False)))
        return str(item["metadata"]["name"])

    names, version = client.list_each(path, 10, (2, 5), each)
    items, same_version = client.list(path, 10, (2, 5))
    assert names == [i["metadata"]["name"] for i in items] and len(names) == 62
    assert version == same_version
    # Items 1-10 were seen when one page had been requested, 11-20 at two, ... 61-62 at seven.
    assert pages_when_seen == [n // 10 + 1 for n in range(62)]


def test_recorded_watch_stream_added_modified_deleted_bookmark(
    kubeapi: FakeKubeAPI, make_source: MakeSource
) -> None:
    source = make_source()
    bindings = informer(source, "RoleBinding")
    lines = (API / "watch-rolebindings.jsonl").read_text().splitlines()
    added, modified, deleted, bookmark = lines

    kubeapi.replay("rolebindings", [added])
    wait_until(lambda: "bob-edit" in bindings_of(source, "bob"), what="ADDED")
    snapshot = source.snapshot()
    assert snapshot is not None
    # (The recorded cluster ran no controller-manager: aggregated "edit" has no rules.)
    pairs = snapshot.roles_for(UserInfo("bob"), "default")
    assert [(str(b), str(r.ref)) for b, r in pairs] == [
        ("rolebinding default/bob-edit", "clusterrole edit")
    ]
    assert bindings.resource_version == "214"

    kubeapi.replay("rolebindings", [modified])
    wait_until(lambda: bindings.resource_version == "215", what="MODIFIED")
    assert "bob-edit" in bindings_of(source, "bob")

    kubeapi.replay("rolebindings", [deleted])
    wait_until(lambda: "bob-edit" not in bindings_of(source, "bob"), what="DELETED")
    assert len(bindings) == 8

    kubeapi.replay("rolebindings", [bookmark])
    wait_until(lambda: bindings.resource_version == "216", what="BOOKMARK")
    # A reconnect resumes from the bookmark's version, without a re-list.
    kubeapi.end_watches("rolebindings")
    wait_until(lambda: len(kubeapi.recorded("rolebindings", watch=True)) == 2, what="re-watch")
    assert kubeapi.recorded("rolebindings", watch=True)[-1].query["resourceVersion"] == "216"
    assert len(kubeapi.recorded("rolebindings", watch=False)) == 1


def test_the_fake_sends_bookmarks_as_the_api_server_does(
    kubeapi: FakeKubeAPI, tmp_path: Path
) -> None:
    """Shaped as the recorded one; only when asked for; the last one just before the timeout;
    and a watch from a version compacted away gets ERROR 410."""
    recorded = json.loads((API / "watch-rolebindings.jsonl").read_text().splitlines()[-1])
    client = KubeClient.connect(kubeapi.write_kubeconfig(tmp_path / "kubeconfig"))
    path = "/apis/rbac.authorization.k8s.io/v1/rolebindings"
    try:
        kubeapi.bookmark_interval = 0.2
        events = list(client.watch(path, str(kubeapi.rv), 1, (2, 5)))
        assert len(events) >= 3 and {e["type"] for e in events} == {"BOOKMARK"}
        first, last = events[0], events[-1]
        assert first["object"].keys() >= {"kind", "apiVersion", "metadata"}
        for key in ("kind", "apiVersion"):
            assert first["object"][key] == recorded["object"][key]
        assert first["object"]["metadata"].keys() == recorded["object"]["metadata"].keys()
        assert last["object"]["metadata"]["resourceVersion"] == str(kubeapi.rv)

        asked = kubeapi.recorded("rolebindings", watch=True)
        assert asked[-1].query["allowWatchBookmarks"] == "true"
        stream = client._open(path, [("watch", "true"), ("resourceVersion", str(kubeapi.rv)),
                                     ("timeoutSeconds", "1")], (2, 5))  # fmt: skip
        assert list(WatchStream(stream)) == []  # not asked: none

        old = str(kubeapi.rv)
        kubeapi.apply("rolebindings", rolebinding("kim-a", "kim"))
        kubeapi.compact()  # keeps the history since the previous compaction
        kubeapi.compact()  # now drops it
        (error,) = client.watch(path, old, 1, (2, 5))
        assert error["type"] == "ERROR" and error["object"]["code"] == 410
    finally:
        client.close()


def test_server_bookmarks_move_the_version_and_change_nothing(
    kubeapi: FakeKubeAPI, make_source: MakeSource
) -> None:
    kubeapi.bookmark_interval = 0.1
    source = make_source()
    before = source.snapshot()
    bindings = informer(source, "RoleBinding")
    # The version moves on elsewhere (another kind, or a change this watch never reports).
    kubeapi.change_silently("rolebindings", rolebinding("ivan-a", "ivan"))
    version = str(kubeapi.rv)
    wait_until(lambda: bindings.resource_version == version, what="a bookmark")
    assert kubeapi.bookmarks_sent
    time.sleep(0.1)  # (proving an absence: give a rebuild ample time to happen)
    # Not an object: nothing cached, nothing rebuilt, nothing listed.
    assert len(bindings) == 8
    assert source.snapshot() is before
    assert "ivan-a" not in bindings_of(source, "ivan")
    assert len(kubeapi.recorded("rolebindings", watch=False)) == 1


# The kinds that do not change in the test below.
QUIET = ("roles", "clusterroles", "clusterrolebindings", "namespaces", "nodes")


@pytest.mark.parametrize(
    ("bookmarks", "relisted"),
    [
        pytest.param(True, set(), id="bookmarks-no-list"),
        # Control: without bookmarks a kind that does not change resumes from its list's
        # version, which compaction has dropped: 410 and a list at every renewal.
        pytest.param(False, set(QUIET), id="no-bookmarks-quiet-kinds-relist"),
    ],
)
def test_a_long_healthy_watch_costs_no_list(
    kubeapi: FakeKubeAPI, make_source: MakeSource, bookmarks: bool, relisted: set[str]
) -> None:
    """Many server-side timeouts, history compacted under churn: with the default tuning (no
    periodic re-list) each kind is listed once and then only watched."""
    kubeapi.bookmarks = bookmarks
    kubeapi.bookmark_interval = 0.3
    tuning = replace(Tuning(), watch_timeout=1, backoff_initial=0.02, backoff_max=0.2)
    assert tuning.resync_interval == 0
    source = make_source(tuning=tuning)
    rounds = 0
    # Changes to RoleBindings only, each followed by a compaction of the history.
    while min(len(kubeapi.recorded(r, watch=True)) for r in QUIET) < 4:
        rounds += 1
        assert rounds < 200, "watches were not renewed"
        kubeapi.apply("rolebindings", rolebinding(f"churn-{rounds % 5}", f"user-{rounds}"))
        kubeapi.compact()
        time.sleep(0.05)
    kubeapi.apply("rolebindings", rolebinding("last", "judy"))
    wait_until(lambda: "last" in bindings_of(source, "judy"), what="the last change")
    lists = {r: len(kubeapi.recorded(r, watch=False)) for r in (*QUIET, "rolebindings")}
    assert {r for r, n in lists.items() if n > 1} == relisted, lists
    assert lists["rolebindings"] == 1  # its events keep its version recent
    assert source.status().ready


def test_http_410_on_watch_relists(kubeapi: FakeKubeAPI, make_source: MakeSource) -> None:
    source = make_source()
    # A change the watch will never report, then a watch that finds its version expired.
    kubeapi.change_silently("rolebindings", rolebinding("carol-a", "carol"))
    kubeapi.fail_next_watch("rolebindings", 410)
    kubeapi.end_watches("rolebindings")
    wait_until(lambda: "carol-a" in bindings_of(source, "carol"), what="re-list after 410")
    assert len(kubeapi.recorded("rolebindings", watch=False)) == 2
    # And watching resumes from the new list's version.
    version = str(kubeapi.rv)
    wait_until(
        lambda: (
            kubeapi.recorded("rolebindings", watch=True)[-1].query["resourceVersion"] == version
        ),
        what="watch from the re-list",
    )
    assert source.status().ready


def test_error_event_410_relists(kubeapi: FakeKubeAPI, make_source: MakeSource) -> None:
    source = make_source()
    wait_until(lambda: kubeapi.open_watches("roles"), what="roles watch")
    kubeapi.remove_silently("roles", "tenant-a", "default")
    kubeapi.expire_watches("roles")
    wait_until(
        lambda: RoleRef("default", "tenant-a") not in (source.snapshot() or Snapshot({}, {})).roles,
        what="re-list after ERROR 410",
    )
    assert len(kubeapi.recorded("roles", watch=False)) == 2
    # The binding to the vanished role now grants nothing.
    assert bindings_of(source, "alice") == set()


def test_stream_cut_mid_event_resumes_without_loss(
    kubeapi: FakeKubeAPI, make_source: MakeSource
) -> None:
    source = make_source()
    wait_until(lambda: kubeapi.open_watches("rolebindings"), what="watch")
    kubeapi.cut_next_event("rolebindings")
    kubeapi.apply("rolebindings", rolebinding("dave-a", "dave"))
    wait_until(lambda: "dave-a" in bindings_of(source, "dave"), what="the cut event, replayed")
    watches = kubeapi.recorded("rolebindings", watch=True)
    assert len(watches) == 2
    assert watches[1].query["resourceVersion"] == "212"  # resumed, not re-listed
    assert len(kubeapi.recorded("rolebindings", watch=False)) == 1


def test_server_timeout_rewatches_from_last_version(
    kubeapi: FakeKubeAPI, make_source: MakeSource
) -> None:
    source = make_source(tuning=replace(FAST, watch_timeout=1))
    rv = kubeapi.apply("rolebindings", rolebinding("erin-a", "erin"))
    wait_until(lambda: "erin-a" in bindings_of(source, "erin"), what="event")
    wait_until(
        lambda: any(
            w.query["resourceVersion"] == str(rv)
            for w in kubeapi.recorded("rolebindings", watch=True)
        ),
        what="a re-watch after the server-side timeout",
    )
    assert len(kubeapi.recorded("rolebindings", watch=False)) == 1


def test_unknown_event_types_are_skipped_and_bodies_never_logged(
    kubeapi: FakeKubeAPI, make_source: MakeSource, caplog: pytest.LogCaptureFixture
) -> None:
    source = make_source()
    secret = "s3cr3t-value-in-an-object"
    odd = {"type": "SURPRISE", "object": {"metadata": {"name": "x"}, "data": {"k": secret}}}
    with caplog.at_level(logging.DEBUG, logger="label_rbac"):
        kubeapi.inject("rolebindings", json.dumps(odd).encode())
        kubeapi.apply("rolebindings", rolebinding("frank-a", "frank"))
        wait_until(lambda: "frank-a" in bindings_of(source, "frank"), what="the next event")
    assert "unknown type 'SURPRISE'" in caplog.text
    assert secret not in caplog.text
    assert len(kubeapi.recorded("rolebindings", watch=False)) == 1


@pytest.mark.parametrize(
    "line",
    [
        pytest.param(b'{"type": "ADDED", "object": {"meta', id="cut"),
        pytest.param(b"\xff\xfe{}", id="not-utf8"),
        pytest.param(
            b'{"type": "ADDED", "object": ' + b"[" * 200_000 + b"]" * 200_000 + b"}",
            id="nested-beyond-parsing",
        ),
    ],
)
def test_malformed_line_relists(kubeapi: FakeKubeAPI, make_source: MakeSource, line: bytes) -> None:
    source = make_source()
    kubeapi.change_silently("rolebindings", rolebinding("gina-a", "gina"))
    kubeapi.inject("rolebindings", line)
    wait_until(lambda: "gina-a" in bindings_of(source, "gina"), what="re-list")
    assert len(kubeapi.recorded("rolebindings", watch=False)) == 2


def test_periodic_resync_relists_and_reuses_unchanged_objects(
    kubeapi: FakeKubeAPI, make_source: MakeSource
) -> None:
    source = make_source(
        tuning=replace(FAST, resync_interval=0.6),
        node_graph=NodeGraph(),
        webhook_configuration="label-rbac",
    )
    before = source.snapshot()
    assert before is not None
    kubeapi.change_silently("rolebindings", rolebinding("hank-a", "hank"))
    wait_until(lambda: "hank-a" in bindings_of(source, "hank"), what="resync")
    for resource in kubeapi.collections:
        wait_until(
            lambda r=resource: len(kubeapi.recorded(r, watch=False)) >= 2, what=f"{resource} resync"
        )
    after = source.snapshot()
    assert after is not None and after is not before
    # Compiled once per (uid, resourceVersion): a re-list does not recompile what is unchanged.
    ref = RoleRef("", "admin")
    assert after.roles[ref] is before.roles[ref]


def test_updates_that_change_nothing_compiled_keep_the_snapshot(
    kubeapi: FakeKubeAPI, make_source: MakeSource
) -> None:
    source = make_source()
    before = source.snapshot()
    node = json.loads(json.dumps(kubeapi.collections["nodes"].items[("", "node1")]))
    node["status"] = {"conditions": [{"type": "Ready", "status": "True"}]}  # a heartbeat
    rv = kubeapi.apply("nodes", node)
    wait_until(lambda: informer(source, "Node").resource_version == str(rv), what="the event")
    time.sleep(0.1)  # (proving an absence: give a rebuild ample time to happen)
    assert source.snapshot() is before

    namespace = json.loads(json.dumps(kubeapi.collections["namespaces"].items[("", "default")]))
    namespace["metadata"]["annotations"] = {"node.kubernetes.io/mirror.allowed-label-keys": "a"}
    kubeapi.apply("namespaces", namespace)
    wait_until(lambda: source.snapshot() is not before, what="a rebuild")


def test_server_down_at_start_then_up(make_source: MakeSource) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    api = FakeKubeAPI(port=port, token=TOKEN)  # not started: connections are refused
    source = make_source(api, sync=False)
    wait_until(lambda: "connection refused" in source.status().detail, what="a refused list")
    status = source.status()
    assert not status.ready and status.stale_seconds is None
    assert "waiting for the initial list" in status.detail
    assert source.snapshot() is None
    api.start()
    try:
        assert source.wait_synced(15), source.status()
        assert source.status().ready
        assert bindings_of(source, "alice") == {"tenant-a"}
    finally:
        api.stop()


def test_stop_ends_open_watches_promptly(make_source: MakeSource) -> None:
    source = make_source()
    source.stop()
    assert all(not i._thread or not i._thread.is_alive() for i in source.informers)
