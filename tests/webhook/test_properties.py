"""Property-based tests of the HTTP endpoints: hostile bodies of every shape, and the invariants.

For every body: never a 5xx, an answer on an intact connection, a malformed envelope → 400, the
``uid`` echoed on every decision, no internal-error decision, and afterwards the worker still
decides the known pair correctly. For mutations of a denied review (a field retyped or removed),
the answer is a 400 or still a denial, except where the mutation changes who asks or what is
asked, which RBAC judges anew. The profile (``tests/conftest.py``) sets how many examples run.
"""

from __future__ import annotations

import copy
import json
import string
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from hypothesis import given
from hypothesis import strategies as st

from app.engine.policy import DEFAULT_ANNOTATION_KEY
from app.settings import Settings
from app.source.static import StaticSource
from app.webhook.server import create_app
from app.webhook.wire import API_VERSIONS, MAX_MESSAGE_CHARS
from tests.conftest import EXAMPLES
from tests.process import Server, read_reply, serve
from tests.support import make_access_review, make_review
from tests.webhook.test_authorize import RBAC, Objects

Json = Any

# JSON values of every type, small enough to keep examples fast.
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
JSON = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=10,
)


def json_type(value: Json) -> str:
    return "bool" if isinstance(value, bool) else type(value).__name__


def wrong_type_for(value: Json) -> st.SearchStrategy[Json]:
    """Any JSON value whose type differs from ``value``'s (int and float count as one)."""
    numeric = {"int", "float"}
    kind = json_type(value)
    return JSON.filter(
        lambda other: (
            json_type(other) != kind and not (json_type(other) in numeric and kind in numeric)
        )
    )


def paths(value: Json, prefix: tuple[Any, ...] = (), depth: int = 6) -> Iterator[tuple[Any, ...]]:
    """Every key path into ``value`` (all list items), down to ``depth``."""
    if depth == 0:
        return
    items = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    for key, child in items:
        yield (*prefix, key)
        yield from paths(child, (*prefix, key), depth - 1)


def get(document: Json, path: tuple[Any, ...]) -> Json:
    for key in path:
        document = document[key]
    return document


@st.composite
def mutation(draw: st.DrawFn, base: Json) -> tuple[Json, tuple[Any, ...], str]:
    """``base`` with one field retyped, replaced by any JSON, or removed."""
    path = draw(st.sampled_from(sorted(paths(base), key=repr)))
    action = draw(st.sampled_from(["retype", "replace", "remove"]))
    document = copy.deepcopy(base)
    parent = get(document, path[:-1])
    if action == "remove":
        del parent[path[-1]]
    else:
        current = parent[path[-1]]
        parent[path[-1]] = draw(wrong_type_for(current) if action == "retype" else JSON)
    return document, path, action


# --- POST /validate --------------------------------------------------------------------------

# The example RBAC: alice may write team=a configmaps in t1, bob team=b.
ALLOWED = make_review("alice", "CREATE", "configmaps", namespace="t1", labels={"team": "a"})
DENIED_REVIEWS = {
    "create": make_review("bob", "CREATE", "configmaps", namespace="t1", labels={"team": "a"}),
    "steal": make_review(
        "bob",
        "UPDATE",
        "configmaps",
        namespace="t1",
        labels={"team": "b"},
        old_labels={"team": "a"},
    ),
    "delete": make_review("bob", "DELETE", "configmaps", namespace="t1", old_labels={"team": "a"}),
    "v1beta1": make_review(
        "bob",
        "CREATE",
        "configmaps",
        namespace="t1",
        labels={"team": "a"},
        api_version="admission.k8s.io/v1beta1",
    ),
}
# Fields whose change makes it another request: another user, resource, verb or object.
SUBJECT_FIELDS = {
    "userInfo", "resource", "subResource", "requestResource", "requestSubResource", "operation",
    "namespace", "name", "kind", "requestKind",
}  # fmt: skip


@pytest.fixture(scope="module")
def app() -> Flask:
    settings = Settings(rbac_dir=EXAMPLES)
    source = StaticSource(EXAMPLES, settings.compiler)
    source.start()
    application = create_app(settings, source)
    application.config["TESTING"] = True
    return application


@pytest.fixture(scope="module")
def client(app: Flask) -> FlaskClient:
    return app.test_client()


def envelope_is_valid(document: Json) -> bool:
    """What any reader needs before it can answer: the review's kind, version and uid."""
    request = document.get("request") if isinstance(document, dict) else None
    return (
        isinstance(document, dict)
        and document.get("kind") == "AdmissionReview"
        and document.get("apiVersion") in API_VERSIONS
        and isinstance(request, dict)
        and isinstance(request.get("uid"), str)
        and bool(request["uid"])
    )


