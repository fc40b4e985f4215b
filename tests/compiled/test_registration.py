"""The coverage writer against a recording client: the apply body, what it skips, the size bound,
and the condition itself evaluated as CEL on AdmissionReview requests.

(tests/kube/test_coverage.py applies it through a real kube-apiserver.)
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Mapping
from typing import Any

import pytest
import re2  # type: ignore[import-untyped]
import yaml

from app.compiled.registration import (
    API,
    APPLY,
    COMPILED_ENTRY,
    CONDITION,
    LABEL_ENTRIES,
    MAX_EXPRESSION,
    RECHECK_INTERVAL,
    RETIRED,
    RETRY_INTERVAL,
    SHAPE,
    Coverage,
    CoverageWriter,
    expression,
)
from app.engine.context import UNJUDGED_ANNOTATION
from app.engine.incremental import LiveSnapshot
from app.engine.kinds import BY_KIND
from app.engine.model import Resource
from app.engine.policy import DEFAULT_ANNOTATION_KEY
from app.engine.rbac import Compiler, Snapshot
from app.source.api import ApiError
from tests.cel import conditions_pass
from tests.support import ROOT, binding, make_review, role, rule, snapshot

PATH = f"{API}/label-rbac"
MANAGER = "label-rbac-compiler"
SERVED = (Resource("", "configmaps"), Resource("", "secrets"), Resource("example.com", "widgets"))


def configuration(*entries: str) -> dict[str, Any]:
    return {
        "metadata": {"name": "label-rbac", "annotations": {"keep": "me"}},
        "webhooks": [
            {"name": name, "matchConditions": [{"name": "skip-events", "expression": "true"}]}
            for name in entries
        ],
    }


class Client:
    """Serves one configuration; an apply merges its conditions and annotation, as SSA does."""

    def __init__(self, stored: dict[str, Any] | None) -> None:
        self.stored = stored
        self.gets = 0
        self.applies: list[tuple[Mapping[str, Any], list[tuple[str, str]], str]] = []

    def get(self, path: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
        assert path == PATH
        self.gets += 1
        if self.stored is None:
            raise ApiError(404, "NotFound")
        return copy.deepcopy(self.stored)

    def send(
        self, method: str, path: str, body: Mapping[str, Any], query: Any, content: str
    ) -> Any:
        assert (method, path) == ("PATCH", PATH) and self.stored is not None
        self.applies.append((body, list(query), content))
        self.stored["metadata"]["annotations"].update(body["metadata"]["annotations"])
        hooks = {h["name"]: h for h in self.stored["webhooks"]}
        for entry in body["webhooks"]:
            conditions = hooks[entry["name"]]["matchConditions"]
            owned = {c["name"] for c in entry["matchConditions"]}
            # An earlier compiler owned the RETIRED ones: an apply leaving them out removes them.
            owned.update(RETIRED)
            conditions[:] = [c for c in conditions if c["name"] not in owned]
            conditions.extend(entry["matchConditions"])
        return body


TEAM = {"team": ["a"]}


def restricting_role(pattern: str) -> tuple[str, dict[str, Any]]:
    return role("r", "t1", [rule("*", "*")], {pattern: TEAM})


def restricting(pattern: str) -> Snapshot:
    return snapshot(restricting_role(pattern))


def writer(client: Client, clock: list[float], limit: int = 25_000) -> CoverageWriter:
    return CoverageWriter(client, MANAGER, "label-rbac", limit, clock=lambda: clock[0])  # type: ignore[arg-type]


def test_the_apply_owns_one_condition_per_present_entry_and_the_annotation() -> None:
    client = Client(configuration("labels.labelrbac.io", "nodes.labelrbac.io"))
    assert writer(client, [0.0]).step(restricting("secrets"), SERVED)
    ((body, query, content),) = client.applies
    assert query == [("fieldManager", MANAGER), ("force", "true")] and content == APPLY
    keys = ["configmaps", "widgets.example.com"]
    assert body == {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "label-rbac", "annotations": {UNJUDGED_ANNOTATION: json.dumps(keys)}},
        # Only the label-rule entries the live object has; never another entry.
        "webhooks": [
            {
                "name": "labels.labelrbac.io",
                "matchConditions": [{"name": CONDITION, "expression": expression(keys)}],
            }
        ],
    }


@pytest.mark.parametrize(
    "entries",
    [
        pytest.param(LABEL_ENTRIES, id="both"),
        pytest.param((COMPILED_ENTRY,), id="compiled-only"),
        pytest.param((LABEL_ENTRIES[0],), id="shipped-only"),
    ],
)
def test_every_label_entry_present_gets_the_same_one_condition(entries: tuple[str, ...]) -> None:
    """The compiled entry's rules already keep it to what the policy never judges: it owns the
    same ``skip-unjudged`` condition as the shipped entry, and nothing more."""
    client = Client(configuration(*entries))
    assert writer(client, [0.0]).step(restricting("secrets"), SERVED)
    ((body, _, _),) = client.applies
    skip = {"name": CONDITION, "expression": expression(["configmaps", "widgets.example.com"])}
    assert body["webhooks"] == [{"name": e, "matchConditions": [skip]} for e in entries]
    # Applied: the live object says it (beside the manifest's own conditions) and is current.
    stored: Any = client.stored
    for hook in stored["webhooks"]:
        assert hook["matchConditions"] == [{"name": "skip-events", "expression": "true"}, skip]
    assert not writer(client, [0.0]).step(restricting("secrets"), SERVED)
    assert len(client.applies) == 1
    # Each entry is compared: one whose condition went is written again, with the others.
    stored["webhooks"][-1]["matchConditions"].remove(skip)
    assert writer(client, [0.0]).step(restricting("secrets"), SERVED)
    assert client.applies[-1][0] == body


def test_unchanged_coverage_is_not_written_again() -> None:
    client, clock = Client(configuration("labels.labelrbac.io")), [0.0]
    coverage = writer(client, clock)
    state = restricting("secrets")
    assert coverage.step(state, SERVED)
    # The same snapshot and resources: not even read.
    assert not coverage.step(state, SERVED) and client.gets == 1
    # A new snapshot meaning the same (most role changes): not read, not written.
    assert not coverage.step(restricting("secrets"), SERVED)
    assert (client.gets, len(client.applies)) == (1, 1)
    # A new restriction: written.
    widgets = restricting("widgets")
    assert coverage.step(widgets, SERVED)
    stored: Any = client.stored
    assert json.loads(stored["metadata"]["annotations"][UNJUDGED_ANNOTATION]) == [
        "configmaps",
        "secrets",
    ]
    # Someone removed the condition: written again at the next periodic check.
    stored["webhooks"][0]["matchConditions"] = []
    assert not coverage.step(widgets, SERVED)
    clock[0] = RECHECK_INTERVAL
    assert coverage.step(widgets, SERVED)
    assert stored["webhooks"][0]["matchConditions"][-1]["name"] == CONDITION


def test_a_condition_an_earlier_compiler_kept_is_removed() -> None:
    """After an upgrade, the compiled entry still holds the condition an earlier compiler kept
    there: the live configuration is not current until an apply has removed it."""
    stored = configuration("labels.labelrbac.io", COMPILED_ENTRY)
    (retired,) = RETIRED
    stored["webhooks"][1]["matchConditions"].append({"name": retired, "expression": "true"})
    client = Client(stored)
    assert writer(client, [0.0]).step(restricting("secrets"), SERVED)
    for hook in client.stored["webhooks"]:  # type: ignore[index]
        assert [c["name"] for c in hook["matchConditions"]] == ["skip-events", CONDITION]
    assert not writer(client, [0.0]).step(restricting("secrets"), SERVED)  # current now
    assert len(client.applies) == 1


def test_a_new_leader_compares_the_live_object_again() -> None:
    client, clock = Client(configuration("labels.labelrbac.io")), [0.0]
    coverage = writer(client, clock)
    state = restricting("secrets")
    coverage.step(state, SERVED)
    client.stored["webhooks"][0]["matchConditions"] = []  # type: ignore[index]
    coverage.reset()
    assert coverage.step(state, SERVED)


def test_an_expression_over_the_bound_skips_nothing(caplog: pytest.LogCaptureFixture) -> None:
    client = Client(configuration("labels.labelrbac.io"))
    limit = len(expression(["configmaps", "widgets.example.com"])) - 1
    with caplog.at_level(logging.WARNING, "label_rbac.compile"):
        assert writer(client, [0.0], limit).step(restricting("secrets"), SERVED)
    ((body, _, _),) = client.applies
    assert body["metadata"]["annotations"][UNJUDGED_ANNOTATION] == "[]"
    assert body["webhooks"][0]["matchConditions"][0]["expression"] == expression([])
    assert "over the limit" in caplog.text and "every resource stays sent" in caplog.text
    assert Coverage.of(["a"], len(expression(["a"]))) == Coverage(("a",), 0, ("a",))


@pytest.mark.parametrize(
    ("limit", "listed", "skipped", "named"),
    [
        pytest.param(MAX_EXPRESSION, (), ["a"], ["a"], id="nothing-listed"),
        pytest.param(MAX_EXPRESSION, ["b"], ["a"], ["a", "b"], id="restricted-still-listed"),
        pytest.param(MAX_EXPRESSION, ["a"], ["a"], ["a"], id="listed-and-unjudged"),
        pytest.param(1, ["b"], [], ["b"], id="oversized-still-fenced"),
    ],
)
def test_the_annotation_names_what_the_parameters_still_list_unjudged(
    limit: int, listed: list[str], skipped: list[str], named: list[str]
) -> None:
    """A key an annotation restricts now but some namespace's parameters still list unjudged
    (they let its writes through) stays in the annotation, so the webhook's fence hands that
    restriction to no one new until they are written again; the condition skips it no longer."""
    coverage = Coverage.of(["a"], limit, listed)
    assert (list(coverage.keys), list(coverage.fenced)) == (skipped, named)
    body = coverage.body("label-rbac", ["labels.labelrbac.io"])
    assert json.loads(body["metadata"]["annotations"][UNJUDGED_ANNOTATION]) == named
    assert body["webhooks"][0]["matchConditions"][0]["expression"] == expression(skipped)


def test_the_writer_applies_again_when_what_is_listed_changes() -> None:
    client = Client(configuration("labels.labelrbac.io"))
    coverage = writer(client, [0.0])
    assert coverage.step(restricting("secrets"), SERVED, ["secrets"])
    assert "secrets" in json.loads(
        client.applies[-1][0]["metadata"]["annotations"][UNJUDGED_ANNOTATION]
    )
    assert coverage.step(restricting("secrets"), SERVED, [])
    assert "secrets" not in json.loads(
        client.applies[-1][0]["metadata"]["annotations"][UNJUDGED_ANNOTATION]
    )


@pytest.mark.parametrize(
    "stored",
    [
        pytest.param(None, id="no-configuration"),
        pytest.param(configuration("rbac.labelrbac.io"), id="no-label-entry"),
    ],
)
def test_a_missing_configuration_or_entry_is_never_created(
    stored: dict[str, Any] | None, caplog: pytest.LogCaptureFixture
) -> None:
    client, clock = Client(stored), [0.0]
    coverage = writer(client, clock)
    with caplog.at_level(logging.INFO, "label_rbac.compile"):
        assert not coverage.step(restricting("secrets"), SERVED)
        # Waits before looking again, whatever RBAC does meanwhile.
        assert not coverage.step(restricting("widgets"), SERVED) and client.gets == 1
        clock[0] = RETRY_INTERVAL
        assert not coverage.step(restricting("widgets"), SERVED) and client.gets == 2
        assert client.applies == []
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "will retry" in warnings[0].getMessage()  # said once
        # Created at last: written at the next look, and said.
        client.stored = configuration("labels.labelrbac.io")
        clock[0] = 2 * RETRY_INTERVAL
        assert coverage.step(restricting("widgets"), SERVED)
    assert "ValidatingWebhookConfiguration label-rbac found" in caplog.text


def review(user: str, resource: str, groups: tuple[str, ...] = ()) -> dict[str, Any]:
    return make_review(user, "CREATE", resource, namespace="t1", labels={}, groups=groups)[
        "request"
    ]


@pytest.mark.parametrize(
    ("request_", "sent"),
    [
        pytest.param(review("alice", "configmaps"), False, id="unjudged-core"),
        pytest.param(review("alice", "widgets.example.com"), False, id="unjudged-grouped"),
        pytest.param(review("alice", "widgets.example.com/status"), False, id="its-subresource"),
        pytest.param(review("alice", "widgets.other.io"), True, id="same-name-other-group"),
        pytest.param(review("alice", "secrets"), True, id="restricted"),
        pytest.param(review("alice", "newthings.example.com"), True, id="not-listed"),
        pytest.param(
            review("system:node:n1", "configmaps", ("system:nodes",)), True, id="node-user"
        ),
    ],
)
def test_the_condition_skips_exactly_the_listed_resources(
    request_: dict[str, Any], sent: bool
) -> None:
    condition = {"expression": expression(["configmaps", "widgets.example.com"])}
    assert conditions_pass([condition], request_) is sent


@pytest.mark.parametrize(
    ("text", "generated"),
    [
        pytest.param(expression([]), True, id="empty"),
        pytest.param(expression(["configmaps", "widgets.example.com"]), True, id="keys"),
        pytest.param("true", False, id="always"),
        pytest.param(expression(["a"]) + " || true", False, id="appended"),
        pytest.param(expression(["a') || true || ('"]), False, id="injected-key"),
        pytest.param(expression(["a"]).replace("!", ""), False, id="negation-dropped"),
        pytest.param(expression(["a"]) + "\n", False, id="trailing-newline"),
    ],
)
def test_the_guard_recognises_only_the_generated_shape(text: str, generated: bool) -> None:
    """The guard checks the compiler's expression with RE2 (CEL ``matches``)."""
    assert (re2.search(SHAPE, text) is not None) is generated


