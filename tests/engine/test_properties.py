"""Property-based tests of the engine: any annotation, any object, any pod spec.

The engine may refuse, but it never raises, and malformed input never widens access: a role whose
annotation is not valid grants nothing, and a node's pod that is not a mirror pod is refused
whatever else its spec holds.
"""

from __future__ import annotations

import json
import string
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from app.engine.context import Context
from app.engine.decide import evaluate
from app.engine.policy import AnnotationError, Permissions, parse_permissions
from app.webhook.wire import ReviewError, parse_review
from tests.support import binding, make_review, role, rule, snapshot

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=12)
)
JSON = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)
GLOBS = st.text("ab*?-.", max_size=63)
# Annotations near the schema's shape, so that many are valid and the rest fail in varied ways.
SHAPED = st.dictionaries(
    st.sampled_from(["configmaps", "*", "config*", "configmaps/status", "secrets", ""]) | st.text(),
    st.lists(GLOBS, max_size=4)
    | st.dictionaries(st.sampled_from(["team", "env", "", "a/b"]), st.lists(GLOBS, max_size=3))
    | JSON,
    max_size=3,
).map(json.dumps)
ANNOTATIONS = SHAPED | JSON.map(json.dumps) | st.text(max_size=80)


@given(raw=ANNOTATIONS)
def test_any_annotation_parses_or_is_an_annotation_error(raw: str) -> None:
    try:
        assert isinstance(parse_permissions(raw), Permissions)
    except AnnotationError as exc:
        assert str(exc)


LABEL_VALUES = st.text(string.ascii_letters + string.digits + "-_.", max_size=63)


@given(
    annotation=ANNOTATIONS, labels=st.dictionaries(st.sampled_from(["team", "env"]), LABEL_VALUES)
)
def test_an_invalid_annotation_grants_nothing(annotation: str, labels: dict[str, str]) -> None:
    only = snapshot(
        role("r", "t1", [rule("create", "configmaps")], annotation),
        binding("b", "r", "User:bob", namespace="t1"),
    )
    review = make_review("bob", "CREATE", "configmaps", namespace="t1", labels=labels)
    decision = evaluate(parse_review(review).request, Context(only))
    try:
        parse_permissions(annotation)
    except AnnotationError:
        assert not decision.allowed and decision.reason == "InvalidAnnotation", decision
    else:
        assert decision.reason != "InvalidAnnotation"


POD_FIELDS = st.sampled_from(
    [
        "containers", "initContainers", "ephemeralContainers", "volumes", "serviceAccountName",
        "serviceAccount", "nodeName", "imagePullSecrets", "resourceClaims", "env", "envFrom",
        "configMap", "secret", "persistentVolumeClaim", "projected", "sources", "name",
    ]
)  # fmt: skip
POD_SPEC = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(POD_FIELDS, inner, max_size=4),
    max_leaves=20,
)


@given(spec=POD_SPEC, annotations=st.dictionaries(st.text(max_size=20), st.text(max_size=20)))
def test_a_node_creating_a_pod_that_is_not_a_mirror_pod_is_refused(
    spec: Any, annotations: dict[str, str]
) -> None:
    annotations.pop("kubernetes.io/config.mirror", None)
    review = make_review(
        "system:node:node1",
        "CREATE",
        "pods",
        groups=("system:nodes",),
        namespace="kube-system",
        labels={},
        kind="Pod",
        extra_object={"spec": spec},
    )
    review["request"]["object"]["metadata"]["annotations"] = annotations
    try:
        request = parse_review(review).request
    except ReviewError:
        return
    decision = evaluate(request, Context(snapshot()))
    assert not decision.allowed


@given(
    obj=st.dictionaries(st.sampled_from(["spec", "status", "data", "metadata", "rules"]), JSON),
    old=st.dictionaries(st.sampled_from(["spec", "status", "data", "metadata", "rules"]), JSON),
    resource=st.sampled_from(
        [
            "configmaps",
            "pods",
            "pods/status",
            "roles.rbac.authorization.k8s.io",
            "nodes",
            "rolebindings.rbac.authorization.k8s.io",
            "deployments.apps",
            "pods/binding",
        ]
    ),
    operation=st.sampled_from(["CREATE", "UPDATE", "DELETE", "CONNECT"]),
    user=st.sampled_from(["bob", "system:node:node1"]),
)
def test_any_object_the_envelope_accepts_is_decided(
    obj: dict[str, Any], old: dict[str, Any], resource: str, operation: str, user: str
) -> None:
    rbac = snapshot(
        role("r", "t1", [rule("*", "*", "*")], {"*": {"team": ["b"]}}),
        binding("b", "r", "User:bob", namespace="t1"),
    )
    review = make_review(user, operation, resource, namespace="t1", labels={}, old_labels={},
                         groups=("system:nodes",))  # fmt: skip
    review["request"]["object"].update(obj)
    review["request"]["oldObject"].update(old)
    try:
        request = parse_review(review).request
    except ReviewError:
        return
    decision = evaluate(request, Context(rbac))
    assert decision.code != 500
    if user == "bob" and resource == "configmaps" and operation != "CONNECT":
        # Both objects lack team=b (or carry a malformed label map): never allowed.
        assert not decision.allowed, decision
