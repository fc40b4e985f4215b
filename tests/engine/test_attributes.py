"""Request → RBAC attributes: which roles the label rule judges, one row per mapping entry.

Each row is docs/decision.md's table, step 1: an AdmissionReview as the API server
sends it (recorded, or built like one), the user's roles, and which of them the label rule
must find. Every restricted role here allows only ``team=a`` while the objects carry ``team=b``,
so the outcome shows whether a role was counted: ``LabelNotPermitted`` (a restricted role
granted it), ``Unrestricted`` (an unannotated role granted it) or ``NoGrantingRole`` (no role
granted what RBAC authorized).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pytest

from app.engine.context import Context, ParentUnavailable
from app.engine.decide import evaluate
from app.engine.model import Request
from app.webhook.wire import parse_review
from tests.support import RECENT, binding, load_review, make_review, role, rule, snapshot

RESTRICTED: dict[str, Any] = {"*": {"team": ["a"]}}
B = {"team": "b"}

# Objects the label rule looks up when the request does not carry them (CONNECT, eviction,
# scale), keyed by (resource, namespace, name); all in the other team's bucket.
PARENTS: Mapping[tuple[str, str, str], Mapping[str, Any]] = {
    ("pods", "t1", "web-b"): {"metadata": {"name": "web-b", "labels": B}},
    ("pods", "default", "app"): {"metadata": {"name": "app", "labels": B}},
    ("services", "t1", "svc-b"): {"metadata": {"name": "svc-b", "labels": B}},
    ("nodes", "", "node-b"): {"metadata": {"name": "node-b", "labels": B}},
    ("deployments", "t1", "d-b"): {"metadata": {"name": "d-b", "labels": B}},
}


def lookup(request: Request) -> Mapping[str, Any]:
    key = (request.resource.resource, request.namespace, request.name)
    if key not in PARENTS:
        raise ParentUnavailable(f"no {key} in this test")
    return PARENTS[key]


@dataclass(frozen=True)
class Grant:
    """One role bound to the reviewed user: in ``t1`` (a Role) or cluster-wide."""

    rules: tuple[dict[str, Any], ...]
    permissions: dict[str, Any] | None = None
    cluster: bool = False


def restricted(verbs: str, resources: str, groups: str = "", names: str = "") -> Grant:
    return Grant((rule(verbs, resources, groups, names),), RESTRICTED)


def open_(verbs: str, resources: str, groups: str = "", names: str = "") -> Grant:
    return Grant((rule(verbs, resources, groups, names),))


def decide(review: dict[str, Any], *grants: Grant) -> tuple[bool, str, str]:
    request = parse_review(review).request
    objects = []
    for i, grant in enumerate(grants):
        name = f"r{i}"
        namespace = "" if grant.cluster else (request.namespace or "t1")
        objects.append(role(name, namespace, list(grant.rules), grant.permissions))
        objects.append(binding(name, name, f"User:{request.user.username}", namespace=namespace))
    decision = evaluate(request, Context(snapshot(*objects), lookup=lookup))
    return decision.allowed, decision.reason, decision.message


def review(operation: str, resource: str, name: str = "c1", **kw: Any) -> dict[str, Any]:
    """A review by alice in t1; CREATE carries a team=b object, UPDATE and DELETE a stored one."""
    kw.setdefault("namespace", "t1")
    if operation in ("CREATE", "UPDATE") and "labels" not in kw:
        kw["labels"] = B
    if operation in ("UPDATE", "DELETE") and "old_labels" not in kw:
        kw["old_labels"] = B
    return make_review("alice", operation, resource, name=name, groups=("tenants",), **kw)


def connect(resource: str, name: str, namespace: str = "t1") -> dict[str, Any]:
    """A CONNECT: its object is the options (no labels of the target), as recorded in a019."""
    kind = {"exec": "PodExecOptions", "attach": "PodAttachOptions"}.get(
        resource.partition("/")[2], "PodProxyOptions"
    )
    return make_review(
        "alice", "CONNECT", resource, name=name, namespace=namespace, groups=("tenants",), kind=kind
    )


def recorded(name: str, recent: bool = True) -> dict[str, Any]:
    """A recorded review, made alice's in t1 where it was someone else's."""
    document = load_review(name, RECENT) if recent else load_review(name)
    document["request"]["userInfo"] = {"username": "alice", "groups": ["tenants"]}
    return document


DENIED = (False, "LabelNotPermitted")
NOT_GRANTED = (True, "NoGrantingRole")
UNRESTRICTED = (True, "Unrestricted")

MAPPING = [
    # --- CREATE -------------------------------------------------------------------------------
    pytest.param(
        recorded("c021-tenant-create-configmaps"),
        (restricted("create", "configmaps"),),
        DENIED,
        id="create-post-is-create-without-name",
    ),
    pytest.param(
        review("CREATE", "configmaps"),
        (restricted("create", "configmaps", names="c1"),),
        NOT_GRANTED,
        id="create-resource-names-rule-alone-is-never-used",
    ),
    pytest.param(
        review("CREATE", "configmaps"),
        (restricted("create", "configmaps", names="c1"), open_("patch", "configmaps", names="c1")),
        DENIED,
        id="create-by-apply-is-create-with-name-after-patch",
    ),
    pytest.param(
        review("CREATE", "configmaps"),
        (restricted("create", "configmaps", names="c1"), open_("update", "configmaps")),
        DENIED,
        id="create-by-put-is-create-with-name-after-update",
    ),
    pytest.param(
        review("CREATE", "configmaps", name="c2"),
        (restricted("create", "configmaps", names="c1"), open_("patch", "configmaps")),
        NOT_GRANTED,
        id="create-resource-names-other-name",
    ),
    pytest.param(
        review("CREATE", "configmaps", name=""),
        (restricted("create", "configmaps", names="c1"), open_("patch", "configmaps")),
        NOT_GRANTED,
        id="create-generate-name-has-no-name",
    ),
    pytest.param(
        review("CREATE", "configmaps"),
        (open_("create", "configmaps", names="c1"), restricted("create patch", "configmaps")),
        UNRESTRICTED,
        id="create-unrestricted-by-name-as-apply-would-be",
    ),
    pytest.param(
        recorded("a018-create-pods-eviction", recent=False),
        (restricted("create", "pods/eviction", names="app"),),
        DENIED,
        id="create-subresource-is-create-with-parent-name",
    ),
    # --- UPDATE -------------------------------------------------------------------------------
    pytest.param(
        recorded("c024-tenant-update-configmaps"),
        (restricted("update", "configmaps"),),
        DENIED,
        id="update-put-is-update",
    ),
    pytest.param(
        recorded("c024-tenant-update-configmaps"),
        (restricted("patch", "configmaps"),),
        DENIED,
        id="update-patch-is-patch",
    ),
    pytest.param(
        review("UPDATE", "configmaps"),
        (restricted("update patch", "configmaps", names="c1"),),
        DENIED,
        id="update-resource-names-listed",
    ),
    pytest.param(
        review("UPDATE", "configmaps", name="c2"),
        (restricted("update patch", "configmaps", names="c1"),),
        NOT_GRANTED,
        id="update-resource-names-other-name",
    ),
    pytest.param(
        review("UPDATE", "deployments.apps/status", name="d-b", kind="Deployment"),
        (restricted("update", "*/status", "*"),),
        DENIED,
        id="update-subresource-star-sub-rule",
    ),
    pytest.param(
        review("UPDATE", "deployments.apps/status", name="d-b", kind="Deployment"),
        (restricted("update", "deployments", "apps"),),
        NOT_GRANTED,
        id="update-subresource-not-granted-by-parent-rule",
    ),
    pytest.param(
        review("UPDATE", "deployments.apps/scale", name="d-b", kind="Scale"),
        (restricted("patch", "deployments/scale", "apps"),),
        DENIED,
        id="update-scale-is-subresource-with-parent-name",
    ),
    # --- DELETE -------------------------------------------------------------------------------
    pytest.param(
        review("DELETE", "configmaps"),
        (restricted("delete", "configmaps", names="c1"),),
        DENIED,
        id="delete-named-is-delete-with-name",
    ),
    pytest.param(
        review("DELETE", "configmaps"),
        (restricted("deletecollection", "configmaps"),),
        NOT_GRANTED,
        id="delete-named-is-not-deletecollection",
    ),
    pytest.param(
        recorded("c019-tenant-delete-configmaps"),
        (restricted("deletecollection", "configmaps"),),
        DENIED,
        id="deletecollection-arrives-nameless-per-object",
    ),
    pytest.param(
        recorded("c019-tenant-delete-configmaps"),
        (restricted("delete", "configmaps"),),
        NOT_GRANTED,
        id="deletecollection-is-not-delete",
    ),
    pytest.param(
        recorded("c019-tenant-delete-configmaps"),
        (restricted("deletecollection", "configmaps", names="cm-b"),),
        NOT_GRANTED,
        id="deletecollection-resource-names-never-match",
    ),
    # --- CONNECT ------------------------------------------------------------------------------
    pytest.param(
        recorded("a019-connect-pods-exec", recent=False),
        (restricted("create", "pods/exec"),),
        DENIED,
        id="connect-exec-post-is-create",
    ),
    pytest.param(
        recorded("a019-connect-pods-exec", recent=False),
        (restricted("get", "pods/exec"),),
        DENIED,
        id="connect-exec-websocket-is-get",
    ),
    pytest.param(
        recorded("a019-connect-pods-exec", recent=False),
        (open_("get", "pods/exec"), restricted("create", "pods/exec")),
        DENIED,
        id="connect-exec-every-verb-held-must-permit",
    ),
    pytest.param(
        connect("pods/attach", "web-b"),
        (restricted("create", "pods/attach", names="web-b"),),
        DENIED,
        id="connect-attach-is-named",
    ),
    pytest.param(
        connect("pods/exec", "web-b"),
        (restricted("update patch delete", "pods/exec"),),
        NOT_GRANTED,
        id="connect-exec-is-only-get-or-create",
    ),
    *(
        pytest.param(
            connect("pods/proxy", "web-b"),
            (restricted(verb, "pods/proxy"),),
            DENIED,
            id=f"connect-proxy-{method}-is-{verb.strip('*') or 'star'}",
        )
        for method, verb in (
            ("get", "get"),
            ("post", "create"),
            ("put", "update"),
            ("patch", "patch"),
            ("delete", "delete"),
            ("options", "*"),
        )
    ),
    pytest.param(
        connect("pods/proxy", "web-b"),
        (open_("get", "pods/proxy"), restricted("update", "pods/proxy")),
        DENIED,
        id="connect-proxy-every-verb-held-must-permit",
    ),
    pytest.param(
        connect("services/proxy", "svc-b"),
        (restricted("patch", "services/proxy"),),
        DENIED,
        id="connect-service-proxy",
    ),
    pytest.param(
        connect("nodes/proxy", "node-b", namespace=""),
        (Grant((rule("delete", "nodes/proxy"),), RESTRICTED, cluster=True),),
        DENIED,
        id="connect-node-proxy-cluster-scoped",
    ),
    # --- matchPolicy: Equivalent --------------------------------------------------------------
    pytest.param(
        review(
            "UPDATE",
            "deployments.apps",
            name="d-b",
            kind="Deployment",
            request_resource="deployments.extensions",
        ),
        (restricted("update", "deployments", "extensions"),),
        DENIED,
        id="equivalent-roles-match-the-requested-resource",
    ),
    pytest.param(
        review(
            "UPDATE",
            "deployments.apps",
            name="d-b",
            kind="Deployment",
            request_resource="deployments.extensions",
        ),
        (restricted("update", "deployments", "apps"),),
        NOT_GRANTED,
        id="equivalent-roles-on-the-converted-resource-did-not-grant",
    ),
    pytest.param(
        review(
            "UPDATE",
            "deployments.apps",
            name="d-b",
            kind="Deployment",
            request_resource="deployments.extensions",
        ),
        (
            Grant(
                (rule("update", "deployments", "apps extensions"),),
                {"deployments.extensions": {"team": ["a"]}, "deployments.apps": {"team": ["b"]}},
            ),
        ),
        DENIED,
        id="equivalent-entries-match-the-requested-resource",
    ),
    pytest.param(
        review(
            "UPDATE",
            "deployments.apps/scale",
            name="d-b",
            kind="Scale",
            request_resource="deployments.extensions/scale",
        ),
        (restricted("update", "deployments/scale", "extensions"),),
        DENIED,
        id="equivalent-requested-subresource",
    ),
    # --- rule fields and request scope --------------------------------------------------------
    pytest.param(
        review("CREATE", "configmaps"),
        (
            Grant(
                ({"verbs": ["create"], "apiGroups": [], "resources": ["configmaps"]},),
                RESTRICTED,
            ),
        ),
        NOT_GRANTED,
        id="rule-without-api-groups-grants-nothing",
    ),
    pytest.param(
        review("CREATE", "configmaps", dry_run=True),
        (restricted("create", "configmaps"),),
        DENIED,
        id="dry-run-is-authorized-like-the-real-request",
    ),
    pytest.param(
        review("CREATE", "configmaps", user_extra={"reason": ["impersonated by admin"]}),
        (restricted("create", "configmaps"),),
        DENIED,
        id="impersonation-user-info-is-the-impersonated-user",
    ),
    pytest.param(
        review("UPDATE", "namespaces", name="t1", kind="Namespace"),
        (restricted("update", "namespaces"),),
        DENIED,
        id="namespace-object-is-in-its-own-namespace",
    ),
    pytest.param(
        review("UPDATE", "nodes", name="node-b", namespace="", kind="Node"),
        (restricted("update", "nodes"),),
        NOT_GRANTED,
        id="cluster-scoped-only-cluster-role-bindings",
    ),
]


@pytest.mark.parametrize(("document", "grants", "expected"), MAPPING)
def test_request_to_rbac_attributes(
    document: dict[str, Any], grants: tuple[Grant, ...], expected: tuple[bool, str]
) -> None:
    allowed, reason, message = decide(document, *grants)
    assert (allowed, reason) == expected, message


@pytest.mark.parametrize(
    ("document", "grants", "fragment"),
    [
        pytest.param(
            recorded("c019-tenant-delete-configmaps"),
            (restricted("deletecollection", "configmaps"),),
            'user "alice" may not deletecollection configmaps "cm-b" in namespace "t1": ',
            id="deletecollection-names-the-object",
        ),
        pytest.param(
            connect("pods/proxy", "web-b"),
            (restricted("update", "pods/proxy"),),
            'user "alice" may not update pods/proxy "web-b" in namespace "t1": ',
            id="connect-names-the-verb-that-refused",
        ),
        pytest.param(
            review(
                "UPDATE",
                "deployments.apps",
                name="d-b",
                kind="Deployment",
                request_resource="deployments.extensions",
            ),
            (restricted("update", "deployments", "extensions"),),
            'user "alice" may not update deployments.extensions "d-b" in namespace "t1": ',
            id="equivalent-names-the-requested-resource",
        ),
    ],
)
def test_denial_names_what_rbac_authorized(
    document: dict[str, Any], grants: tuple[Grant, ...], fragment: str
) -> None:
    allowed, _, message = decide(document, *grants)
    assert not allowed
    assert message.startswith(fragment), message


def _recorded_sar(name: str) -> dict[str, Any]:
    path = RECENT / "subject-access-reviews" / f"{name}.json"
    attributes: dict[str, Any] = json.loads(path.read_text())["spec"]["resourceAttributes"]
    return attributes


@pytest.mark.parametrize(
    ("admission", "authorized"),
    [
        pytest.param(
            "c021-tenant-create-configmaps", ("c020-tenant-create-configmaps",), id="post"
        ),
        pytest.param(
            "c033-tenant-create-deployments",
            ("c031-tenant-patch-deployments", "c032-tenant-create-deployments"),
            id="server-side-apply-create",
        ),
        pytest.param(
            "c024-tenant-update-configmaps", ("c023-tenant-patch-configmaps",), id="patch"
        ),
        pytest.param(
            "c036-tenant-update-deployments-scale",
            ("c035-tenant-patch-deployments-scale",),
            id="patch-scale",
        ),
        pytest.param(
            "c038-tenant-update-pods-ephemeralcontainers",
            ("c037-tenant-patch-pods-ephemeralcontainers",),
            id="patch-ephemeralcontainers",
        ),
        pytest.param(
            "c048-node-update-pods-status", ("c047-node-patch-pods-status",), id="patch-status"
        ),
        pytest.param(
            "c026-tenant-delete-configmaps", ("c025-tenant-delete-configmaps",), id="delete"
        ),
        pytest.param(
            "c019-tenant-delete-configmaps",
            ("c018-tenant-deletecollection-configmaps",),
            id="deletecollection",
        ),
    ],
)
def test_recorded_authorizations_are_in_the_mapping(
    admission: str, authorized: tuple[str, ...]
) -> None:
    """The authorization webhook recorded what the API server asked before each admission
    review: the last ask is one of the mapping's alternatives, those before it its ``after``."""
    request = parse_review(load_review(admission, RECENT)).request
    *before, deciding = (_recorded_sar(name) for name in authorized)
    resource = request.authorized_resource
    assert (deciding.get("group", ""), deciding["resource"], deciding.get("subresource", "")) == (
        resource.group,
        resource.resource,
        resource.subresource,
    )
    assert deciding.get("namespace", "") == request.namespace
    matching = [
        alt
        for alternatives in request.authorizations
        for alt in alternatives
        if (alt.verb, alt.name) == (deciding["verb"], deciding.get("name", ""))
    ]
    assert matching, request.authorizations
    for earlier in before:
        assert earlier.get("name", "") == matching[0].name
        assert earlier["verb"] in matching[0].after
