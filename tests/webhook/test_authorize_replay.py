"""Replay every recorded SubjectAccessReview (kube-apiserver v1.35) through ``POST /authorize``,
and every AdmissionReview of the same recording through ``POST /validate``, against the RBAC of
that recording (tests/scenarios/v135-rbac.yaml, written from its README).

The objects the reviews name carry the labels the README gives them; the webhook reads them as a
metadata lookup would (only ``metadata``), from the state at the time of each review: cm-a is
team=a for every SubjectAccessReview (c024 relabels it to team=b after the last get of it).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pytest
from flask.testing import FlaskClient

from app.engine.context import ObjectRef, ParentUnavailable
from app.engine.model import AccessDecision, Decision, Request
from app.settings import Settings
from app.source.static import StaticSource
from app.webhook.server import create_app
from app.webhook.wire_sar import AccessReview
from tests.support import ACCESS_REVIEWS, V135_RBAC, V135_REVIEWS

SETTINGS = Settings(rbac_dir=V135_RBAC)
SARS = sorted(p.stem for p in ACCESS_REVIEWS.glob("c*.json"))
ADMISSIONS = sorted(p.stem for p in V135_REVIEWS.glob("c*.json"))


def _meta(name: str, namespace: str = "t1", **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace, "labels": labels}}


# (group, resource, namespace, name) → the object as a metadata-only read returns it.
OBJECTS: dict[tuple[str, str, str, str], dict[str, Any]] = {
    ("", "configmaps", "t1", "cm-a"): _meta("cm-a", team="a"),
    ("", "configmaps", "t1", "cm-b"): _meta("cm-b", team="b"),
    ("", "secrets", "t1", "s-ref"): _meta("s-ref", team="a"),
    ("", "secrets", "t1", "s-other"): _meta("s-other", team="b"),
    ("", "pods", "t1", "web-a"): _meta("web-a", team="a", app="web"),
    ("", "pods", "t1", "web-b"): _meta("web-b", team="b", app="web"),
    # As c033 created it: labeled team=a, its pod template team=b.
    ("apps", "deployments", "t1", "d-a"): json.loads(
        (V135_REVIEWS / "c033-tenant-create-deployments.json").read_text()
    )["request"]["object"],
    ("", "nodes", "", "node1"): _meta("node1", ""),
    ("", "nodes", "", "node2"): _meta("node2", ""),
}


class RecordedCluster(StaticSource):
    """The recording's RBAC from files, and its objects readable by metadata and as parents."""

    def __init__(self) -> None:
        super().__init__(V135_RBAC, SETTINGS.compiler)
        self.reads: list[ObjectRef] = []

    def fetch_metadata(self, ref: ObjectRef) -> Mapping[str, Any]:
        self.reads.append(ref)
        found = OBJECTS.get((ref.group, ref.resource, ref.namespace, ref.name))
        if found is None:
            raise ParentUnavailable(f"could not read {ref}: HTTP 404 NotFound")
        return {"metadata": found["metadata"]}

    def fetch_parent(self, request: Request) -> Mapping[str, Any]:
        res = request.resource
        found = OBJECTS.get((res.group, res.resource, request.namespace, request.name))
        if found is None:
            raise ParentUnavailable(f"could not read {res.resource} {request.name}: HTTP 404")
        return found


@dataclass
class Webhook:
    client: FlaskClient
    source: RecordedCluster
    answers: list[AccessDecision]
    decisions: list[Decision]

    def authorize(self, document: Mapping[str, Any]) -> tuple[dict[str, Any], AccessDecision]:
        seen = len(self.answers)
        response = self.client.post("/authorize", json=document)
        assert response.status_code == 200, response.get_data(as_text=True)
        (decision,) = self.answers[seen:]
        return response.get_json(), decision


@pytest.fixture(scope="module")
def webhook() -> Webhook:
    source = RecordedCluster()
    source.start()
    answers: list[AccessDecision] = []
    decisions: list[Decision] = []

    def on_access(_r: AccessReview, d: AccessDecision, _s: float) -> None:
        answers.append(d)

    app = create_app(
        SETTINGS,
        source,
        observers=(lambda _r, d, _s: decisions.append(d),),
        access_observers=(on_access,),
    )
    app.config["TESTING"] = True
    return Webhook(app.test_client(), source, answers, decisions)


# --- What each SubjectAccessReview must get --------------------------------------------------


@dataclass(frozen=True)
class Expect:
    verdict: str  # "Deny" or "NoOpinion": the webhook never allows what RBAC decides
    reason: str
    why: str
    message: str = ""


