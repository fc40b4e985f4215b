"""The cluster source as the webhook uses it: freshness, readiness, staleness, parent lookups."""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.engine.context import UNJUDGED_ANNOTATION, UNKNOWN, ObjectRef, ParentUnavailable
from app.engine.kinds import KINDS, WEBHOOK_CONFIGURATION
from app.engine.model import Request, Resource
from app.engine.rbac import RoleRef
from app.engine.workloads import METADATA_RESOURCES
from app.settings import Settings
from app.source.api import object_path
from app.source.cluster import PARENT_RESOURCES
from app.source.metadata import WATCHED_RESOURCES
from app.webhook.server import Decider, create_app
from tests.kubeapi import FakeKubeAPI, wait_until
from tests.source.helpers import (
    FAST,
    POD,
    MakeSource,
    exec_request,
    pod,
    request,
    role_with,
    rolebinding,
)
from tests.support import ROOT

CLUSTER = Settings(kubeconfig=Path("kubeconfig"))


def report(capsys: pytest.CaptureFixture[str], what: str, latencies: list[float]) -> None:
    ms = sorted(1000 * s for s in latencies)
    with capsys.disabled():
        print(
            f"\n[freshness] {what}: enforced after median {statistics.median(ms):.1f} ms, "
            f"max {ms[-1]:.1f} ms over {len(ms)} changes (watch event pushed -> decision)"
        )


def test_role_annotation_change_is_enforced_within_one_second(
    kubeapi: FakeKubeAPI, make_source: MakeSource, capsys: pytest.CaptureFixture[str]
) -> None:
    decide = Decider(CLUSTER, make_source())
    team_b = request("alice", {"team": "b"})
    assert decide(team_b).reason == "LabelNotPermitted"
    latencies = []
    for turn in range(10):
        allow = turn % 2 == 0
        values = ["a", "b"] if allow else ["a"]
        role = role_with(kubeapi, "tenant-a", json.dumps({"configmaps": {"team": values}}))
        started = time.monotonic()
        kubeapi.apply("roles", role)
        wait_until(lambda a=allow: decide(team_b).allowed is a, timeout=10, interval=0.0005)
        latencies.append(time.monotonic() - started)
    report(capsys, "Role annotation change", latencies)
    assert max(latencies) < 1.0


def test_rolebinding_change_is_enforced_within_one_second(
    kubeapi: FakeKubeAPI, make_source: MakeSource, capsys: pytest.CaptureFixture[str]
) -> None:
    decide = Decider(CLUSTER, make_source())
    bob = request("bob", {"team": "b"})
    assert decide(bob).reason == "NoGrantingRole"
    latencies = []
    for _ in range(5):
        started = time.monotonic()
        kubeapi.apply("rolebindings", rolebinding("bob-a", "bob"))
        wait_until(lambda: decide(bob).reason == "LabelNotPermitted", 10, 0.0005)
        latencies.append(time.monotonic() - started)
        started = time.monotonic()
        kubeapi.delete("rolebindings", "bob-a", "default")
        wait_until(lambda: decide(bob).allowed, 10, 0.0005)
        latencies.append(time.monotonic() - started)
    report(capsys, "RoleBinding create/delete", latencies)
    assert max(latencies) < 1.0


def test_readiness_follows_sync_and_connection(
    kubeapi: FakeKubeAPI, make_source: MakeSource
) -> None:
    kubeapi.stop()
    source = make_source(sync=False)
    client = create_app(CLUSTER, source).test_client()
    wait_until(lambda: "connection refused" in source.status().detail, what="a refused list")
    response = client.get("/readyz")
    assert response.status_code == 503
    assert "waiting for the initial list" in response.json["detail"]
    decision = Decider(CLUSTER, source)(request("alice", {"team": "a"}))
    assert (decision.allowed, decision.code, decision.reason) == (False, 503, "NotSynced")

    kubeapi.start()
    wait_until(lambda: client.get("/readyz").status_code == 200, what="ready")
    assert "staleSeconds" not in client.get("/readyz").json

    # Losing the API server keeps the last good state and says how old it is.
    kubeapi.stop()

    def stale_readiness() -> dict[str, Any] | None:
        body = client.get("/readyz").json
        return body if body.get("staleSeconds") is not None else None

    body = wait_until(stale_readiness, what="stale readiness")
    assert body["ready"] is True and "lost the watch" in body["detail"]
    assert Decider(CLUSTER, source)(request("alice", {"team": "a"})).allowed
    first = body["staleSeconds"]
    wait_until(lambda: (source.status().stale_seconds or 0) > first + 0.05, what="it grows")

    kubeapi.start()
    wait_until(lambda: source.status().stale_seconds is None, what="reconnected")
    assert client.get("/readyz").status_code == 200


