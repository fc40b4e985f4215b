"""Which served resources the label rule always allows (the registration may leave them out),
and the fence refusing RBAC writes that would hand out a restriction not yet covered."""

from __future__ import annotations

from typing import Any

import pytest

from app.engine.context import UNKNOWN, Context, Registration, registered_unjudged
from app.engine.coverage import ALWAYS_JUDGED, FENCE_WORK, check_coverage, unjudged
from app.engine.decide import evaluate
from app.engine.model import Resource
from app.engine.rbac import Restrictions, RoleRef
from app.webhook.wire import parse_review
from tests.support import binding, make_review, role, rule, snapshot

CONFIGMAPS = Resource("", "configmaps")
SECRETS = Resource("", "secrets")
WIDGETS = Resource("example.com", "widgets")
GADGETS = Resource("example.com", "gadgets")
INGRESSES = Resource("networking.k8s.io", "ingresses")
SERVED = (CONFIGMAPS, SECRETS, WIDGETS, GADGETS, INGRESSES)
EVERYTHING = ("configmaps", "gadgets.example.com", "ingresses.networking.k8s.io", "secrets",
              "widgets.example.com")  # fmt: skip
TEAM = {"team": ["a"]}


def restricting(*patterns: str, rules: list[dict[str, Any]] | None = None) -> Any:
    return role("r", "t1", rules or [rule("get", "configmaps")], {p: TEAM for p in patterns})


@pytest.mark.parametrize(
    ("roles", "expected"),
    [
        pytest.param([], EVERYTHING, id="no-annotation-at-all"),
        pytest.param(
            [role("plain", "t1", [rule("*", "*", "*")])], EVERYTHING, id="unannotated-wildcard-role"
        ),
        pytest.param(
            [restricting("configmaps")], EVERYTHING[1:], id="literal-pattern-names-its-resource"
        ),
        pytest.param(
            [restricting("widgets.example.com")],
            ("configmaps", "gadgets.example.com", "ingresses.networking.k8s.io", "secrets"),
            id="group-qualified",
        ),
        pytest.param(
            [restricting("widgets")],
            ("configmaps", "gadgets.example.com", "ingresses.networking.k8s.io", "secrets"),
            id="no-group-matches-any-group",
        ),
        pytest.param(
            [restricting("widgets.other.io")], EVERYTHING, id="other-group-names-nothing-served"
        ),
        pytest.param(
            [restricting("*.example.com")],
            ("configmaps", "ingresses.networking.k8s.io", "secrets"),
            id="glob-over-the-group",
        ),
        pytest.param(
            [restricting("?ecrets", "ingress*")],
            ("configmaps", "gadgets.example.com", "widgets.example.com"),
            id="globs-over-the-resource",
        ),
        pytest.param([restricting("*")], (), id="star-restricts-everything"),
        pytest.param(
            [restricting("configmaps/status")],
            EVERYTHING[1:],
            id="subresource-pattern-judges-parent",
        ),
        pytest.param(
            [restricting("*/scale")], (), id="any-resource-subresource-pattern-judges-all"
        ),
        pytest.param(
            [role("cluster", "", [], {"secrets": TEAM})],
            (
                "configmaps",
                "gadgets.example.com",
                "ingresses.networking.k8s.io",
                "widgets.example.com",
            ),
            id="unbound-clusterrole-counts",
        ),
        pytest.param(
            [role("broken", "t1", [rule("create", "widgets", "example.com")], "{not json")],
            ("configmaps", "gadgets.example.com", "ingresses.networking.k8s.io", "secrets"),
            id="broken-annotation-judges-what-its-rules-grant",
        ),
        pytest.param(
            [role("broken", "t1", [rule("create", "*/status", "*")], "{not json")],
            (),
            id="broken-with-any-resource-subresource-rule",
        ),
        pytest.param(
            [role("broken", "t1", [rule("*", "*", "example.com")], "[]")],
            ("configmaps", "ingresses.networking.k8s.io", "secrets"),
            id="broken-with-star-resources-in-one-group",
        ),
        pytest.param(
            [role("broken", "t1", [rule("*", "*", "*")], {"configmaps": TEAM}, mode="loud")],
            (),
            id="invalid-mode-is-broken-too",
        ),
    ],
)
def test_unjudged(roles: list[Any], expected: tuple[str, ...]) -> None:
    found = unjudged(snapshot(*roles).restrictions(), SERVED)
    assert found == expected


