"""The API server slow, failing, truncating or gone: the webhook fails closed, says why, recovers.

Parent lookups happen while a review waits: any fault denies that review with a reason naming
the object and the cause, nothing of the failure is cached, and the next review after the fault
is decided normally. Watches and lists feed the cache: during a fault the last good state keeps
deciding and readiness names the cause; afterwards the changes made meanwhile arrive.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from app.settings import Settings
from app.source.cluster import ClusterSource
from app.webhook.server import Decider
from tests.kubeapi import TRUNCATE, FakeKubeAPI, wait_until
from tests.source.helpers import POD, MakeSource, exec_request, pod, request, rolebinding

CLUSTER = Settings(kubeconfig=Path("kubeconfig"))
EXEC_WEB = {
    "metadata": {
        "name": "exec-web",
        "namespace": "default",
        "annotations": {"labelrbac.io/permissions": json.dumps({"pods": {"app": ["web"]}})},
    },
    "rules": [{"verbs": ["create", "get"], "apiGroups": [""], "resources": ["pods/exec"]}],
}

# Read only once the fault is in place: nothing cached can answer for it.
OTHER = POD.replace("/app", "/other")

Fault = Callable[[FakeKubeAPI], None]


def _status(code: int) -> Fault:
    return lambda api: api.get_faults.update({OTHER: code})


def _slow(api: FakeKubeAPI) -> None:
    api.get_delay = 3.0


def _truncated(api: FakeKubeAPI) -> None:
    api.truncate_gets.add(OTHER)


def _gone(api: FakeKubeAPI) -> None:
    api.stop()


def _clear(api: FakeKubeAPI) -> None:
    api.get_faults.clear()
    api.truncate_gets.clear()
    api.get_delay = 0.0
    if not api.serving:
        api.start()


@pytest.mark.parametrize(
    ("fault", "cause"),
    [
        pytest.param(_status(500), "HTTP 500 InternalError", id="500"),
        pytest.param(_status(503), "HTTP 503 ServiceUnavailable", id="503"),
        pytest.param(_status(429), "HTTP 429 TooManyRequests", id="429"),
        pytest.param(_slow, "timed out (limit 0.5s)", id="slow"),
        pytest.param(_truncated, "connection closed mid-response", id="truncated"),
        pytest.param(_gone, "connection refused", id="gone"),
    ],
)
def test_parent_lookup_faults_deny_with_the_cause_then_recover(
    kubeapi: FakeKubeAPI, make_source: MakeSource, fault: Fault, cause: str
) -> None:
    kubeapi.put_object(POD, pod("app", {"app": "web"}))
    source = make_source()
    kubeapi.apply("roles", EXEC_WEB)
    kubeapi.apply("rolebindings", rolebinding("alice-exec", "alice", role="exec-web"))
    decide = Decider(CLUSTER, source)
    kubeapi.put_object(OTHER, pod("other", {"app": "web"}))
    wait_until(lambda: decide(exec_request()).reason == "LabelsPermitted", what="role and binding")

    fault(kubeapi)
    denied = decide(exec_request(name="other"))
    assert (denied.allowed, denied.reason) == (False, "ParentUnavailable")
    assert 'could not read pods "other" in namespace "default": ' in denied.message
    assert cause in denied.message, denied.message
    assert "its label permissions cannot be checked" in denied.message

    _clear(kubeapi)
    if not source.status().ready or source.stale_seconds() is not None:
        wait_until(lambda: source.stale_seconds() is None, what="reconnected")
    assert decide(exec_request(name="other")).reason == "LabelsPermitted"


UNTIL_CLEARED = 100_000  # more than any test waits through


def _watch_fails(api: FakeKubeAPI) -> None:
    for _ in range(UNTIL_CLEARED):
        api.fail_next_watch("rolebindings", 500)
    api.end_watches("rolebindings")


def _relist_fails(api: FakeKubeAPI) -> None:
    api.fail_next_lists("rolebindings", *[503] * UNTIL_CLEARED)
    api.expire_watches("rolebindings")


def _relist_truncated(api: FakeKubeAPI) -> None:
    api.fail_next_lists("rolebindings", *[TRUNCATE] * UNTIL_CLEARED)
    api.expire_watches("rolebindings")


@pytest.mark.parametrize(
    ("fault", "cause"),
    [
        pytest.param(_watch_fails, "HTTP 500 InternalError", id="watch-500"),
        pytest.param(_relist_fails, "HTTP 503 ServiceUnavailable", id="relist-503"),
        pytest.param(_relist_truncated, "connection closed mid-response", id="relist-truncated"),
    ],
)
def test_watch_and_list_faults_keep_the_last_state_then_catch_up(
    kubeapi: FakeKubeAPI, make_source: MakeSource, fault: Fault, cause: str
) -> None:
    source: ClusterSource = make_source()
    decide = Decider(CLUSTER, source)
    bob_b = request("bob", {"team": "b"})
    assert decide(bob_b).allowed  # bob is bound to nothing yet

    fault(kubeapi)
    wait_until(lambda: cause in source.status().detail, what=f"readiness naming {cause}")
    # The last good state decides meanwhile, and readiness says how old it is.
    assert source.status().ready and source.stale_seconds() is not None
    assert decide(request("alice", {"team": "a"})).allowed
    assert decide(request("alice", {"team": "b"})).reason == "LabelNotPermitted"
    kubeapi.apply("rolebindings", rolebinding("bob-a", "bob"))  # made during the fault

    # The API server recovers: the change arrives, and the state is current again.
    kubeapi.clear_faults("rolebindings")
    wait_until(lambda: decide(bob_b).reason == "LabelNotPermitted", what="the missed change")
    wait_until(lambda: source.stale_seconds() is None, what="current again")