ROLE = "role t1/team-a allows team in [a]"
LIST_CM = (
    'user "alice" may list configmaps in namespace "t1" only with a label selector within '
    "team in [a] (add -l team=a)"
)


def _no(reason: str, why: str) -> Expect:
    return Expect("NoOpinion", reason, why)


def _deny(reason: str, why: str, message: str) -> Expect:
    return Expect("Deny", reason, why, message)


NON_RESOURCE = _no("NonResource", "a path outside the resource API: RBAC decides")
WRITE = _no("NotARead", "writes are judged by admission, with the objects in hand")
NODE = _no(
    "Unrestricted",
    "without the node authorizer, system:node (bootstrap, no annotation) grants it unrestricted",
)
NODE_WRITE = _no("NotARead", "a node's write: admission (NodeRestriction rules) judges it")

EXPECTED: dict[str, Expect] = {
    "c001-tenant-get-nonresource": NON_RESOURCE,
    "c002-tenant-get-configmaps": _no("LabelsPermitted", "cm-a is labeled team=a"),
    "c003-tenant-get-configmaps": _deny(
        "LabelNotPermitted",
        "cm-b is labeled team=b",
        'user "alice" may not get configmaps "cm-b" in namespace "t1": the existing object\'s '
        f'label team="b" is not permitted ({ROLE})',
    ),
    "c004-tenant-list-configmaps": _deny(
        "SelectorNotWithinLabels", "no selector: the list would include team=b", LIST_CM
    ),
    "c005-tenant-list-configmaps": _no("SelectorWithinLabels", "team=a confines team to a"),
    "c006-tenant-list-configmaps": _deny(
        "SelectorNotWithinLabels", "team in (a,b) reaches team=b", LIST_CM
    ),
    "c007-tenant-list-configmaps": _deny(
        "SelectorNotWithinLabels", "team!=b matches unlabeled and other teams", LIST_CM
    ),
    "c008-tenant-list-configmaps": _deny(
        "SelectorNotWithinLabels", "Exists confines no value", LIST_CM
    ),
    "c009-tenant-list-configmaps": _no(
        "SelectorWithinLabels", "team=a,app=x: an extra key only narrows"
    ),
    "c010-tenant-list-configmaps": _no(
        "LabelsPermitted", "a list by metadata.name returns at most cm-a, labeled team=a"
    ),
    "c011-tenant-list-configmaps": _no(
        "NoGrantingRole", "across namespaces only ClusterRoleBindings count: none grants it"
    ),
    "c012-tenant-watch-configmaps": _no("SelectorWithinLabels", "watch -l team=a"),
    "c013-tenant-get-nonresource": NON_RESOURCE,
    "c014-tenant-get-secrets": _no("LabelsPermitted", "s-ref is labeled team=a"),
    "c015-tenant-list-pods": _no("SelectorWithinLabels", "list pods -l team=a"),
    "c016-tenant-get-pods": _no("LabelsPermitted", "web-a is labeled team=a"),
    "c017-tenant-get-pods-log": _no(
        "LabelsPermitted", "pods/log is judged by the pod's labels (the pods entry covers it)"
    ),
    "c018-tenant-deletecollection-configmaps": _deny(
        "SelectorNotWithinLabels",
        "a deletecollection of team=b",
        'user "alice" may deletecollection configmaps in namespace "t1" only with a label '
        "selector within team in [a] (add -l team=a)",
    ),
    "c020-tenant-create-configmaps": WRITE,
    "c022-tenant-get-configmaps": _no("LabelsPermitted", "cm-a is still team=a here"),
    "c023-tenant-patch-configmaps": WRITE,
    "c025-tenant-delete-configmaps": WRITE,
    "c027-tenant-get-nonresource": NON_RESOURCE,
    "c028-tenant-create-selfsubjectaccessreviews": WRITE,
    "c029-tenant-list-configmaps": _deny(
        "SelectorNotWithinLabels",
        "kubectl auth can-i list configmaps (version *): without a selector, no",
        LIST_CM,
    ),
    "c030-tenant-get-nonresource": NON_RESOURCE,
    "c031-tenant-patch-deployments": WRITE,
    "c032-tenant-create-deployments": WRITE,
    "c034-tenant-get-deployments": _no("LabelsPermitted", "d-a is labeled team=a"),
    "c035-tenant-patch-deployments-scale": WRITE,
    "c037-tenant-patch-pods-ephemeralcontainers": WRITE,
    "c039-node-get-secrets": NODE,
    "c040-node-get-secrets": NODE,
    "c041-node-get-configmaps": NODE,
    "c042-node-list-pods": NODE,
    "c043-node-list-pods": NODE,
    "c044-node-get-nodes": NODE,
    "c045-node-get-nodes": NODE,
    "c046-node-list-nodes": NODE,
    "c047-node-patch-pods-status": NODE_WRITE,
    "c049-node-create-serviceaccounts-token": NODE_WRITE,
    "c050-node-get-nonresource": NON_RESOURCE,
}