def test_a_batch_changing_bindings_only_costs_nothing() -> None:
    """Only roles and served resources decide the coverage: the live snapshot keeps its roles
    when a batch changes bindings only, and the writer neither computes nor reads then."""
    compiler = Compiler((DEFAULT_ANNOTATION_KEY,))
    roles = [role(f"r{i}", "t1", [rule("*", "configmaps")], {"secrets": TEAM}) for i in range(8)]
    state = LiveSnapshot.build({"Role": [BY_KIND["Role"].compile(compiler, r[1]) for r in roles]})
    client, clock = Client(configuration("labels.labelrbac.io")), [0.0]
    coverage = writer(client, clock)
    assert coverage.step(state.snapshot, SERVED) and client.gets == 1
    bound = BY_KIND["RoleBinding"].compile(
        compiler, binding("b", "r1", "User:x", namespace="t1")[1]
    )
    after = state.apply([("RoleBinding", None, bound)])
    assert after.snapshot.roles is state.snapshot.roles
    assert not coverage.step(after.snapshot, SERVED) and client.gets == 1
    changed = BY_KIND["Role"].compile(compiler, restricting_role("widgets")[1])
    assert coverage.step(state.apply([("Role", None, changed)]).snapshot, SERVED)


def test_a_refused_apply_is_tried_again_soon() -> None:
    client, clock = Client(configuration("labels.labelrbac.io")), [0.0]
    coverage = writer(client, clock)
    state = restricting("secrets")
    refused = ApiError(403, "Forbidden")

    def refuse(*args: Any) -> Any:
        raise refused

    send, client.send = client.send, refuse  # type: ignore[method-assign]
    with pytest.raises(ApiError):
        coverage.step(state, SERVED)
    client.send = send  # type: ignore[method-assign]
    assert not coverage.step(state, SERVED)  # not before the retry interval
    clock[0] = RETRY_INTERVAL
    assert coverage.step(state, SERVED)


def test_the_compiler_may_read_and_patch_the_one_registration_and_nothing_more() -> None:
    """manifests/compiled/rbac.yaml: ``get`` and ``patch`` on the configuration by name; never
    ``create`` (an apply would otherwise make one), ``delete``, or any other configuration."""
    documents = yaml.safe_load_all((ROOT / "manifests" / "compiled" / "rbac.yaml").read_text())
    (role_,) = [d for d in documents if d["kind"] == "ClusterRole"]
    rules = [r for r in role_["rules"] if "validatingwebhookconfigurations" in r["resources"]]
    assert rules == [
        {
            "apiGroups": ["admissionregistration.k8s.io"],
            "resources": ["validatingwebhookconfigurations"],
            "resourceNames": ["label-rbac"],
            "verbs": ["get", "patch"],
        }
    ]