def test_max_staleness_fails_closed_after_the_limit(
    kubeapi: FakeKubeAPI, make_source: MakeSource
) -> None:
    limit = 2.0
    source = make_source(max_staleness=limit)
    decide = Decider(Settings(kubeconfig=Path("kubeconfig"), max_staleness=limit), source)
    team_a, team_b = request("alice", {"team": "a"}), request("alice", {"team": "b"})

    kubeapi.stop()
    wait_until(lambda: source.status().stale_seconds is not None, what="disconnection noticed")
    # Within the limit, the last good state decides.
    assert decide(team_a).allowed and decide(team_b).reason == "LabelNotPermitted"
    assert (source.status().stale_seconds or 0) < limit

    stale = wait_until(lambda: (d := decide(team_a)).reason == "Stale" and d, what="stale")
    assert (stale.allowed, stale.code) == (False, 503)
    assert "stale" in stale.message and "limit 2s" in stale.message
    status = source.status()
    assert not status.ready and "--max-staleness" in status.detail

    kubeapi.start()
    wait_until(lambda: decide(team_a).allowed, what="fresh again")
    assert source.status().ready


def test_parent_is_read_once_per_ttl(kubeapi: FakeKubeAPI, make_source: MakeSource) -> None:
    kubeapi.put_object(POD, pod("app", {"app": "web"}))
    source = make_source()
    assert source.fetch_parent(exec_request())["metadata"]["labels"] == {"app": "web"}
    assert source.fetch_parent(exec_request())["spec"] == {"nodeName": "node1"}
    gets = [r for r in kubeapi.recorded() if r.path == POD]
    assert len(gets) == 1 and gets[0].query == {}


def test_parent_cache_entries_expire(kubeapi: FakeKubeAPI, make_source: MakeSource) -> None:
    kubeapi.put_object(POD, pod("app", {"app": "web"}))
    source = make_source(tuning=replace(FAST, parent_ttl=0.05))
    source.fetch_parent(exec_request())
    kubeapi.put_object(POD, pod("app", {"app": "relabelled"}))
    labels = wait_until(
        lambda: (
            source.fetch_parent(exec_request())["metadata"]["labels"] != {"app": "web"}
            and source.fetch_parent(exec_request())["metadata"]["labels"]
        ),
        what="a fresh read",
    )
    assert labels == {"app": "relabelled"}


def test_parent_labels_decide_connect_requests(
    kubeapi: FakeKubeAPI, make_source: MakeSource
) -> None:
    kubeapi.put_object(POD, pod("app", {"app": "web"}))
    kubeapi.put_object(POD.replace("/app", "/other"), pod("other", {"app": "evil"}))
    source = make_source()
    kubeapi.apply(
        "roles",
        {
            "metadata": {
                "name": "exec-web",
                "namespace": "default",
                "annotations": {"labelrbac.io/permissions": '{"pods": {"app": ["web"]}}'},
            },
            "rules": [{"verbs": ["create", "get"], "apiGroups": [""], "resources": ["pods/exec"]}],
        },
    )
    kubeapi.apply("rolebindings", rolebinding("alice-exec", "alice", role="exec-web"))
    decide = Decider(CLUSTER, source)
    wait_until(lambda: decide(exec_request()).reason == "LabelsPermitted", what="role and binding")
    assert decide(exec_request(name="other")).reason == "LabelNotPermitted"
    missing = decide(exec_request(name="gone"))
    assert missing.reason == "ParentUnavailable"
    assert 'could not read pods "gone" in namespace "default": HTTP 404 NotFound' in (
        missing.message
    )


def test_parent_lookup_failures_say_what_and_why(
    kubeapi: FakeKubeAPI, make_source: MakeSource
) -> None:
    source = make_source()
    with pytest.raises(ParentUnavailable) as info:
        source.fetch_parent(exec_request(name="nope"))
    assert str(info.value) == 'could not read pods "nope" in namespace "default": HTTP 404 NotFound'

    kubeapi.get_faults[POD] = 403
    with pytest.raises(ParentUnavailable, match=r'pods "app" in namespace "default": HTTP 403'):
        source.fetch_parent(exec_request())