def test_every_recorded_review_has_an_expectation() -> None:
    assert len(SARS) == 42
    assert sorted(EXPECTED) == SARS


@pytest.mark.parametrize("stem", SARS)
def test_replay_subject_access_review(stem: str, webhook: Webhook) -> None:
    expect = EXPECTED[stem]
    document = json.loads((ACCESS_REVIEWS / f"{stem}.json").read_text())

    body, decision = webhook.authorize(document)

    assert (decision.verdict.value, decision.reason) == (expect.verdict, expect.reason), (
        expect.why,
        decision,
    )
    assert body["apiVersion"] == "authorization.k8s.io/v1"
    assert body["kind"] == "SubjectAccessReview"
    status = body["status"]
    # Before RBAC in the chain, the webhook only ever narrows: it never allows.
    assert status["allowed"] is False
    if expect.verdict == "Deny":
        assert status == {"allowed": False, "denied": True, "reason": expect.message}
    else:
        assert status == {"allowed": False}


def test_gets_read_metadata_of_the_named_object_only(webhook: Webhook) -> None:
    before = len(webhook.source.reads)
    webhook.authorize(json.loads((ACCESS_REVIEWS / "c017-tenant-get-pods-log.json").read_text()))
    webhook.authorize(json.loads((ACCESS_REVIEWS / "c005-tenant-list-configmaps.json").read_text()))
    # pods/log reads the pod itself; a list by selector reads nothing.
    assert webhook.source.reads[before:] == [ObjectRef("", "v1", "pods", "t1", "web-a")]


# --- The AdmissionReviews of the same recording ----------------------------------------------


@dataclass(frozen=True)
class Admission:
    allowed: bool
    reason: str
    why: str
    contains: str = ""


ADMITTED: dict[str, Admission] = {
    "c019-tenant-delete-configmaps": Admission(
        False,
        "LabelNotPermitted",
        "the deletecollection arrives as one DELETE per object: cm-b is team=b",
        'the existing object\'s label team="b" is not permitted',
    ),
    "c021-tenant-create-configmaps": Admission(
        False, "LabelNotPermitted", "cm-new carries no team label", "missing label team"
    ),
    "c024-tenant-update-configmaps": Admission(
        False, "LabelNotPermitted", "relabelling cm-a to team=b", 'label team="b" is not permitted'
    ),
    "c026-tenant-delete-configmaps": Admission(
        False,
        "LabelNotPermitted",
        "cm-a was relabelled to team=b by c024 (recorded without the webhook enforcing)",
        'the existing object\'s label team="b" is not permitted',
    ),
    "c033-tenant-create-deployments": Admission(
        False,
        "TemplateLabelNotPermitted",
        "d-a is labeled team=a, but its pod template would make team=b pods",
        'its pod template (spec.template) has label team="b", not permitted for pods',
    ),
    "c036-tenant-update-deployments-scale": Admission(
        False,
        "TemplateLabelNotPermitted",
        "the parent d-a (team=a) passes the label rule; scaling it makes pods of its team=b "
        "template (d-a was recorded without the webhook enforcing)",
        'its stored pod template (spec.template) has label team="b"',
    ),
    "c038-tenant-update-pods-ephemeralcontainers": Admission(
        True, "LabelsPermitted", "the whole Pod is object and oldObject: team=a on both"
    ),
    "c048-node-update-pods-status": Admission(
        True, "Unrestricted", "node1 updates the status of its own pod; system:node is unrestricted"
    ),
}


def test_every_recorded_admission_review_has_an_expectation() -> None:
    assert sorted(ADMITTED) == ADMISSIONS


@pytest.mark.parametrize("stem", ADMISSIONS)
def test_replay_admission_review(stem: str, webhook: Webhook) -> None:
    expect = ADMITTED[stem]
    document = json.loads((V135_REVIEWS / f"{stem}.json").read_text())
    seen = len(webhook.decisions)

    response = webhook.client.post("/validate", json=document)

    assert response.status_code == 200
    body = response.get_json()["response"]
    assert body["uid"] == document["request"]["uid"]
    assert body["allowed"] is expect.allowed, (expect.why, body)
    (decision,) = webhook.decisions[seen:]
    assert decision.reason == expect.reason, (expect.why, decision)
    if not expect.allowed:
        assert expect.contains in body["status"]["message"]
