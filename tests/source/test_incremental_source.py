"""The cluster source updates its snapshot change by change, through the real watch path.

After any mix of watch events and re-lists, the snapshot it serves decides like one built whole
from the objects its informers hold, and a change leaves what it did not touch shared.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from app.engine.kinds import KINDS, build_snapshot
from app.engine.model import UserInfo
from app.engine.policy import DEFAULT_ANNOTATION_KEY
from app.engine.rbac import RoleRef, Snapshot
from app.source.cluster import ClusterSource
from tests.kubeapi import FakeKubeAPI, wait_until
from tests.source.helpers import MakeSource, bindings_of, informer, rolebinding


def whole(source: ClusterSource) -> Snapshot:
    """What a whole build from the informers' objects gives."""
    return build_snapshot({spec.kind: informer(source, spec.kind).values() for spec in KINDS})


def same(served: Snapshot | None, built: Snapshot) -> bool:
    return (
        served is not None
        and served.roles == built.roles
        and dict(served.bindings.items()) == dict(built.bindings.items())
        and served.namespaces == built.namespaces
        and served.nodes == built.nodes
    )


def stored(kubeapi: FakeKubeAPI, resource: str, name: str, namespace: str = "") -> dict[str, Any]:
    return copy.deepcopy(kubeapi.collections[resource].items[(namespace, name)])


def annotated(obj: dict[str, Any], labels: list[str]) -> dict[str, Any]:
    annotations = obj["metadata"].setdefault("annotations", {})
    annotations[DEFAULT_ANNOTATION_KEY] = json.dumps({"configmaps": {"team": labels}})
    return obj


def test_watch_events_and_relists_leave_the_snapshot_a_whole_build_gives(
    kubeapi: FakeKubeAPI, make_source: MakeSource
) -> None:
    source = make_source()
    # Watch events: a Role's annotation, a binding added and edited, one deleted, a ClusterRole.
    kubeapi.apply("roles", annotated(stored(kubeapi, "roles", "tenant-a", "default"), ["x"]))
    kubeapi.apply("rolebindings", rolebinding("ivy-a", "ivy"))
    edited = rolebinding("ivy-a", "ivy")
    edited["subjects"].append({"kind": "Group", "name": "ivy-team"})
    kubeapi.apply("rolebindings", edited)
    kubeapi.apply("rolebindings", rolebinding("jon-a", "jon"))
    kubeapi.delete("rolebindings", "jon-a", "default")
    kubeapi.apply("clusterroles", annotated(stored(kubeapi, "clusterroles", "view"), ["v"]))
    wait_until(lambda: _bound(source, "ivy-team"), what="the binding's edit")
    wait_until(lambda: _annotated(source.snapshot(), RoleRef("", "view")), what="the ClusterRole")
    wait_until(lambda: same(source.snapshot(), whole(source)), what="the snapshot to settle")
    assert "jon-a" not in bindings_of(source, "jon")
    assert _current(source).roles[RoleRef("default", "tenant-a")].permissions is not None

    # A re-list after changes the watch never delivered: one object deleted and created again
    # with the same content (a new uid), one edited, one gone.
    again = stored(kubeapi, "rolebindings", "ivy-a", "default")
    again["metadata"]["uid"] = "recreated"
    kubeapi.change_silently("rolebindings", again)
    kubeapi.change_silently("rolebindings", rolebinding("kim-a", "kim"))
    kubeapi.remove_silently("rolebindings", "ivy-a", "default")
    kubeapi.change_silently("rolebindings", again)
    kubeapi.expire_watches("rolebindings")
    wait_until(lambda: "kim-a" in bindings_of(source, "kim"), what="the re-list")
    wait_until(lambda: same(source.snapshot(), whole(source)), what="the snapshot to settle")
    assert "ivy-a" in bindings_of(source, "ivy")


def test_a_change_shares_the_namespaces_it_does_not_touch(
    kubeapi: FakeKubeAPI, make_source: MakeSource
) -> None:
    source = make_source()
    before = _current(source)
    kubeapi.apply("rolebindings", rolebinding("lea-a", "lea"))
    wait_until(lambda: "lea-a" in bindings_of(source, "lea"), what="the binding")
    after = _current(source)
    changed = [name for name, scope in after.bindings.scopes.items()
               if before.bindings.scopes.get(name) is not scope]  # fmt: skip
    assert changed == ["default"]
    assert all(after.roles[ref] is role for ref, role in before.roles.items())


def _current(source: ClusterSource) -> Snapshot:
    snapshot = source.snapshot()
    assert snapshot is not None
    return snapshot


def _bound(source: ClusterSource, group: str) -> bool:
    return any(True for _ in _current(source).roles_for(UserInfo("", (group,)), "default"))


def _annotated(snapshot: Snapshot | None, ref: RoleRef) -> bool:
    role = None if snapshot is None else snapshot.roles.get(ref)
    return role is not None and role.permissions is not None
