"""The AdmissionReview wire format: every recorded review parses; malformed envelopes do not."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from app.engine.model import Decision, Resource
from app.webhook.wire import ReviewError, build_response, parse_review
from tests.support import REVIEWS, load_review

RECORDED = sorted(path.stem for path in REVIEWS.glob("*.json"))


def test_fixtures_are_present() -> None:
    # Both runs: 24 in run "a", 12 in run "b". A silently empty glob would pass every test below.
    assert len([n for n in RECORDED if n.startswith("a")]) == 24
    assert len([n for n in RECORDED if n.startswith("b")]) == 12


@pytest.mark.parametrize("name", RECORDED)
def test_every_recorded_review_parses(name: str) -> None:
    document = load_review(name)
    raw = document["request"]
    review = parse_review(document)
    req = review.request
    assert review.api_version == document["apiVersion"] == "admission.k8s.io/v1"
    assert req.uid == raw["uid"]
    assert req.operation == raw["operation"]
    assert req.resource == Resource(
        raw["resource"]["group"], raw["resource"]["resource"], raw.get("subResource", "")
    )
    assert req.kind == raw["kind"]["kind"]
    assert req.namespace == raw.get("namespace", "")
    assert req.name == raw.get("name", "")
    assert req.user.username == raw["userInfo"]["username"]
    assert req.user.groups == tuple(raw["userInfo"]["groups"])
    assert req.object == raw.get("object")
    assert req.old_object == raw.get("oldObject")
    assert req.dry_run is bool(raw.get("dryRun"))


def test_recorded_details() -> None:
    # A few facts the README states about the recordings, checked through the parser.
    delete = parse_review(load_review("a006-delete-mwan3policies")).request
    assert delete.object is None and delete.old_object is not None
    assert delete.resource == Resource("batch.sdewan.akraino.org", "mwan3policies")
    dry_run = parse_review(load_review("a009-create-configmaps")).request
    assert dry_run.dry_run is True
    eviction = parse_review(load_review("a018-create-pods-eviction")).request
    assert (eviction.resource, eviction.kind) == (Resource("", "pods", "eviction"), "Eviction")
    node = parse_review(load_review("a014-create-nodes")).request
    assert node.namespace == ""
    patch = parse_review(load_review("a005-update-mwan3policies")).request
    assert patch.operation == "UPDATE"
    assert patch.verbs == ("update", "patch")


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        pytest.param({}, Resource("", "pods", "eviction"), id="absent-is-the-resource"),
        pytest.param(
            {"requestResource": None, "requestSubResource": None},
            Resource("", "pods", "eviction"),
            id="null-is-the-resource",
        ),
        pytest.param(
            {
                "requestResource": {"group": "policy", "version": "v1", "resource": "pods"},
                "requestSubResource": "eviction",
            },
            Resource("policy", "pods", "eviction"),
            id="converted",
        ),
        pytest.param(
            {"requestResource": {"group": "", "version": "v1", "resource": "pods"}},
            Resource("", "pods"),
            id="absent-request-subresource-is-none",
        ),
    ],
)
def test_request_resource_is_what_rbac_authorized(
    fields: dict[str, Any], expected: Resource
) -> None:
    document = load_review("a018-create-pods-eviction")
    for key in ("requestKind", "requestResource", "requestSubResource"):
        document["request"].pop(key, None)
    document["request"].update(fields)
    req = parse_review(document).request
    assert req.resource == Resource("", "pods", "eviction")
    assert req.authorized_resource == expected


def test_v1beta1_is_accepted_and_echoed() -> None:
    document = load_review("a003-create-mwan3policies")
    document["apiVersion"] = "admission.k8s.io/v1beta1"
    review = parse_review(document)
    assert review.api_version == "admission.k8s.io/v1beta1"
    response = build_response(review.api_version, review.request.uid, Decision.allow("x"))
    assert response["apiVersion"] == "admission.k8s.io/v1beta1"
    assert response["response"]["uid"] == "26e47aec-b2d8-46d1-abdd-d00b97a84b38"


def test_optional_fields_may_be_absent_or_null() -> None:
    document = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u",
            "operation": "CREATE",
            "resource": {"resource": "configmaps"},
            "userInfo": {"username": "alice", "groups": None},
            "namespace": None,
            "kind": None,
            "object": None,
            "dryRun": None,
        },
    }
    req = parse_review(document).request
    assert req.resource == Resource("", "configmaps")
    assert req.user.groups == ()
    assert (req.namespace, req.name, req.kind) == ("", "", "")
    assert req.object is None and req.old_object is None
    assert req.dry_run is False


def _broken(mutate: Any) -> dict[str, Any]:
    document = copy.deepcopy(load_review("a003-create-mwan3policies"))
    mutate(document)
    return document


def _set(path: str, value: Any):
    def mutate(document: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        target = document
        for key in parents:
            target = target[key]
        target[last] = value

    return mutate


def _drop(path: str):
    def mutate(document: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        target = document
        for key in parents:
            target = target[key]
        del target[last]

    return mutate


@pytest.mark.parametrize(
    ("document", "fragment"),
    [
        pytest.param([], "body must be a JSON object", id="list"),
        pytest.param("AdmissionReview", "body must be a JSON object", id="string"),
        pytest.param(None, "body must be a JSON object", id="null"),
        pytest.param(_set("kind", "AdmissionResponse"), "kind must be AdmissionReview", id="kind"),
        pytest.param(_drop("kind"), "kind must be AdmissionReview", id="no-kind"),
        pytest.param(_set("apiVersion", "admission.k8s.io/v2"), "apiVersion", id="api-version"),
        pytest.param(_set("apiVersion", "v1"), "apiVersion", id="api-version-core"),
        pytest.param(_drop("apiVersion"), "apiVersion", id="no-api-version"),
        pytest.param(_drop("request"), "request must be an object", id="no-request"),
        pytest.param(_set("request", []), "request must be an object", id="request-list"),
        pytest.param(_drop("request.uid"), "request.uid", id="no-uid"),
        pytest.param(_set("request.uid", ""), "request.uid must not be empty", id="empty-uid"),
        pytest.param(_set("request.uid", 7), "request.uid", id="uid-not-string"),
        pytest.param(_drop("request.operation"), "request.operation", id="no-operation"),
        pytest.param(_drop("request.resource"), "request.resource", id="no-resource"),
        pytest.param(_set("request.resource", "pods"), "request.resource", id="resource-string"),
        pytest.param(
            _drop("request.resource.resource"), "request.resource.resource", id="no-resource-name"
        ),
        pytest.param(_drop("request.userInfo"), "request.userInfo", id="no-user-info"),
        pytest.param(_set("request.userInfo", "alice"), "request.userInfo", id="user-string"),
        pytest.param(
            _set("request.userInfo.groups", "tenants"),
            "request.userInfo.groups",
            id="groups-not-list",
        ),
        pytest.param(
            _set("request.userInfo.groups", ["tenants", 3]),
            "request.userInfo.groups must be a list of strings",
            id="groups-not-strings",
        ),
        pytest.param(
            _set("request.userInfo.username", ["alice"]), "request.userInfo.username", id="user"
        ),
        pytest.param(
            _set("request.object", "p1"), "request.object must be an object", id="object-string"
        ),
        pytest.param(
            _set("request.object", [1]), "request.object must be an object", id="object-list"
        ),
        pytest.param(
            _set("request.oldObject", 1), "request.oldObject must be an object", id="old-object"
        ),
        pytest.param(
            _set("request.object.metadata", 7),
            "request.object.metadata must be an object",
            id="metadata-not-object",
        ),
        pytest.param(
            _set("request.object.metadata.labels", {"team": 1}),
            "request.object.metadata.labels must map strings to strings",
            id="label-value-not-string",
        ),
        pytest.param(
            _set("request.object.metadata.annotations", ["a"]),
            "request.object.metadata.annotations must map strings to strings",
            id="annotations-list",
        ),
        pytest.param(
            _set("request.object.metadata.namespace", ["default"]),
            "request.object.metadata.namespace must be a string",
            id="metadata-namespace-list",
        ),
        pytest.param(
            _set("request.object.metadata.ownerReferences", 7),
            "request.object.metadata.ownerReferences must be a list of objects",
            id="owner-references-int",
        ),
        pytest.param(
            _set("request.object.metadata.finalizers", "example.com/hold"),
            "request.object.metadata.finalizers must be a list of strings",
            id="finalizers-string",
        ),
        pytest.param(
            _set("request.object.metadata.finalizers", [{"name": "x"}]),
            "request.object.metadata.finalizers must be a list of strings",
            id="finalizer-not-string",
        ),
        pytest.param(_set("request.dryRun", "true"), "request.dryRun", id="dry-run-string"),
        pytest.param(_set("request.namespace", 1), "request.namespace", id="namespace-int"),
        pytest.param(_set("request.subResource", 1), "request.subResource", id="subresource-int"),
        pytest.param(
            _set("request.requestResource", "deployments"),
            "request.requestResource",
            id="request-resource-string",
        ),
        pytest.param(
            _set("request.requestResource", {"group": "apps"}),
            "request.requestResource.resource",
            id="request-resource-without-resource",
        ),
        pytest.param(
            _set("request.requestSubResource", ["scale"]),
            "request.requestSubResource",
            id="request-subresource-list",
        ),
    ],
)
def test_malformed_envelopes_raise(document: Any, fragment: str) -> None:
    if callable(document):
        document = _broken(document)
    with pytest.raises(ReviewError) as info:
        parse_review(document)
    assert fragment in str(info.value)


def test_allow_response() -> None:
    response = build_response("admission.k8s.io/v1", "u-1", Decision.allow("Unrestricted"))
    assert response == {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": "u-1", "allowed": True},
    }
    json.dumps(response)  # must be serialisable as is


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        pytest.param(403, "Forbidden", id="403"),
        pytest.param(422, "Invalid", id="422"),
        pytest.param(400, "BadRequest", id="400"),
        pytest.param(500, "InternalError", id="500"),
        pytest.param(503, "ServiceUnavailable", id="503"),
    ],
)
def test_deny_response_carries_status(code: int, reason: str) -> None:
    decision = Decision.deny("LabelNotPermitted", "no, because", code=code)
    response = build_response("admission.k8s.io/v1beta1", "u-2", decision)
    assert response == {
        "apiVersion": "admission.k8s.io/v1beta1",
        "kind": "AdmissionReview",
        "response": {
            "uid": "u-2",
            "allowed": False,
            "status": {
                "metadata": {},
                "status": "Failure",
                "code": code,
                "reason": reason,
                "message": "no, because",
            },
        },
    }


def test_warnings_are_carried_on_allow() -> None:
    decision = Decision.allow("LabelsPermitted", warnings=("object has no label team",))
    response = build_response("admission.k8s.io/v1", "u-3", decision)
    assert response["response"]["warnings"] == ["object has no label team"]
    assert "status" not in response["response"]


def test_internal_reason_is_not_the_status_reason() -> None:
    # The engine's reason (LabelNotPermitted) is for logs; the status reason is the HTTP one.
    response = build_response("admission.k8s.io/v1", "u", Decision.deny("LabelNotPermitted", "m"))
    assert response["response"]["status"]["reason"] == "Forbidden"