def test_parent_lookup_times_out(kubeapi: FakeKubeAPI, make_source: MakeSource) -> None:
    kubeapi.put_object(POD, pod("app", {"app": "web"}))
    kubeapi.get_delay = 3.0
    source = make_source()  # parent_timeout 0.5 s
    started = time.monotonic()
    with pytest.raises(ParentUnavailable, match=r'could not read pods "app" .*: timed out'):
        source.fetch_parent(exec_request())
    assert time.monotonic() - started < 2.5


def test_metadata_lookup_never_brings_a_body(kubeapi: FakeKubeAPI, make_source: MakeSource) -> None:
    path = "/api/v1/namespaces/default/secrets/db"
    secret = {"kind": "Secret", "metadata": {"name": "db", "labels": {"team": "a"}}}
    kubeapi.put_object(path, {**secret, "data": {"password": "c2VjcmV0"}})
    source = make_source()
    ref = ObjectRef("", "v1", "secrets", "default", "db")

    assert source.fetch_metadata(ref) == {"metadata": secret["metadata"]}
    assert source.fetch_metadata(ref) == {"metadata": secret["metadata"]}  # cached
    (sent,) = [r for r in kubeapi.recorded() if r.path == path]
    assert "as=PartialObjectMetadata;g=meta.k8s.io;v=v1" in sent.accept

    missing = ObjectRef("", "v1", "secrets", "default", "gone")
    with pytest.raises(ParentUnavailable, match='secrets "gone" in namespace "default": HTTP 404'):
        source.fetch_metadata(missing)


def test_metadata_lookup_keeps_only_metadata_from_a_full_answer(
    kubeapi: FakeKubeAPI, make_source: MakeSource
) -> None:
    """A server that ignores the content negotiation still leaves no body in the cache."""
    path = "/apis/example.com/v1/namespaces/default/widgets/w"
    kubeapi.put_object(path, {"kind": "Widget", "metadata": {"name": "w"}, "spec": {"x": 1}})
    kubeapi.objects[path]["metadata"] = {"name": "w", "labels": {"team": "b"}}
    kubeapi.partial_metadata = False
    source = make_source()
    ref = ObjectRef("example.com", "v1", "widgets", "default", "w")
    found = source.fetch_metadata(ref)
    assert set(found) == {"metadata"}
    assert found["metadata"]["labels"] == {"team": "b"}


def test_scale_parent_is_read_from_its_group(kubeapi: FakeKubeAPI, make_source: MakeSource) -> None:
    path = "/apis/apps/v1/namespaces/default/deployments/web"
    kubeapi.put_object(path, {"kind": "Deployment", "metadata": {"name": "web"}})
    source = make_source()
    scale = Request(
        uid="u",
        operation="UPDATE",
        user=exec_request().user,
        resource=Resource("apps", "deployments", "scale"),
        kind="Scale",
        namespace="default",
        name="web",
    )
    assert source.fetch_parent(scale)["kind"] == "Deployment"
    assert [r.path for r in kubeapi.recorded() if "deployments" in r.path] == [path]


def test_a_token_requests_service_account_is_read_as_metadata(
    kubeapi: FakeKubeAPI, make_source: MakeSource
) -> None:
    """A token request is judged by its ServiceAccount's labels: they are read (metadata only,
    from the watch or a GET), not refused as a parent label-rbac cannot look up."""
    path = "/api/v1/namespaces/default/serviceaccounts/robot"
    account = {"kind": "ServiceAccount", "metadata": {"name": "robot", "namespace": "default",
               "labels": {"team": "a"}}, "secrets": [{"name": "robot-token"}]}  # fmt: skip
    kubeapi.put_object(path, account)
    source = make_source()
    token = Request(
        uid="u",
        operation="CREATE",
        user=exec_request().user,
        resource=Resource("", "serviceaccounts", "token"),
        kind="TokenRequest",
        namespace="default",
        name="robot",
    )
    found = source.fetch_parent(token)
    assert set(found) == {"metadata"} and found["metadata"]["labels"] == {"team": "a"}
    with pytest.raises(ParentUnavailable, match="404"):
        source.fetch_parent(dataclasses.replace(token, name="gone"))