def check_answer(status: int, body: Json, sent: Json) -> None:
    """The invariants every answer to /validate keeps; ``sent`` is the document, if JSON."""
    assert status in (200, 400), (status, body)
    if status == 400:
        assert body["code"] == 400 and body["error"]
        return
    assert envelope_is_valid(sent), "a malformed envelope must be a 400"
    assert body["apiVersion"] == sent["apiVersion"] and body["kind"] == "AdmissionReview"
    response = body["response"]
    assert response["uid"] == sent["request"]["uid"]
    assert isinstance(response["allowed"], bool)
    if not response["allowed"]:
        assert response["status"]["code"] != 500, response["status"]["message"]
        assert len(response["status"]["message"]) <= MAX_MESSAGE_CHARS


def still_decides(client: FlaskClient) -> None:
    assert client.post("/validate", json=ALLOWED).get_json()["response"]["allowed"] is True
    denied = client.post("/validate", json=DENIED_REVIEWS["create"]).get_json()["response"]
    assert denied["allowed"] is False and denied["status"]["code"] == 403


def post(client: FlaskClient, body: bytes) -> tuple[int, Json]:
    response = client.post("/validate", data=body, content_type="application/json")
    assert response.is_json, response.get_data()[:200]
    return response.status_code, response.get_json()


@given(data=st.data())
def test_a_mutated_denied_review_is_refused_or_still_denied(client: FlaskClient, data: Any) -> None:
    name = data.draw(st.sampled_from(sorted(DENIED_REVIEWS)))
    document, path, action = data.draw(mutation(DENIED_REVIEWS[name]))
    status, body = post(client, json.dumps(document).encode())
    check_answer(status, body, document)
    if status == 200 and action != "replace" and not set(path[1:2]) & SUBJECT_FIELDS:
        assert body["response"]["allowed"] is False, (path, action, body)
    still_decides(client)


@given(document=JSON)
def test_any_json_is_answered(client: FlaskClient, document: Json) -> None:
    status, body = post(client, json.dumps(document).encode())
    check_answer(status, body, document)
    assert status == 400


@given(body=st.binary(max_size=200))
def test_any_bytes_are_a_400(client: FlaskClient, body: bytes) -> None:
    status, answer = post(client, body)
    assert status == 400, answer


@given(
    body=st.builds(
        lambda text, codec: text.encode(codec),
        st.just(json.dumps(ALLOWED)),
        st.sampled_from(["utf-16", "utf-32", "latin-1", "cp1252"]),
    )
    | st.binary(min_size=1, max_size=4).map(lambda junk: json.dumps(ALLOWED).encode()[:-2] + junk)
)
def test_other_encodings_and_broken_utf8(client: FlaskClient, body: bytes) -> None:
    """UTF-16/32 are JSON text too; invalid UTF-8 is not; neither may crash anything."""
    status, answer = post(client, body)
    check_answer(status, answer, json.loads(body) if status == 200 else None)


@given(version=st.text(max_size=40).filter(lambda v: v not in API_VERSIONS))
def test_unknown_api_versions_are_400(client: FlaskClient, version: str) -> None:
    status, answer = post(client, json.dumps({**ALLOWED, "apiVersion": version}).encode())
    assert status == 400 and "apiVersion" in answer["error"]


LABEL_KEYS = st.text(string.ascii_letters + string.digits + "./-_", min_size=1, max_size=300)
HUGE_TEXT = st.one_of(st.text(max_size=50), st.integers(1, 100_000).map(lambda n: "x" * n))


@given(
    labels=st.dictionaries(LABEL_KEYS.filter(lambda k: k != "team"), HUGE_TEXT, max_size=50),
    annotations=st.dictionaries(
        st.sampled_from([DEFAULT_ANNOTATION_KEY, "kubernetes.io/config.mirror"]) | LABEL_KEYS,
        HUGE_TEXT | JSON.map(json.dumps),
        max_size=20,
    ),
    name=HUGE_TEXT,
)
def test_huge_labels_names_and_adversarial_annotations(
    client: FlaskClient, labels: dict[str, str], annotations: dict[str, str], name: str
) -> None:
    """Extra labels, any annotations and any name never turn bob's team=a denial into an allow."""
    review = copy.deepcopy(DENIED_REVIEWS["create"])
    review["request"]["name"] = name
    metadata = review["request"]["object"]["metadata"]
    metadata.update(name=name, annotations=annotations)
    metadata["labels"].update(labels)
    status, body = post(client, json.dumps(review).encode())
    check_answer(status, body, review)
    assert status == 200 and body["response"]["allowed"] is False
    still_decides(client)