def test_always_judged_kinds_are_never_unjudged() -> None:
    """Pods, workloads, autoscalers, legacy bindings, ServiceAccounts (token requests) and RBAC
    objects go to the webhook whatever the annotations say."""
    served = [Resource(group, resource) for group, resource in ALWAYS_JUDGED]
    assert unjudged(Restrictions(), [*served, CONFIGMAPS]) == ("configmaps",)
    assert {("", "serviceaccounts"), ("apps", "deployments"), ("", "pods")} <= ALWAYS_JUDGED


def test_only_served_resources_are_unjudged() -> None:
    """A resource discovery has not listed (a new CRD) stays sent to the webhook; subresources
    and names that are no plain key are never listed."""
    served = [CONFIGMAPS, Resource("", "configmaps", "status"), Resource("x.io", "Odd Name")]
    assert unjudged(Restrictions(), served) == ("configmaps",)


def test_the_work_is_linear_in_distinct_patterns() -> None:
    """Ten thousand roles repeating one annotation cost one pattern."""
    roles = [restricting("configmaps") for _ in range(10)]
    many = snapshot(*[role(f"r{i}", f"t{i}", [], {"secrets": TEAM}) for i in range(10_000)], *roles)
    assert unjudged(many.restrictions(), SERVED) == (
        "gadgets.example.com",
        "ingresses.networking.k8s.io",
        "widgets.example.com",
    )


@pytest.mark.parametrize(
    ("annotation", "expected"),
    [
        pytest.param(None, frozenset(), id="absent"),
        pytest.param("[]", frozenset(), id="empty"),
        pytest.param(
            '["configmaps", "widgets.example.com"]',
            {"configmaps", "widgets.example.com"},
            id="keys",
        ),
        pytest.param("not json", {UNKNOWN}, id="not-json"),
        pytest.param('{"a": 1}', {UNKNOWN}, id="not-a-list"),
        pytest.param('["ok", "NOT OK"]', {UNKNOWN}, id="a-non-key"),
        pytest.param("[1]", {UNKNOWN}, id="not-strings"),
    ],
)
def test_registered_unjudged(annotation: str | None, expected: frozenset[str]) -> None:
    annotations = {} if annotation is None else {"labelrbac.io/unjudged": annotation}
    assert registered_unjudged({"metadata": {"annotations": annotations}}) == expected


# -- The fence ---------------------------------------------------------------------------------

WIDGET_ROLE = role(
    "widgets",
    "t1",
    [rule("create update", "widgets", "example.com")],
    {"widgets.example.com": TEAM},
)
READ_ONLY = role("reader", "t1", [rule("get list", "widgets", "example.com")], {"widgets": TEAM})
BOUND = binding("existing", "widgets", "User:carol", namespace="t1")
BROKEN = role("broken", "t1", [rule("create", "widgets", "example.com")], "{not json")
PROXY = role("proxy", "t1", [rule("get", "widgets/proxy", "example.com")], {"widgets": TEAM})
WIDE = role("wide", "t1", [rule("*", "*", "*")], {"wid*": TEAM})
PENDING = Registration(frozenset({"widgets.example.com"}), frozenset({RoleRef("t1", "widgets")}))