def test_unconfigured_parents_are_not_fetched(
    kubeapi: FakeKubeAPI, make_source: MakeSource
) -> None:
    source = make_source()
    proxy = Request(
        uid="u",
        operation="CONNECT",
        user=exec_request().user,
        resource=Resource("", "services", "proxy"),
        namespace="default",
        name="web",
    )
    before = len(kubeapi.recorded())
    with pytest.raises(ParentUnavailable, match="not set up to look up services"):
        source.fetch_parent(proxy)
    assert not [r for r in kubeapi.recorded()[before:] if "services" in r.path]


def test_object_paths() -> None:
    assert object_path("", "v1", "pods", "default", "app") == POD
    assert object_path("apps", "v1", "deployments", "ns", "a b") == (
        "/apis/apps/v1/namespaces/ns/deployments/a%20b"
    )
    assert object_path("", "v1", "nodes", "", "node1") == "/api/v1/nodes/node1"
    assert object_path("rbac.authorization.k8s.io", "v1", "roles") == (
        "/apis/rbac.authorization.k8s.io/v1/roles"
    )


def test_deployed_clusterrole_grants_exactly_what_the_source_uses() -> None:
    """list/watch on the six kinds and the resources whose labels are watched; get only on the
    parents and metadata looked up; list/watch of its own registration, by name (no more)."""
    documents = yaml.safe_load_all((ROOT / "manifests" / "deploy" / "rbac.yaml").read_text())
    (role,) = [d for d in documents if d["kind"] == "ClusterRole"]
    named = [rule for rule in role["rules"] if "resourceNames" in rule]
    assert named == [
        {
            "apiGroups": [WEBHOOK_CONFIGURATION.group],
            "resources": [WEBHOOK_CONFIGURATION.resource],
            "resourceNames": [Settings.webhook_configuration],
            "verbs": ["list", "watch"],
        }
    ]
    granted = {
        (group, resource, verb)
        for rule in role["rules"]
        if rule not in named
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    watched = {(k.group, k.resource, v) for k in KINDS for v in ("list", "watch")}
    parents = {(group, resource, "get") for group, resource in PARENT_RESOURCES}
    metadata = {(group, resource, "get") for group, resource in METADATA_RESOURCES}
    labels = {
        (group, resource, v) for group, resource in WATCHED_RESOURCES for v in ("list", "watch")
    }
    assert granted == watched | parents | metadata | labels


def _registration(annotation: str | None) -> dict[str, Any]:
    annotations = {} if annotation is None else {UNJUDGED_ANNOTATION: annotation}
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "label-rbac", "annotations": annotations},
        "webhooks": [],
    }


def test_the_registration_is_read_from_the_watched_configuration(
    kubeapi: FakeKubeAPI, make_source: MakeSource
) -> None:
    """What the live configuration leaves out follows its annotation; an unreadable one means
    anything may be left out; no configuration, nothing. Without the option: no registration."""
    assert make_source().registration() is None
    source = make_source(webhook_configuration="label-rbac")

    def unjudged() -> frozenset[str] | None:
        registration = source.registration()
        return None if registration is None else registration.unjudged

    assert unjudged() == frozenset()
    kubeapi.apply("validatingwebhookconfigurations", _registration('["widgets.example.com"]'))
    wait_until(lambda: unjudged() == {"widgets.example.com"}, what="the listed resource")
    kubeapi.apply("validatingwebhookconfigurations", _registration('{"not": "a list"}'))
    wait_until(lambda: unjudged() == {UNKNOWN}, what="an unreadable list")
    kubeapi.apply("validatingwebhookconfigurations", _registration('["Bad Key"]'))
    wait_until(lambda: unjudged() == {UNKNOWN}, what="a list of non-keys")
    kubeapi.delete("validatingwebhookconfigurations", "label-rbac")
    wait_until(lambda: unjudged() == frozenset(), what="nothing once deleted")


def test_the_registration_knows_roles_bound_before_they_exist(
    kubeapi: FakeKubeAPI, make_source: MakeSource
) -> None:
    source = make_source(webhook_configuration="label-rbac")
    kubeapi.apply("rolebindings", rolebinding("bob-future", "bob", role="future"))

    def referred() -> bool:
        registration = source.registration()
        return registration is not None and RoleRef("default", "future") in registration.referred

    wait_until(referred, what="the binding's role among those referred to")