@given(annotation=HUGE_TEXT | JSON.map(json.dumps) | st.sampled_from(["*a" * 30 + "b", "{}"]))
def test_roles_with_adversarial_annotations_are_judged(
    client: FlaskClient, annotation: str
) -> None:
    """Creating a Role with any annotation gets a decision: refused (422) when invalid."""
    review = make_review("alice", "CREATE", "roles.rbac.authorization.k8s.io", namespace="t1",
                         name="r", labels={}, kind="Role")  # fmt: skip
    obj = review["request"]["object"]
    obj["metadata"]["annotations"] = {DEFAULT_ANNOTATION_KEY: annotation}
    obj["rules"] = [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]
    status, body = post(client, json.dumps(review).encode())
    check_answer(status, body, review)
    assert status == 200
    still_decides(client)


# --- POST /authorize -------------------------------------------------------------------------

ACCESS_DENIED = {
    "list-without-selector": make_access_review("alice", "list", "configmaps", namespace="t1"),
    "get-other-bucket": make_access_review(
        "alice", "get", "configmaps", namespace="t1", name="cm-none"
    ),
}
ACCESS_SUBJECT_FIELDS = {
    "user", "groups", "group", "uid", "namespace", "verb", "resource", "subresource", "name",
}  # fmt: skip


@pytest.fixture(scope="module")
def access_client(tmp_path_factory: pytest.TempPathFactory) -> FlaskClient:
    directory: Path = tmp_path_factory.mktemp("access-rbac")
    (directory / "rbac.json").write_text(
        json.dumps({"kind": "List", "items": [obj for _, obj in RBAC]})
    )
    settings = Settings(rbac_dir=directory)
    source = Objects(directory, settings.compiler)
    source.start()
    return create_app(settings, source).test_client()


def access_answer(client: FlaskClient, document: Json) -> tuple[int, Json]:
    response = client.post("/authorize", data=json.dumps(document), content_type="application/json")
    assert response.status_code in (200, 400), response.get_data()[:300]
    body = response.get_json()
    if response.status_code == 200:
        assert isinstance(document, dict) and body["apiVersion"] == document["apiVersion"]
        assert body["kind"] == "SubjectAccessReview"
        assert body["status"]["allowed"] is False  # only ever narrows what RBAC decides
    else:
        assert body["code"] == 400
    return response.status_code, body


@given(data=st.data())
def test_a_mutated_denied_access_review_is_refused_or_still_denied(
    access_client: FlaskClient, data: Any
) -> None:
    name = data.draw(st.sampled_from(sorted(ACCESS_DENIED)))
    base = ACCESS_DENIED[name]
    assert access_answer(access_client, base)[1]["status"].get("denied") is True
    document, path, action = data.draw(mutation(base))
    status, body = access_answer(access_client, document)
    if status == 200 and action != "replace" and not set(path[-1:]) & ACCESS_SUBJECT_FIELDS:
        assert body["status"].get("denied") is True, (path, action, body)
    assert access_answer(access_client, base)[1]["status"].get("denied") is True


@given(document=JSON, body=st.binary(max_size=100))
def test_any_body_to_authorize_is_answered(
    access_client: FlaskClient, document: Json, body: bytes
) -> None:
    assert access_answer(access_client, document)[0] == 400
    response = access_client.post("/authorize", data=body, content_type="application/json")
    assert response.status_code == 400 and response.is_json


# --- The real server, over real sockets ------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("properties")
    with serve(tmp, "--rbac-dir", "manifests/examples", "--workers", "1", "--threads", "2") as srv:
        yield srv


@given(
    body=mutation(DENIED_REVIEWS["steal"]).map(lambda m: json.dumps(m[0]).encode())
    | st.binary(max_size=300)
    | JSON.map(lambda d: json.dumps(d).encode())
)
def test_the_real_server_answers_every_body_on_an_intact_connection(
    server: Server, body: bytes
) -> None:
    with server.connect() as sock:
        sock.sendall(
            b"POST /validate HTTP/1.1\r\nHost: webhook\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        reply = read_reply(sock)  # raises if the connection is dropped
        assert reply.status in (200, 400), reply
        if reply.status == 200:
            sent = json.loads(body)
            assert reply.json()["response"]["uid"] == sent["request"]["uid"]
        # The same connection goes on serving.
        sock.sendall(
            b"POST /validate HTTP/1.1\r\nHost: webhook\r\nContent-Length: %d\r\n\r\n%s"
            % (len(json.dumps(ALLOWED)), json.dumps(ALLOWED).encode())
        )
        assert read_reply(sock).json()["response"]["allowed"] is True
    assert server.review(DENIED_REVIEWS["create"])["response"]["allowed"] is False