def rbac_review(operation: str, obj: Any, old: Any = None, resource: str = "") -> Any:
    kind, body = obj
    plural = {"Role": "roles", "RoleBinding": "rolebindings", "ClusterRole": "clusterroles",
              "ClusterRoleBinding": "clusterrolebindings"}[kind]  # fmt: skip
    review = make_review(
        "admin",
        operation,
        resource or f"{plural}.rbac.authorization.k8s.io",
        namespace=body["metadata"].get("namespace", ""),
        name=body["metadata"]["name"],
        kind=kind,
        groups=("system:masters",),
    )
    review["request"]["object"] = {**body, "apiVersion": "rbac.authorization.k8s.io/v1"}
    if old is not None:
        review["request"]["oldObject"] = {**old[1], "apiVersion": "rbac.authorization.k8s.io/v1"}
    return parse_review(review).request


@pytest.mark.parametrize(
    ("request_", "registration", "refused"),
    [
        pytest.param(
            rbac_review("CREATE", binding("b", "widgets", "User:bob", namespace="t1")),
            PENDING,
            True,
            id="binding-to-a-role-restricting-a-pending-resource",
        ),
        pytest.param(
            rbac_review("CREATE", binding("b", "widgets", "User:bob", namespace="t1")),
            Registration(frozenset({"configmaps"}), frozenset()),
            False,
            id="binding-once-covered",
        ),
        pytest.param(
            rbac_review("CREATE", binding("b", "widgets", "User:bob", namespace="t1")),
            Registration(frozenset({UNKNOWN}), frozenset()),
            True,
            id="binding-while-the-list-is-unreadable",
        ),
        pytest.param(
            rbac_review("CREATE", binding("b", "reader", "User:bob", namespace="t1")),
            PENDING,
            False,
            id="binding-to-a-role-granting-no-write",
        ),
        pytest.param(
            rbac_review("CREATE", binding("b", "missing", "User:bob", namespace="t1")),
            PENDING,
            False,
            id="binding-to-a-role-not-there-yet",
        ),
        pytest.param(
            rbac_review(
                "UPDATE",
                binding("existing", "widgets", namespace="t1"),
                binding("existing", "widgets", "User:carol", namespace="t1"),
            ),
            PENDING,
            False,
            id="binding-update-dropping-subjects",
        ),
        pytest.param(
            rbac_review(
                "UPDATE",
                binding("existing", "widgets", "User:carol", "User:dave", namespace="t1"),
                binding("existing", "widgets", "User:carol", namespace="t1"),
            ),
            PENDING,
            True,
            id="binding-update-adding-a-subject",
        ),
        pytest.param(
            rbac_review("CREATE", WIDGET_ROLE),
            PENDING,
            True,
            id="bound-role-created-granting-and-restricting",
        ),
        pytest.param(
            rbac_review("CREATE", WIDGET_ROLE),
            Registration(PENDING.unjudged, frozenset()),
            False,
            id="unbound-role-created",
        ),
        pytest.param(
            rbac_review(
                "UPDATE",
                WIDGET_ROLE,
                role("widgets", "t1", [rule("get", "configmaps")], {"widgets.example.com": TEAM}),
            ),
            PENDING,
            True,
            id="bound-role-starts-granting-a-restricted-resource",
        ),
        pytest.param(
            rbac_review(
                "UPDATE",
                WIDGET_ROLE,
                role("widgets", "t1", [rule("create update", "widgets", "example.com")]),
            ),
            PENDING,
            False,
            id="narrowing-annotation-added-to-granting-role",
        ),
        pytest.param(
            rbac_review(
                "UPDATE",
                role("widgets", "t1", [rule("get", "configmaps")], {"widgets.example.com": TEAM}),
                role("widgets", "t1", [rule("get", "configmaps")]),
            ),
            PENDING,
            False,
            id="annotation-entry-first-without-the-grant",
        ),
        pytest.param(
            rbac_review("CREATE", binding("b", "widgets", "User:bob", namespace="t1")),
            None,
            False,
            id="static-mode-no-fence",
        ),
        pytest.param(
            rbac_review("CREATE", binding("b", "broken", "User:bob", namespace="t1")),
            PENDING,
            True,
            id="binding-to-a-void-role-granting-a-pending-resource",
        ),
        pytest.param(
            rbac_review("CREATE", binding("b", "proxy", "User:bob", namespace="t1")),
            PENDING,
            True,
            id="binding-to-a-role-granting-a-connect-subresource",
        ),
        pytest.param(
            rbac_review("CREATE", binding("b", "wide", "User:bob", namespace="t1")),
            PENDING,
            True,
            id="binding-to-a-role-with-star-rules-and-a-glob",
        ),
    ],
)
def test_the_fence(request_: Any, registration: Registration | None, refused: bool) -> None:
    ctx = Context(
        snapshot(WIDGET_ROLE, READ_ONLY, BOUND, BROKEN, PROXY, WIDE), registration=registration
    )
    decision = check_coverage(request_, ctx)
    assert (decision is not None) is refused
    if decision is not None:
        assert decision.reason == "RegistrationPending" and decision.code == 403
        assert "is not yet judged by label-rbac everywhere" in decision.message
        assert "retry in a moment" in decision.message
        # The whole pipeline refuses it too (the fence is one of its checks).
        assert not evaluate(request_, ctx).allowed


