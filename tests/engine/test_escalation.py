"""The escalation check: a role or binding may not grant more label access than its author has."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import pytest

from app.engine.authorize import check_label_read
from app.engine.context import Context, ObjectRef, Options
from app.engine.decide import PRE_CHECKS, check_role_annotation, evaluate
from app.engine.escalation import MAX_GRANTS, Grant, check_escalation, grants_of
from app.engine.model import (
    AUTHORIZED_VERBS,
    IDENTITY_VERBS,
    RESTRICTED_VERBS,
    Access,
    Request,
    Resource,
    UserInfo,
    Verdict,
)
from app.engine.policy import DEFAULT_ANNOTATION_KEY, resource_pattern
from app.engine.rbac import RBAC_GROUP, Compiler, Rule
from tests.support import binding, role, rule, snapshot

PLURALS = {
    "Role": "roles",
    "ClusterRole": "clusterroles",
    "RoleBinding": "rolebindings",
    "ClusterRoleBinding": "clusterrolebindings",
}
MASTERS = ("system:masters",)

SNAPSHOT_OBJECTS = (
    # Cluster admins: unrestricted everywhere.
    role("cluster-admin", rules=[rule("*", "*", "*")]),
    binding("cluster-admin", "cluster-admin", "Group:system:masters"),
    # alice, dave and erin administer t1; their configmap access is limited to team a or b*.
    role(
        "tenant-admin",
        "t1",
        rules=[
            rule("create update patch", "roles rolebindings", RBAC_GROUP),
            rule("*", "configmaps"),
        ],
        permissions={"configmaps": {"team": ["a", "b*"]}},
    ),
    binding(
        "tenant-admins", "tenant-admin", "User:alice", "User:dave", "User:erin", namespace="t1"
    ),
    # dave may also edit team c configmaps, through a second role.
    role("team-c-editor", "t1", rules=[rule("*", "configmaps")], permissions={"configmaps": ["c"]}),
    binding("dave-team-c", "team-c-editor", "User:dave", namespace="t1"),
    # erin holds the RBAC verbs that bypass the escalation checks.
    role("rbac-escalator", "t1", rules=[rule("escalate bind", "roles clusterroles", RBAC_GROUP)]),
    binding("erin-escalator", "rbac-escalator", "User:erin", namespace="t1"),
    # ivan's only configmap grant carries an invalid annotation, so it grants nothing.
    role("broken", "t1", rules=[rule("*", "configmaps")], permissions="{not json"),
    role("role-writer", "t1", rules=[rule("create update", "roles", RBAC_GROUP)]),
    binding("ivan-broken", "broken", "User:ivan", namespace="t1"),
    binding("ivan-writer", "role-writer", "User:ivan", namespace="t1"),
    # Existing roles anyone may try to bind to.
    role("open", "t1", rules=[rule("create update", "configmaps")]),
    role(
        "team-a",
        "t1",
        rules=[rule("create update", "configmaps")],
        permissions={"configmaps": {"team": ["a"]}},
    ),
    role("cm-editor", rules=[rule("create update", "configmaps")]),
    role(
        "cm-team-a",
        rules=[rule("create update", "configmaps")],
        permissions={"configmaps": {"team": ["a"]}},
    ),
    # carol administers the cluster, with configmaps limited to team a everywhere.
    role(
        "tenant-cluster-admin",
        rules=[
            rule(
                "create update", "roles rolebindings clusterroles clusterrolebindings", RBAC_GROUP
            ),
            rule("*", "configmaps"),
        ],
        permissions={"configmaps": {"team": ["a"]}},
    ),
    binding("carol", "tenant-cluster-admin", "User:carol"),
    # wanda may do anything to core resources in t2, configmaps limited to team a.
    role(
        "wild",
        "t2",
        rules=[rule("*", "*"), rule("create update", "roles rolebindings", RBAC_GROUP)],
        permissions={"configmaps": {"team": ["a"]}},
    ),
    binding("wanda-wild", "wild", "User:wanda", namespace="t2"),
    # rita works in t3: any team a object, configmaps of team b as well (the specific entry wins).
    role(
        "ranked",
        "t3",
        rules=[rule("*", "configmaps secrets"), rule("create", "roles", RBAC_GROUP)],
        permissions={"*": {"team": ["a"]}, "configmaps": {"team": ["a", "b"]}},
    ),
    binding("rita-ranked", "ranked", "User:rita", namespace="t3"),
    # sam holds full authority, with secrets limited to team a.
    role("restricted-admin", rules=[rule("*", "*", "*")], permissions={"secrets": {"team": ["a"]}}),
    binding("sam", "restricted-admin", "User:sam"),
)
SNAPSHOT = snapshot(*SNAPSHOT_OBJECTS, default_label_key="team")
# New objects are compiled like the snapshot: list shorthand means the "team" label.
CTX = Context(SNAPSHOT, Options(compiler=Compiler((DEFAULT_ANNOTATION_KEY,), "team")))


def new_role(
    name: str,
    namespace: str = "",
    rules: list[dict[str, Any]] | None = None,
    permissions: Any = None,
) -> dict[str, Any]:
    return role(
        name, namespace, rules=rules or [rule("create", "configmaps")], permissions=permissions
    )[1]


def new_binding(
    name: str, role_name: str, *subjects: str, namespace: str = "", role_kind: str | None = None
) -> dict[str, Any]:
    return binding(name, role_name, *subjects, namespace=namespace, role_kind=role_kind)[1]


def write(
    user: str,
    obj: dict[str, Any],
    operation: str = "CREATE",
    old: dict[str, Any] | None = None,
    groups: tuple[str, ...] = (),
) -> Request:
    """The admission request for ``user`` writing an RBAC object."""
    meta = obj["metadata"]
    return Request(
        uid="uid-1",
        operation=operation,
        user=UserInfo(user, groups),
        resource=Resource(RBAC_GROUP, PLURALS[obj["kind"]]),
        kind=obj["kind"],
        namespace=meta.get("namespace", ""),
        name=meta["name"],
        object=obj,
        old_object=old,
    )


def escalate_hint(plural: str = "roles") -> str:
    return f'(escalation check; holding the "escalate" verb on {plural} bypasses it)'


def bind_hint(plural: str, name: str) -> str:
    return f'(escalation check; holding the "bind" verb on {plural} "{name}" bypasses it)'


ALICE_LIMIT = "their own access is limited to team in [a, b*]"


# -- Roles written by a restricted namespace admin ------------------------------------------------

ROLE_CASES = [
    pytest.param(
        write("alice", new_role("r", "t1")),
        f'user "alice" may not grant configmaps without a label restriction: {ALICE_LIMIT} '
        + escalate_hint(),
        id="unannotated-role-refused",
    ),
    pytest.param(
        write("alice", new_role("r", "t1", permissions={"configmaps": {"team": ["c"]}})),
        f'user "alice" may not grant configmaps with team="c": {ALICE_LIMIT} {escalate_hint()}',
        id="value-she-lacks-refused",
    ),
    pytest.param(
        write("alice", new_role("r", "t1", permissions={"configmaps": {"team": ["a", "c"]}})),
        f'user "alice" may not grant configmaps with team="c": {ALICE_LIMIT} {escalate_hint()}',
        id="one-value-of-several-she-lacks-refused",
    ),
    pytest.param(
        write("alice", new_role("r", "t1", permissions={"configmaps": {"team": ["*"]}})),
        f'user "alice" may not grant configmaps with team="*": {ALICE_LIMIT} {escalate_hint()}',
        id="wider-glob-refused",
    ),
    pytest.param(
        write("alice", new_role("r", "t1", permissions={"configmaps": {"env": ["prod"]}})),
        f'user "alice" may not grant configmaps without a restriction on label team: '
        f"{ALICE_LIMIT} {escalate_hint()}",
        id="dropping-her-key-refused",
    ),
    pytest.param(
        write("alice", new_role("r", "t1", permissions={"secrets": {"team": ["a"]}})),
        f'user "alice" may not grant configmaps without a label restriction: {ALICE_LIMIT} '
        + escalate_hint(),
        id="entry-for-another-resource-only-refused",
    ),
    pytest.param(
        write("alice", new_role("r", "t1", [rule("update", "configmaps", names="c1")])),
        f'user "alice" may not grant configmaps "c1" without a label restriction: {ALICE_LIMIT} '
        + escalate_hint(),
        id="resource-names-still-judged",
    ),
    pytest.param(
        write("alice", new_role("r", "t1", [rule("*", "configmaps")], {"configmaps": ["c"]})),
        f'user "alice" may not grant configmaps with team="c": {ALICE_LIMIT} {escalate_hint()}',
        id="wildcard-verb-beyond-labels-refused",
    ),
    pytest.param(
        write("alice", new_role("r", "t1", permissions={"configmaps": {"team": ["a"]}})),
        None,
        id="within-her-labels-allowed",
    ),
    pytest.param(
        write("alice", new_role("r", "t1", permissions={"configmaps": {"team": ["b-1"]}})),
        None,
        id="literal-under-her-glob-allowed",
    ),
    pytest.param(
        write("alice", new_role("r", "t1", permissions={"configmaps": {"team": ["a", "b*"]}})),
        None,
        id="her-own-globs-allowed",
    ),
    pytest.param(
        write(
            "alice", new_role("r", "t1", permissions={"configmaps": {"team": ["a"], "env": ["x"]}})
        ),
        None,
        id="extra-key-narrows-allowed",
    ),
    pytest.param(
        write("alice", new_role("r", "t1", permissions={"*": {"team": ["a"]}})),
        None,
        id="catch-all-entry-restricts-allowed",
    ),
    pytest.param(
        write("alice", new_role("r", "t1", [rule("*", "configmaps")], {"configmaps": ["a"]})),
        None,
        id="wildcard-verb-within-labels-allowed",
    ),
    pytest.param(
        write("alice", new_role("r", "t1", [rule("get list watch", "configmaps")])),
        f'user "alice" may not grant configmaps without a label restriction: {ALICE_LIMIT} '
        + escalate_hint(),
        id="read-only-grant-refused-like-a-write",
    ),
    pytest.param(
        write("alice", new_role("r", "t1", [rule("create", "secrets")])),
        None,
        id="grant-she-lacks-left-to-rbac",
    ),
    pytest.param(
        write("alice", new_role("r", "t1", [rule("create", "*")])),
        None,
        id="wildcard-resource-she-lacks-left-to-rbac",
    ),
    pytest.param(
        write("alice", new_role("r", "t2")),
        None,
        id="other-namespace-left-to-rbac",
    ),
    pytest.param(
        write("dave", new_role("r", "t1", permissions={"configmaps": {"team": ["c"]}})),
        None,
        id="covered-by-her-second-role",
    ),
    pytest.param(
        write("dave", new_role("r", "t1", permissions={"configmaps": {"team": ["d"]}})),
        # Her roles in the order of their bindings' names (dave-team-c, tenant-admins).
        'user "dave" may not grant configmaps with team="d": their own access is limited to '
        f"team in [c] or team in [a, b*] {escalate_hint()}",
        id="covered-by-none-of-her-roles",
    ),
    pytest.param(
        write("ivan", new_role("r", "t1", permissions={"configmaps": {"team": ["a"]}})),
        'user "ivan" may not grant configmaps: their own access through role t1/broken is void: '
        f"its permission annotation is invalid {escalate_hint()}",
        id="own-role-with-invalid-annotation-covers-nothing",
    ),
    # Entries are compared as the label rule applies them: the most specific entry decides.
    pytest.param(
        write("rita", new_role("r", "t3", permissions={"configmaps": {"team": ["b"]}})),
        None,
        id="her-specific-entry-outranks-her-catch-all",
    ),
    pytest.param(
        write("rita", new_role("r", "t3", [rule("create", "secrets")], {"*": {"team": ["b"]}})),
        'user "rita" may not grant secrets with team="b": their own access is limited to '
        f"team in [a] {escalate_hint()}",
        id="her-catch-all-decides-elsewhere",
    ),
    pytest.param(
        write("rita", new_role("r", "t3", permissions={"*": ["z"], "configmaps": ["a"]})),
        None,
        id="new-specific-entry-outranks-new-catch-all",
    ),
    pytest.param(write("erin", new_role("r", "t1")), None, id="escalate-verb-bypasses"),
    pytest.param(write("root", new_role("r", "t1"), groups=MASTERS), None, id="cluster-admin-role"),
]


# -- Bindings ------------------------------------------------------------------------------------

BINDING_CASES = [
    pytest.param(
        write("alice", new_binding("b", "open", "User:alice", namespace="t1")),
        'user "alice" may not grant configmaps without a label restriction through role t1/open: '
        f"{ALICE_LIMIT} {bind_hint('roles', 'open')}",
        id="binding-herself-to-unrestricted-role-refused",
    ),
    pytest.param(
        write("alice", new_binding("b", "open", "User:bob", "Group:devs", namespace="t1")),
        'user "alice" may not grant configmaps without a label restriction through role t1/open: '
        f"{ALICE_LIMIT} {bind_hint('roles', 'open')}",
        id="binding-anyone-to-unrestricted-role-refused",
    ),
    pytest.param(
        write(
            "alice",
            new_binding("b", "cm-editor", "User:alice", namespace="t1", role_kind="ClusterRole"),
        ),
        'user "alice" may not grant configmaps without a label restriction through clusterrole '
        f"cm-editor: {ALICE_LIMIT} {bind_hint('clusterroles', 'cm-editor')}",
        id="rolebinding-to-unrestricted-clusterrole-refused",
    ),
    pytest.param(
        write("alice", new_binding("b", "team-a", "User:alice", namespace="t1")),
        None,
        id="binding-to-role-within-her-labels-allowed",
    ),
    pytest.param(
        write(
            "alice",
            new_binding("b", "cm-team-a", "User:alice", namespace="t1", role_kind="ClusterRole"),
        ),
        None,
        id="rolebinding-to-clusterrole-within-her-labels-allowed",
    ),
    pytest.param(
        write("alice", new_binding("b", "missing", "User:alice", namespace="t1")),
        None,
        id="binding-to-missing-role-grants-nothing",
    ),
    pytest.param(
        write("alice", new_binding("b", "broken", "User:alice", namespace="t1")),
        None,
        id="binding-to-role-with-invalid-annotation-grants-nothing",
    ),
    pytest.param(
        write("erin", new_binding("b", "open", "User:erin", namespace="t1")),
        None,
        id="bind-verb-bypasses",
    ),
    pytest.param(
        write("root", new_binding("b", "open", "User:root", namespace="t1"), groups=MASTERS),
        None,
        id="cluster-admin-binding",
    ),
]


# -- Cluster scope ---------------------------------------------------------------------------------

CLUSTER_CASES = [
    pytest.param(
        write("carol", new_role("cr")),
        'user "carol" may not grant configmaps without a label restriction: their own access is '
        f"limited to team in [a] {escalate_hint('clusterroles')}",
        id="unannotated-clusterrole-refused",
    ),
    pytest.param(
        write("carol", new_role("cr", permissions={"configmaps": {"team": ["a"]}})),
        None,
        id="clusterrole-within-her-labels-allowed",
    ),
    pytest.param(
        write("carol", new_binding("crb", "cm-editor", "User:carol")),
        'user "carol" may not grant configmaps without a label restriction through clusterrole '
        "cm-editor: their own access is limited to team in [a] "
        + bind_hint("clusterroles", "cm-editor"),
        id="clusterrolebinding-to-unrestricted-refused",
    ),
    pytest.param(
        write("carol", new_binding("crb", "cm-team-a", "User:carol")),
        None,
        id="clusterrolebinding-within-her-labels-allowed",
    ),
    pytest.param(
        write("carol", new_role("r", "t1")),
        'user "carol" may not grant configmaps without a label restriction: their own access is '
        f"limited to team in [a] {escalate_hint()}",
        id="clusterrolebinding-limits-her-in-namespaces",
    ),
    # alice's access is namespaced: at cluster scope she holds no configmaps at all, so RBAC
    # refuses these itself (had her t1 roles been consulted, they would have been refused here).
    pytest.param(write("alice", new_role("cr")), None, id="namespace-access-not-cluster-scope"),
    pytest.param(
        write("alice", new_binding("crb", "cm-editor", "User:alice")),
        None,
        id="namespace-access-not-cluster-binding-scope",
    ),
    pytest.param(
        write("root", new_role("cr"), groups=MASTERS), None, id="cluster-admin-clusterrole"
    ),
    pytest.param(
        write("root", new_binding("crb", "cm-editor", "User:root"), groups=MASTERS),
        None,
        id="cluster-admin-clusterrolebinding",
    ),
]


# -- Wildcards in the new role ---------------------------------------------------------------------

WILDCARD_CASES = [
    pytest.param(
        write("wanda", new_role("r", "t2", [rule("create", "*")])),
        'user "wanda" may not grant * without a label restriction: their own access is limited '
        f"to team in [a] {escalate_hint()}",
        id="unannotated-star-refused",
    ),
    pytest.param(
        write("wanda", new_role("r", "t2", [rule("create", "*")], {"*": {"team": ["b"]}})),
        'user "wanda" may not grant * with team="b": their own access is limited to team in [a] '
        + escalate_hint(),
        id="star-beyond-her-labels-refused",
    ),
    pytest.param(
        write("wanda", new_role("r", "t2", [rule("create", "*")], {"secrets": {"team": ["a"]}})),
        'user "wanda" may not grant * without a label restriction: their own access is limited '
        f"to team in [a] {escalate_hint()}",
        id="star-restricting-other-resources-refused",
    ),
    pytest.param(
        write("wanda", new_role("r", "t2", [rule("create", "*/status")])),
        'user "wanda" may not grant */status without a label restriction: their own access is '
        f"limited to team in [a] {escalate_hint()}",
        id="star-subresource-refused",
    ),
    pytest.param(
        write("wanda", new_role("r", "t2", [rule("get", "*")])),
        'user "wanda" may not grant * without a label restriction: their own access is limited '
        f"to team in [a] {escalate_hint()}",
        id="get-on-star-may-connect-refused",
    ),
    pytest.param(
        write("wanda", new_role("r", "t2", [rule("*", "*")], {"*": {"team": ["a"]}})),
        None,
        id="star-with-catch-all-within-labels-allowed",
    ),
    pytest.param(
        write("wanda", new_role("r", "t2", [rule("*", "*")], {"configmaps": {"team": ["a"]}})),
        None,
        id="star-with-her-own-annotation-allowed",
    ),
    pytest.param(
        write("wanda", new_role("r", "t2", [rule("create", "secrets pods/status")])),
        None,
        id="resources-she-is-unrestricted-on-allowed",
    ),
    pytest.param(
        write("wanda", new_role("r", "t2", [rule("get list watch", "configmaps")])),
        'user "wanda" may not grant configmaps without a label restriction: their own access '
        f"is limited to team in [a] {escalate_hint()}",
        id="read-only-configmaps-refused",
    ),
    pytest.param(
        write("wanda", new_role("r", "t2", [rule("create", "configmaps", "*")])),
        None,
        id="any-group-she-lacks-left-to-rbac",
    ),
    # RBAC verbs "*" include escalate: a label-restricted holder of full authority is not
    # limited (RBAC, likewise, lets only full authority write an aggregated ClusterRole).
    pytest.param(
        write("sam", new_role("cr", rules=[rule("*", "*", "*")])),
        None,
        id="star-verbs-include-escalate",
    ),
]


# -- Updates and requests the check ignores --------------------------------------------------------

TEAM_A_ROLE = new_role("team-a", "t1", [rule("create update", "configmaps")], {"configmaps": ["a"]})
OPEN_ROLE = new_role("open", "t1", [rule("create update", "configmaps")])
OPEN_BINDING = new_binding("b", "open", "User:bob", "User:carl", namespace="t1")


def relabelled(obj: dict[str, Any]) -> dict[str, Any]:
    changed = copy.deepcopy(obj)
    changed["metadata"]["labels"] = {"owner": "alice"}
    return changed


UPDATE_CASES = [
    pytest.param(
        write(
            "alice",
            new_role(
                "team-a", "t1", [rule("create update", "configmaps")], {"configmaps": ["a", "c"]}
            ),
            "UPDATE",
            TEAM_A_ROLE,
        ),
        f'user "alice" may not grant configmaps with team="c": {ALICE_LIMIT} {escalate_hint()}',
        id="widening-update-refused",
    ),
    pytest.param(
        write(
            "alice",
            new_role(
                "team-a", "t1", [rule("create update patch", "configmaps")], {"configmaps": ["a"]}
            ),
            "UPDATE",
            TEAM_A_ROLE,
        ),
        None,
        id="update-within-her-labels-allowed",
    ),
    pytest.param(
        write(
            "alice",
            new_role("open", "t1", [rule("create update", "configmaps")], {"configmaps": ["a"]}),
            "UPDATE",
            OPEN_ROLE,
        ),
        None,
        id="narrowing-update-allowed",
    ),
    pytest.param(
        write("alice", relabelled(OPEN_ROLE), "UPDATE", OPEN_ROLE),
        None,
        id="update-leaving-grants-unchanged-allowed",
    ),
    pytest.param(
        write(
            "alice",
            new_binding("b", "open", "User:bob", "User:carl", "User:alice", namespace="t1"),
            "UPDATE",
            OPEN_BINDING,
        ),
        'user "alice" may not grant configmaps without a label restriction through role t1/open: '
        f"{ALICE_LIMIT} {bind_hint('roles', 'open')}",
        id="binding-update-adding-subject-refused",
    ),
    pytest.param(
        write(
            "alice", new_binding("b", "open", "User:bob", namespace="t1"), "UPDATE", OPEN_BINDING
        ),
        None,
        id="binding-update-dropping-subject-allowed",
    ),
    pytest.param(write("alice", new_role("r", "t1"), "DELETE"), None, id="delete-is-no-grant"),
    pytest.param(
        write("alice", new_role("r", "t1", permissions="{not json")),
        None,
        id="invalid-annotation-left-to-check-role-annotation",
    ),
]


@pytest.mark.parametrize(
    ("request_", "message"),
    ROLE_CASES + BINDING_CASES + CLUSTER_CASES + WILDCARD_CASES + UPDATE_CASES,
)
def test_check_escalation(request_: Request, message: str | None) -> None:
    decision = check_escalation(request_, CTX)
    if message is None:
        assert decision is None
    else:
        assert decision is not None
        assert (decision.allowed, decision.code, decision.reason) == (False, 403, "Escalation")
        assert decision.message == message


def _broad(verbs: str, groups: int, resources: int, extra_group: bool = False) -> dict[str, Any]:
    names = [f"g{i}.example.com" for i in range(groups)]
    return new_role(
        "broad",
        "t2",
        rules=[rule(verbs, " ".join(f"r{i}" for i in range(resources)), " ".join(names)),
               *([rule("get", "r0", "extra.example.com")] if extra_group else [])],
        permissions={"configmaps": {"team": ["a"]}},
    )  # fmt: skip


@pytest.mark.parametrize(
    ("user", "obj", "reason"),
    [
        # 100 apiGroups x 100 resources: the bound itself is judged, grant by grant.
        pytest.param("wanda", _broad("create", 100, 100), None, id="at-the-bound"),
        pytest.param(
            "wanda", _broad("create", 100, 100, extra_group=True), "TooBroad", id="one-over"
        ),
        # Verbs the label rule never restricts do not count.
        pytest.param("wanda", _broad("create use bind", 100, 100), None, id="unrestricted-verbs"),
        pytest.param("wanda", _broad("get list watch", 60, 60), "TooBroad", id="reads-count"),
        # RBAC's bypass lets the author hand out anything: nothing to break down.
        pytest.param(
            "erin",
            {**_broad("create", 200, 200), "metadata": {"name": "broad", "namespace": "t1"}},
            None,
            id="bypass",
        ),
    ],
)
def test_rules_breaking_down_to_too_many_grants_are_refused_unjudged(
    user: str, obj: dict[str, Any], reason: str | None
) -> None:
    decision = check_escalation(write(user, obj), CTX)
    if reason is None:
        assert decision is None or decision.reason == "Escalation"
        return
    assert decision is not None and decision.reason == reason
    assert decision.message.startswith(f'user "{user}" may not grant these rules: they break down')
    assert f"more than the {MAX_GRANTS} the escalation check judges" in decision.message
    assert "split them into narrower rules or roles" in decision.message


def test_a_binding_to_a_role_too_broad_to_judge_is_refused() -> None:
    broad = _broad("create", 120, 120)
    ctx = Context(
        snapshot(
            *SNAPSHOT_OBJECTS,
            ("Role", broad),
            default_label_key="team",
        ),
        CTX.options,
    )
    decision = check_escalation(
        write("wanda", new_binding("b", "broad", "User:wanda", namespace="t2")), ctx
    )
    assert decision is not None and decision.reason == "TooBroad"
    assert "through role t2/broad: they break down to 14400 single grants" in decision.message


def test_other_resources_are_not_judged() -> None:
    configmap = {"kind": "ConfigMap", "metadata": {"name": "c", "namespace": "t1"}}
    request = Request(
        uid="uid-1",
        operation="CREATE",
        user=UserInfo("alice"),
        resource=Resource("", "configmaps"),
        kind="ConfigMap",
        namespace="t1",
        name="c",
        object=configmap,
    )
    assert check_escalation(request, CTX) is None


def test_without_a_default_label_key_the_shorthand_is_an_invalid_annotation() -> None:
    # The shorthand is only valid with a configured default label key; without one the new role
    # is invalid, which check_role_annotation refuses and this check leaves alone.
    request = write("alice", new_role("r", "t1", permissions=["c"]))
    assert check_escalation(request, Context(SNAPSHOT)) is None
    decision = check_role_annotation(request, Context(SNAPSHOT))
    assert decision is not None and decision.reason == "InvalidAnnotation"


# -- End to end through evaluate -----------------------------------------------------------------


def test_escalation_runs_right_after_the_annotation_check() -> None:
    position = PRE_CHECKS.index(check_role_annotation)
    assert PRE_CHECKS[position + 1] is check_escalation


@pytest.mark.parametrize(
    ("request_", "reason"),
    [
        pytest.param(write("alice", new_role("r", "t1")), "Escalation", id="unannotated-role"),
        pytest.param(
            write("alice", new_binding("b", "open", "User:alice", namespace="t1")),
            "Escalation",
            id="binding-to-unrestricted",
        ),
        pytest.param(
            write("alice", new_role("r", "t1", permissions={"configmaps": ["a"]})),
            "Unrestricted",
            id="role-within-labels",
        ),
        pytest.param(
            write("alice", new_role("r", "t1", permissions="{not json")),
            "InvalidAnnotation",
            id="invalid-annotation-refused-first",
        ),
        pytest.param(
            write("erin", new_role("r", "t1")), "Unrestricted", id="escalate-verb-bypasses"
        ),
        pytest.param(
            write("root", new_role("r", "t1"), groups=MASTERS), "Unrestricted", id="cluster-admin"
        ),
        pytest.param(write("carol", new_role("cr")), "Escalation", id="clusterrole"),
        pytest.param(
            write("carol", new_binding("crb", "cm-team-a", "User:carol")),
            "Unrestricted",
            id="clusterrolebinding-within-labels",
        ),
    ],
)
def test_evaluate(request_: Request, reason: str) -> None:
    decision = evaluate(request_, CTX)
    assert decision.reason == reason
    assert decision.allowed == (reason == "Unrestricted")


def test_no_sequence_of_writes_gets_around_it() -> None:
    """Each step toward unrestricted configmaps is refused on its own."""
    steps = [
        # An unannotated role of her own...
        write("alice", new_role("mine", "t1", [rule("*", "configmaps")])),
        # ...or one with her key dropped, to bind to afterwards...
        write(
            "alice", new_role("mine", "t1", [rule("*", "configmaps")], {"configmaps": {"x": ["y"]}})
        ),
        # ...or binding to the pre-existing unrestricted Role or ClusterRole instead...
        write("alice", new_binding("b", "open", "User:alice", namespace="t1")),
        write(
            "alice",
            new_binding("b", "cm-editor", "User:alice", namespace="t1", role_kind="ClusterRole"),
        ),
        # ...or creating a harmless role first and widening it afterwards.
        write(
            "alice",
            new_role("mine", "t1", [rule("*", "configmaps")]),
            "UPDATE",
            new_role("mine", "t1", [rule("*", "configmaps")], {"configmaps": ["a"]}),
        ),
    ]
    assert [evaluate(step, CTX).reason for step in steps] == ["Escalation"] * len(steps)
    # The harmless role itself, and binding herself to it, remain possible.
    harmless = new_role("mine", "t1", [rule("*", "configmaps")], {"configmaps": ["a"]})
    assert evaluate(write("alice", harmless), CTX).allowed
    assert (
        check_escalation(
            write("alice", new_binding("b", "team-a", "User:alice", namespace="t1")), CTX
        )
        is None
    )


def test_binding_to_a_role_widened_later_is_judged_when_the_role_is_written() -> None:
    # A binding to a role that does not exist yet grants nothing and passes; creating the role
    # is then judged against her own access, so the order of the writes does not matter.
    assert (
        check_escalation(
            write("alice", new_binding("b", "later", "User:alice", namespace="t1")), CTX
        )
        is None
    )
    assert evaluate(write("alice", new_role("later", "t1")), CTX).reason == "Escalation"


def test_grants_are_broken_down_once_and_in_a_stable_order() -> None:
    rules = (
        Rule.compile(rule("update create", "secrets configmaps", names="b a")),
        Rule.compile(rule("create", "configmaps", names="a")),
        Rule.compile(rule("update create", "configmaps", names="a b")),
        Rule.compile(rule("get list bind use", "configmaps pods/exec")),
    )
    ab = (frozenset({"a", "b"}), ("a", "b"))
    a = (frozenset({"a"}), ("a",))
    anyname = (frozenset(), ())
    # One grant per verb, group and resource of a rule; its names stay a set.
    assert list(grants_of(rules)) == [
        (Grant("create", "", "configmaps"), ab),
        (Grant("create", "", "secrets"), ab),
        (Grant("update", "", "configmaps"), ab),
        (Grant("update", "", "secrets"), ab),
        (Grant("create", "", "configmaps"), a),
        # Reads are restricted by /authorize, so they are judged too; bind and use are RBAC's.
        (Grant("get", "", "configmaps"), anyname),
        (Grant("get", "", "pods", "exec"), anyname),
        (Grant("list", "", "configmaps"), anyname),
        (Grant("list", "", "pods", "exec"), anyname),
    ]


# -- Every verb the label rule restricts, reads and identity loans included ------------------------
# A tenant of the shared namespace t4 holds everything (verbs "*" on "*" and on RBAC objects),
# every resource limited to team a by a catch-all entry, as the multi-tenant setup allows.
TENANT = snapshot(
    role(
        "tenant",
        "t4",
        rules=[rule("*", "*"), rule("*", "*", RBAC_GROUP)],
        permissions={"*": {"team": ["a"]}},
    ),
    binding("tenant", "tenant", "User:tina", namespace="t4"),
    # Written by an admin: read-only, without and with a label restriction.
    role("reader", "t4", rules=[rule("get list watch", "configmaps secrets")]),
    role(
        "reader-a",
        "t4",
        rules=[rule("get list watch", "configmaps secrets")],
        permissions={"*": {"team": ["a"]}},
    ),
    role(
        "reader-b",
        "t4",
        rules=[rule("get list watch", "configmaps secrets")],
        permissions={"*": {"team": ["b"]}},
    ),
    default_label_key="team",
)
TENANT_CTX = Context(TENANT, Options(compiler=Compiler((DEFAULT_ANNOTATION_KEY,), "team")))
TINA_LIMIT = "their own access is limited to team in [a]"
# Where each verb is used: identity loans on the identities, everything else on configmaps.
IDENTITY_TARGETS = "serviceaccounts users groups"


def _target(verb: str) -> str:
    return IDENTITY_TARGETS if verb in IDENTITY_VERBS else "configmaps"


VERB_CASES = [pytest.param(verb, id=verb) for verb in sorted(RESTRICTED_VERBS)]


@pytest.mark.parametrize("verb", VERB_CASES)
@pytest.mark.parametrize(
    ("permissions", "excess"),
    [
        pytest.param(None, "without a label restriction", id="unannotated"),
        pytest.param({"*": {"team": ["b"]}}, 'with team="b"', id="another-bucket"),
        pytest.param(
            {"*": {"env": ["dev"]}}, "without a restriction on label team", id="other-key"
        ),
    ],
)
def test_every_restricted_verb_is_judged_as_writes_are(
    verb: str, permissions: Any, excess: str
) -> None:
    resources = _target(verb)
    request = write("tina", new_role("r", "t4", [rule(verb, resources)], permissions))
    decision = check_escalation(request, TENANT_CTX)
    assert decision is not None and decision.reason == "Escalation", verb
    first = sorted(resources.split())[0] if verb != "*" else "configmaps"
    assert decision.message == (
        f'user "tina" may not grant {first} {excess}: {TINA_LIMIT} {escalate_hint()}'
    )


@pytest.mark.parametrize("verb", VERB_CASES)
def test_every_restricted_verb_may_be_handed_out_within_her_bucket(verb: str) -> None:
    own = new_role("r", "t4", [rule(verb, _target(verb))], {"*": {"team": ["a"]}})
    assert check_escalation(write("tina", own), TENANT_CTX) is None
    narrower = new_role("r", "t4", [rule(verb, _target(verb))], {"*": {"team": ["a"], "x": ["y"]}})
    assert check_escalation(write("tina", narrower), TENANT_CTX) is None


@pytest.mark.parametrize(
    ("obj", "excess"),
    [
        pytest.param(
            new_binding("b", "reader", "User:tina", namespace="t4"),
            "without a label restriction",
            id="herself-to-unannotated-read-only-role",
        ),
        pytest.param(
            new_binding("b", "reader", "User:tom", namespace="t4"),
            "without a label restriction",
            id="teammate-to-unannotated-read-only-role",
        ),
        pytest.param(
            new_binding("b", "reader-b", "User:tina", namespace="t4"),
            'with team="b"',
            id="herself-to-another-buckets-read-only-role",
        ),
    ],
)
def test_binding_to_a_read_only_role_is_judged(obj: dict[str, Any], excess: str) -> None:
    decision = check_escalation(write("tina", obj), TENANT_CTX)
    assert decision is not None
    role_name = obj["roleRef"]["name"]
    assert decision.message == (
        f'user "tina" may not grant configmaps {excess} through role t4/{role_name}: '
        f"{TINA_LIMIT} {bind_hint('roles', role_name)}"
    )


def test_binding_a_teammate_to_her_own_buckets_reader_is_allowed() -> None:
    teammate = new_binding("b", "reader-a", "User:tom", namespace="t4")
    assert check_escalation(write("tina", teammate), TENANT_CTX) is None


def test_a_label_restricted_escalate_or_bind_bypasses_nothing() -> None:
    # Her verbs "*" on roles include escalate and bind, but through a label-restricted role: the
    # labels of a Role bound who may write it, not what it grants.
    for obj in (
        new_role("r", "t4", [rule("get", "secrets")]),
        new_binding("b", "reader", "User:tina", namespace="t4"),
    ):
        decision = check_escalation(write("tina", obj), TENANT_CTX)
        assert decision is not None and decision.reason == "Escalation"
    # The same verbs through an unrestricted role (erin's) still bypass, as in RBAC.
    assert (
        check_escalation(write("erin", new_role("r", "t1", [rule("get", "secrets")])), CTX) is None
    )


@pytest.mark.parametrize(
    ("rules", "judged"),
    [
        pytest.param([rule("get list watch", "configmaps")], False, id="reads-left-unscoped"),
        pytest.param([rule("list", "configmaps", names="c1")], False, id="reads-by-name"),
        pytest.param([rule("get", "secrets")], True, id="reads-of-another-resource"),
        pytest.param([rule("deletecollection", "configmaps")], True, id="deletecollection-deletes"),
        pytest.param(
            [rule("get", "configmaps/proxy")], True, id="get-of-a-subresource-may-connect"
        ),
        pytest.param([rule("*", "configmaps")], True, id="star-includes-writes"),
        pytest.param([rule("create", "configmaps")], True, id="writes"),
    ],
)
def test_unrestricted_reads_are_not_escalations(rules: list[dict[str, Any]], judged: bool) -> None:
    """--unrestricted-reads leaves those reads unscoped for everyone, the author included."""
    options = Options(
        compiler=TENANT_CTX.options.compiler,
        unrestricted_reads=(resource_pattern("configmaps"),),
    )
    decision = check_escalation(write("tina", new_role("r", "t4", rules)), Context(TENANT, options))
    assert (decision is not None) is judged


# -- One verb set for both front doors ------------------------------------------------------------
# Verbs the API server authorizes, the restricted ones and some it uses that no rule restricts.
KNOWN_VERBS = sorted(
    RESTRICTED_VERBS
    | {"bind", "escalate", "use", "proxy", "impersonate-on:user-info:list", "nonsense", ""}
)


# /authorize's no-opinion reasons for a verb it does not judge: a write's, any other verb's.
UNJUDGED = ("NotARead", "VerbNotRestricted")


@pytest.mark.parametrize("verb", KNOWN_VERBS)
@pytest.mark.parametrize("resource", ["configmaps", "serviceaccounts", "users", "pods/log"])
def test_what_authorize_judges_escalation_judges(verb: str, resource: str) -> None:
    """Every request /authorize would judge for a restricted role, a role granting it is judged."""
    access = Access(UserInfo("tina"), verb, Resource.parse(resource), "v1", "t4", "x-b")

    def metadata(ref: ObjectRef) -> Mapping[str, Any]:
        return {"metadata": {"name": ref.name, "labels": {"team": "b"}}}

    ctx = Context(TENANT, TENANT_CTX.options, metadata=metadata)
    judged_by_authorize = check_label_read(access, ctx).reason not in UNJUDGED
    assert judged_by_authorize == (verb in AUTHORIZED_VERBS)
    if judged_by_authorize:
        assert verb in RESTRICTED_VERBS
        handed_out = write("tina", new_role("r", "t4", [rule(verb, resource)]))
        assert check_escalation(handed_out, TENANT_CTX) is not None


# -- Identity loans: an annotated role lends identities only within all of its buckets ------------
# A tenant of t5 whose annotation names some resources only, as the shipped example tenants do; her
# roles grant every verb ("*" includes impersonate) and, without escalate or bind, RBAC writes.
# Another role names serviceaccounts itself: its own entry keeps deciding.
BUCKETS = {"configmaps": {"team": ["a"]}, "secrets": {"team": ["a"]}}
LENDER = snapshot(
    role(
        "lender",
        "t5",
        rules=[
            rule("*", "*"),
            rule("*", "*", "authentication.k8s.io certificates.k8s.io"),
            rule("get create update patch delete", "roles rolebindings", RBAC_GROUP),
        ],
        permissions=BUCKETS,
    ),
    binding("lender", "lender", "User:lena", namespace="t5"),
    role(
        "accounts",
        "t5",
        rules=[rule("impersonate", "serviceaccounts")],
        permissions={**BUCKETS, "serviceaccounts": {"team": ["a", "b"]}},
    ),
    binding("accounts", "accounts", "User:sam", namespace="t5"),
    default_label_key="team",
)
LENDER_CTX = Context(LENDER, Options(compiler=Compiler((DEFAULT_ANNOTATION_KEY,), "team")))
LENA_LIMIT = "their own access is limited to team in [a]"
ACCOUNT_LABELS = {"sa-a": {"team": "a"}, "sa-b": {"team": "b"}, "sa-none": {}}


def _account_metadata(ref: ObjectRef) -> Mapping[str, Any]:
    return {"metadata": {"name": ref.name, "labels": ACCOUNT_LABELS[ref.name]}}


@pytest.mark.parametrize(
    ("user", "verb", "resource", "name", "reason"),
    [
        pytest.param("lena", "impersonate", "serviceaccounts", "sa-a", None, id="own-bucket"),
        pytest.param(
            "lena", "impersonate", "serviceaccounts", "sa-b", "LabelNotPermitted", id="other"
        ),
        pytest.param(
            "lena", "impersonate", "serviceaccounts", "sa-none", "LabelNotPermitted", id="none"
        ),
        pytest.param(
            "lena", "impersonate:serviceaccount", "serviceaccounts.authentication.k8s.io",
            "sa-b", "LabelNotPermitted", id="constrained",
        ),
        pytest.param("lena", "impersonate", "users", "admin", "IdentityNotLabeled", id="user"),
        pytest.param("lena", "impersonate", "groups", "g", "IdentityNotLabeled", id="group"),
        pytest.param(
            "lena", "sign", "signers.certificates.k8s.io", "kubernetes.io/kube-apiserver-client",
            "IdentityNotLabeled", id="signer",
        ),
        pytest.param("sam", "impersonate", "serviceaccounts", "sa-b", None, id="own-entry-decides"),
        pytest.param(
            "sam", "impersonate", "serviceaccounts", "sa-none", "LabelNotPermitted",
            id="own-entry-unlabeled",
        ),
    ],
)  # fmt: skip
def test_an_annotated_role_lends_only_within_all_its_buckets(
    user: str, verb: str, resource: str, name: str, reason: str | None
) -> None:
    access = Access(UserInfo(user), verb, Resource.parse(resource), "v1", "t5", name)
    ctx = Context(LENDER, LENDER_CTX.options, metadata=_account_metadata)
    decision = check_label_read(access, ctx)
    assert decision is not None
    if reason is None:
        assert decision.verdict is Verdict.NO_OPINION, decision
    else:
        assert (decision.verdict, decision.reason) == (Verdict.DENY, reason), decision
        assert "ServiceAccounts labeled team in [a" in decision.message


@pytest.mark.parametrize(
    ("rules", "permissions", "message"),
    [
        pytest.param(
            [rule("impersonate", "serviceaccounts")], None,
            "serviceaccounts without a label restriction", id="unannotated",
        ),
        pytest.param(
            [rule("impersonate", "serviceaccounts")], {"serviceaccounts": {"team": ["b"]}},
            'serviceaccounts with team="b"', id="another-buckets-entry",
        ),
        pytest.param(
            [rule("*", "serviceaccounts")], None,
            "serviceaccounts without a label restriction", id="star-verbs",
        ),
        pytest.param(
            [rule("impersonate", "users groups")], None,
            "groups without a label restriction", id="labelless-identities",
        ),
        pytest.param(
            [rule("impersonate", "*")], None, "* without a label restriction",
            id="wildcard-resources",
        ),
        pytest.param(
            [rule("create", "serviceaccounts/token")], None,
            "serviceaccounts/token without a label restriction", id="token-requests",
        ),
        pytest.param([rule("impersonate", "serviceaccounts")], BUCKETS, None, id="same-buckets"),
        pytest.param(
            [rule("impersonate", "serviceaccounts")], {"configmaps": {"team": ["a"]}}, None,
            id="one-of-her-buckets",
        ),
        pytest.param(
            [rule("create", "serviceaccounts/token")], {"serviceaccounts": {"team": ["a"]}}, None,
            id="her-accounts-entry",
        ),
        pytest.param([rule("*", "*")], BUCKETS, None, id="all-within-the-same-buckets"),
        pytest.param([rule("get list", "serviceaccounts")], None, None, id="reads-lend-nothing"),
    ],
)  # fmt: skip
def test_handing_out_an_identity_loan_is_covered_by_her_loan_limits(
    rules: list[dict[str, Any]], permissions: Any, message: str | None
) -> None:
    decision = check_escalation(write("lena", new_role("r", "t5", rules, permissions)), LENDER_CTX)
    if message is None:
        assert decision is None
    else:
        assert decision is not None
        assert decision.message == (
            f'user "lena" may not grant {message}: {LENA_LIMIT} {escalate_hint()}'
        )


# -- resourceNames are a set: the work is linear in a Role's size ---------------------------------
# nina holds every core resource limited to team a, and two names of each without limits.
TEAM_A_ENTRY = {"*": {"team": ["a"]}}
NAMED = snapshot(
    role("limited", "t6", rules=[rule("*", "*")], permissions=TEAM_A_ENTRY),
    role("named", "t6", rules=[rule("*", "*", names="open-1 open-2")]),
    binding("limited", "limited", "User:nina", namespace="t6"),
    binding("named", "named", "User:nina", namespace="t6"),
)
NAMED_CTX = Context(NAMED, TENANT_CTX.options)


@pytest.mark.parametrize(
    ("names", "permissions", "refused"),
    [
        pytest.param("open-1 open-2", None, None, id="only-names-she-holds-unlimited"),
        pytest.param("open-1 x", None, "x", id="another-name-held-with-limits"),
        pytest.param("z y open-2 w", None, "w", id="first-such-name-in-order"),
        pytest.param("open-1 x y", TEAM_A_ENTRY, None, id="within-her-limits"),
    ],
)
def test_names_are_judged_by_the_roles_holding_each(
    names: str, permissions: Any, refused: str | None
) -> None:
    handed_out = new_role("r", "t6", [rule("get update", "configmaps", names=names)], permissions)
    decision = check_escalation(write("nina", handed_out), NAMED_CTX)
    if refused is None:
        assert decision is None
    else:
        assert decision is not None
        assert decision.message.startswith(
            f'user "nina" may not grant configmaps "{refused}" without a label restriction'
        )


def test_the_work_is_linear_in_the_roles_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """Author-side lookups once per verb and resource, judgements once per name that can differ:
    doubling the names costs nothing more, doubling the resources twice as much."""
    import app.engine.escalation as escalation

    calls = {"_holders": 0, "_judge": 0}
    for name in calls:
        real = getattr(escalation, name)

        def spy(*args: Any, _real: Any = real, _name: str = name) -> Any:
            calls[_name] += 1
            return _real(*args)

        monkeypatch.setattr(escalation, name, spy)

    def work(resources: int, names: int) -> tuple[int, int]:
        calls.update(dict.fromkeys(calls, 0))
        rules = [
            rule(
                "get list update patch",
                " ".join(f"r{i}" for i in range(resources)),
                names=" ".join(["open-1", *(f"n{i}" for i in range(names - 1))]),
            )
        ]
        handed_out = new_role("r", "t6", rules, TEAM_A_ENTRY)
        assert check_escalation(write("nina", handed_out), NAMED_CTX) is None
        return calls["_holders"], calls["_judge"]

    holders, judged = work(100, 100)
    assert holders == 4 * 100  # verbs x resources, whatever the names
    assert judged == 4 * 100 * 2  # open-1 (named by her rules) and one for all the other names
    assert work(100, 200) == (holders, judged)
    assert work(200, 100) == (2 * holders, 2 * judged)