def test_the_fence_names_the_resource_role_and_advice() -> None:
    ctx = Context(snapshot(WIDGET_ROLE, BOUND), registration=PENDING)
    binding_refusal = check_coverage(
        rbac_review("CREATE", binding("b", "widgets", "User:bob", namespace="t1")), ctx
    )
    assert binding_refusal is not None
    assert binding_refusal.message == (
        'RoleBinding "b" cannot be written yet: resource "widgets.example.com" restricted by '
        "role t1/widgets is not yet judged by label-rbac everywhere (its webhook registration, "
        "or the policy it compiles, is being updated); retry in a moment"
    )
    role_refusal = check_coverage(rbac_review("CREATE", WIDGET_ROLE), ctx)
    assert role_refusal is not None
    assert role_refusal.message.endswith(
        "retry in a moment, or add the annotation entry first and grant the resource in a "
        "later write"
    )


def test_a_role_in_audit_mode_softens_the_fence() -> None:
    """A role whose label limits are not enforced hands out nothing the gap would widen."""
    audit = role("widgets", "t1", WIDGET_ROLE[1]["rules"], {"widgets": TEAM}, mode="audit")
    ctx = Context(snapshot(audit), registration=PENDING)
    request = rbac_review("CREATE", binding("b", "widgets", "User:bob", namespace="t1"))
    decision = check_coverage(request, ctx)
    assert decision is not None and decision.mode == "audit"
    assert evaluate(request, ctx).allowed


def test_a_role_too_large_to_check_is_refused_not_scanned() -> None:
    """Wildcard patterns and ``*`` rules are compared with every resource left out, within a
    bound: past it the write is refused (fail closed) and says what to do."""
    many = {f"w{i}*": TEAM for i in range(FENCE_WORK // 1000 + 1)}
    big = role("big", "t1", [rule("*", "*", "*")], many)
    unjudged_keys = frozenset(f"r{i}.example.com" for i in range(1000))
    ctx = Context(snapshot(big), registration=Registration(unjudged_keys, frozenset()))
    decision = check_coverage(
        rbac_review("CREATE", binding("b", "big", "User:bob", namespace="t1")), ctx
    )
    assert decision is not None and not decision.allowed
    assert "too many wildcard resource patterns and rules to check against the 1000" in (
        decision.message
    )
    # Named literally, the same number of patterns is looked up, not scanned.
    literal = role("big", "t1", [rule("*", "*", "*")], {f"w{i}": TEAM for i in range(len(many))})
    ctx = Context(snapshot(literal), registration=Registration(unjudged_keys, frozenset()))
    assert (
        check_coverage(rbac_review("CREATE", binding("b", "big", "User:bob", namespace="t1")), ctx)
        is None
    )
