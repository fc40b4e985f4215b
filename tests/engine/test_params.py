"""The compiled parameters: what each namespace's ``LabelRbacParams`` holds, the size guard, the
glob patterns, and which namespaces a change makes the compiler render again."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import replace
from typing import Any

import celpy
import pytest
import re2  # type: ignore[import-untyped]

from app.engine.context import Options
from app.engine.glob import Glob
from app.engine.incremental import LiveSnapshot
from app.engine.kinds import BY_KIND
from app.engine.model import AUDIT, WARN, Resource
from app.engine.params import (
    CLUSTER,
    DEFAULT,
    SOFTENED,
    WEBHOOK_RESOURCES,
    Namespaces,
    Target,
    cel_literal,
    glob_pattern,
    in_scope,
    namespaces_of,
    render,
    render_cluster,
    touched,
    unjudged_literal,
    value_tests,
)
from app.engine.policy import DEFAULT_ANNOTATION_KEY
from app.engine.rbac import Compiler, Snapshot
from tests.support import binding, role, rule, snapshot

CONFIGMAPS = Resource("", "configmaps")
SECRETS = Resource("", "secrets")
WIDGETS = Resource("example.com", "widgets")
TARGET = Target.of([CONFIGMAPS, SECRETS, WIDGETS], Options())

TEAM_A = role("team-a", "t1", [rule("*", "configmaps")], {"configmaps": {"team": ["a"]}})
SHARED = role(
    "shared",
    "t1",
    [rule("create", "configmaps")],
    {"configmaps": {"team": ["shared-*"], "env": ["dev", "stag?"]}},
)
EDITOR = role("editor", "t1", [rule("*", "configmaps secrets")])
OBJECTS = (
    TEAM_A,
    SHARED,
    EDITOR,
    binding("alice-a", "team-a", "User:alice", namespace="t1"),
    binding("tenants", "shared", "Group:tenants", namespace="t1"),
    binding("builder", "team-a", "ServiceAccount:ci:builder", namespace="t1"),
    binding("carol-editor", "editor", "User:carol", namespace="t1"),
    binding("carol-a", "team-a", "User:carol", namespace="t1"),
)


def spec_of(*objects: tuple[str, dict[str, Any]], namespace: str = "t1", **kw: Any) -> Any:
    return read_as_the_policy(snapshot(*objects), namespace, Target.of(TARGET.resources, **kw))


def read_as_the_policy(state: Snapshot, namespace: str, target: Target) -> dict[str, Any]:
    """The namespace's parameters with the cluster part (``render_cluster``, stored in the
    policy) beside them: ``clusterUsers`` and ``clusterGroups``, their roles and grants (ids
    apart: ``CLUSTER_PREFIX``)."""
    spec = dict(render(state, namespace, target).spec)
    if "delegated" in spec:
        return spec
    cluster = render_cluster(state, target).spec
    return {
        **spec,
        "clusterUsers": cluster["users"],
        "clusterGroups": cluster["groups"],
        "roles": {**spec["roles"], **cluster["roles"]},
        "grants": {**spec["grants"], **cluster["grants"]},
    }


def granted(
    spec: Any, field: str, subject: str, key: str = "configmaps", op: str = "CREATE"
) -> list[dict[str, Any]]:
    """The grants ``spec`` gives ``subject`` (under ``field``) for ``op`` of ``key``, looked up
    as the policy looks them up."""
    if key not in spec["indexed"]:
        return []
    found = []
    for role_id in spec[field].get(subject, []):
        entry = spec["roles"][role_id]
        grant_id = entry_grant(entry.get(key, entry.get(DEFAULT, {})), op)
        if grant_id:
            found.append(spec["grants"][grant_id])
    return found


def entry_grant(entry: str | dict[str, str], op: str) -> str:
    """The grant id a role's entry for a resource points ``op`` to, as the policy reads it
    (``admission_policy._grant_id``): the entry itself where it is a string (every operation,
    ``LAYOUT`` 2), else its operation's ('' for none)."""
    return entry if isinstance(entry, str) else entry.get(op, "")


def grant_roles(spec: Any, field: str, subject: str, op: str = "CREATE") -> list[str]:
    return [g["role"] for g in granted(spec, field, subject, op=op)]


def test_subjects_are_indexed_by_name_in_binding_order() -> None:
    spec = spec_of(*OBJECTS)
    assert grant_roles(spec, "users", "alice") == ["role t1/team-a"]
    assert grant_roles(spec, "groups", "tenants") == ["role t1/shared"]
    # A ServiceAccount subject is its user name; an omitted namespace would be the binding's.
    assert grant_roles(spec, "users", "system:serviceaccount:ci:builder") == ["role t1/team-a"]
    # carol-a sorts before carol-editor: the webhook's order, so messages agree.
    assert grant_roles(spec, "users", "carol") == ["role t1/team-a", "role t1/editor"]
    # shared grants create only.
    assert grant_roles(spec, "groups", "tenants", op="UPDATE") == []


def test_each_subject_role_and_grant_is_written_once() -> None:
    many = [binding(f"u{i}", "team-a", f"User:u{i}", namespace="t1") for i in range(50)]
    spec = spec_of(*OBJECTS, *many)
    # Fifty more subjects of one role: fifty short lists, no more roles or grants.
    assert spec["roles"] == spec_of(*OBJECTS)["roles"]
    assert spec["grants"] == spec_of(*OBJECTS)["grants"]
    assert {tuple(spec["users"][f"u{i}"]) for i in range(50)} == {tuple(spec["users"]["alice"])}
    # team-a grants every operation alike: one grant for all four, its id in place of a map.
    (team_a,) = spec["users"]["alice"]
    assert isinstance(spec["roles"][team_a]["configmaps"], str)


PARTIAL = role(  # every write verb of configmaps but deletecollection: not one grant for all four
    "partial", "t1", [rule("create update patch delete", "configmaps")],
    {"configmaps": {"team": ["p"]}},
)  # fmt: skip


def _requirements(spec: Any) -> list[dict[str, Any]]:
    return [r for g in spec["grants"].values() for r in g.get("labels", ())]


@pytest.mark.parametrize(
    ("earlier", "entry_types", "listed"),
    [
        pytest.param(False, {str, dict}, False, id="layout-2"),
        pytest.param(True, {dict}, True, id="earlier-layout"),
    ],
)
def test_both_layouts_give_each_subject_the_same_grants(
    earlier: bool, entry_types: set[type], listed: bool
) -> None:
    """Layout 2 (``LAYOUT``) holds a grant id where a role's every operation on a resource
    points to one grant, and leaves a requirement's empty lists out; for an earlier release's
    policy (``Target.earlier``) every entry is a map of operations, every requirement has its
    four lists, and the unjudged resources are listed. Read as the policy reads them, both
    give every subject the same grants for every operation."""
    objects = (*OBJECTS, PARTIAL, binding("p", "partial", "User:dave", namespace="t1"))
    layout2 = spec_of(*objects)
    state = snapshot(*objects)
    spec = read_as_the_policy(state, "t1", replace(TARGET, earlier=earlier))
    entries = [e for r in spec["roles"].values() for e in r.values()]
    assert {type(e) for e in entries} == entry_types
    for entry in entries:  # a string exactly where every operation points to one grant
        if isinstance(entry, dict):
            assert len(entry) < 4 or len(set(entry.values())) > 1 or earlier
    assert ("unjudged" in spec) == listed
    tests = {"exact", "prefixes", "suffixes", "patterns"}
    for requirement in _requirements(spec):
        present = set(requirement) - {"key"}
        assert present == tests if earlier else all(requirement[t] for t in present)
    for field, subject in [("users", u) for u in spec["users"]] + [
        ("groups", g) for g in spec["groups"]
    ]:
        for op in ("CREATE", "UPDATE", "DELETE", "DELETECOLLECTION"):
            want = [_whole(g) for g in granted(layout2, field, subject, op=op)]
            assert [_whole(g) for g in granted(spec, field, subject, op=op)] == want
    assert granted(spec, "users", "dave", op="DELETECOLLECTION") == []


def _whole(grant: dict[str, Any]) -> dict[str, Any]:
    """A grant with every requirement's four lists, as layout 1 holds it."""
    empty = {"exact": [], "prefixes": [], "suffixes": [], "patterns": []}
    return {**grant, "labels": [{**empty, **r} for r in grant.get("labels", ())]}


def test_grants_carry_what_the_webhook_judges_and_says() -> None:
    spec = spec_of(*OBJECTS)
    by_role = {g["role"]: g for g in spec["grants"].values()}
    assert by_role["role t1/editor"] == {"role": "role t1/editor", "unrestricted": True}
    assert by_role["role t1/shared"] == {
        "role": "role t1/shared",
        "mode": "enforce",
        "allows": "role t1/shared allows team in [shared-*] and env in [dev, stag?]",
        "labels": [
            {"key": "team", "prefixes": ["shared-"]},
            {"key": "env", "exact": ["dev"], "patterns": ["^(?:stag.)\\z"]},
        ],
    }


def test_only_resources_an_annotation_restricts_are_indexed() -> None:
    # secrets are granted by the editor alone (unrestricted): nothing for the policy to judge.
    spec = spec_of(*OBJECTS)
    assert spec["indexed"] == ["configmaps"]
    # The editor's entry names configmaps only, as nothing else is indexed.
    (editor,) = [r for r in spec["users"]["carol"] if r not in spec["users"]["alice"]]
    assert set(spec["roles"][editor]) == {"configmaps"}
    alone = spec_of(EDITOR, binding("e", "editor", "User:carol", namespace="t1"))
    assert (alone["indexed"], alone["users"], alone["roles"]) == ([], {}, {})


def test_every_namespace_indexes_what_any_annotation_restricts_bound_there_or_not() -> None:
    # t2 binds no restricted role, yet a role anywhere restricts configmaps: a subject bound there
    # to it a moment from now must meet an indexed resource, so it is "not listed yet".
    objects = (*OBJECTS, binding("e", "editor", "User:erin", namespace="t2"))
    t2 = spec_of(*objects, namespace="t2")
    assert t2["indexed"] == ["configmaps"]
    assert t2["users"] == {}  # editor is a Role of t1: nothing bound in t2 grants anything there
    unbound = role("unbound", "t3", [rule("*", "secrets")], {"secrets": {"team": ["a"]}})
    assert spec_of(*OBJECTS, unbound, namespace="t9")["indexed"] == ["configmaps", "secrets"]


@pytest.mark.parametrize(
    ("lingering", "indexed", "unjudged"),
    [
        pytest.param((), ["configmaps"], ["secrets", "widgets.example.com"], id="restricted"),
        pytest.param(
            ("secrets",), ["configmaps", "secrets"], ["widgets.example.com"], id="lingering-kept"
        ),
        pytest.param(
            ("pods", "roles.rbac.authorization.k8s.io"),
            ["configmaps"],
            ["secrets", "widgets.example.com"],
            id="not-in-scope",
        ),
    ],
)
def test_the_served_resources_are_indexed_or_listed_unjudged(
    lingering: tuple[str, ...], indexed: list[str], unjudged: list[str]
) -> None:
    """What annotations restrict (or did a moment ago) is indexed in every namespace's
    parameters; every other resource served is listed unjudged once, in the cluster part the
    policy holds, so the policy knows which writes need no judging and refuses, in a compiled
    namespace, a resource in neither list. No namespace's parameters copy that list."""
    objects = snapshot(*OBJECTS)
    target = replace(TARGET, indexed=TARGET.index(objects.restrictions(), lingering))
    for namespace in ("t1", "t2", "t9"):
        spec = render(objects, namespace, target).spec
        assert spec["indexed"] == indexed and "unjudged" not in spec
    assert list(render_cluster(objects, target).unjudged) == unjudged


def test_cluster_role_bindings_are_stored_once_apart_from_every_namespace() -> None:
    objects = (
        *OBJECTS,
        role("view-a", "", [rule("*", "configmaps")], {"configmaps": {"team": ["a"]}}),
        binding("everyone-a", "view-a", "Group:tenants"),
    )
    for namespace in ("t1", "t2"):
        spec = spec_of(*objects, namespace=namespace)
        assert grant_roles(spec, "clusterGroups", "tenants") == ["clusterrole view-a"]
    assert spec_of(*objects, namespace="t2")["groups"] == {}
    # The namespaces' own parameters hold none of it: a namespace binding nothing holds no role.
    state = snapshot(*objects)
    for namespace in ("t1", "t2"):
        own = render(state, namespace, TARGET).spec
        assert not {"clusterUsers", "clusterGroups"} & set(own)
        assert all(g["role"] != "clusterrole view-a" for g in own["grants"].values())
    assert render(state, "t2", TARGET).spec["roles"] == {}
    (chunk,) = render_cluster(state, TARGET).chunks
    assert "clusterrole view-a" in chunk


def test_a_role_granting_every_indexed_resource_alike_is_one_default_entry() -> None:
    widgets = role(
        "widgets",
        "t1",
        [rule("*", "widgets", "example.com")],
        {"widgets.example.com": {"team": ["a"]}},
    )
    everything = role("everything", "", [rule("*", "*", "*")])
    spec = spec_of(
        *OBJECTS,
        widgets,
        binding("w", "widgets", "User:alice", namespace="t1"),
        everything,
        binding("root", "everything", "User:root"),
    )
    assert spec["indexed"] == ["configmaps", "widgets.example.com"]
    (root,) = spec["clusterUsers"]["root"]
    assert set(spec["roles"][root]) == {DEFAULT}
    for key in spec["indexed"]:
        (grant,) = granted(spec, "clusterUsers", "root", key=key)
        assert grant == {"role": "clusterrole everything", "unrestricted": True}
    # team-a grants configmaps alone: widgets are left out of its entry, not written empty.
    (team_a,) = spec["users"]["alice"][:1]
    assert (
        granted(spec, "users", "alice", key="widgets.example.com")[0]["role"] == "role t1/widgets"
    )
    assert DEFAULT not in spec["roles"][team_a]


def test_under_a_default_a_resource_the_role_does_not_grant_is_written_empty() -> None:
    restricts = role(
        "restricts",
        "t1",
        [rule("*", "secrets"), rule("*", "widgets", "example.com")],
        {"*": {"team": ["a"]}},
    )
    two = role("two", "", [rule("*", "configmaps secrets")])
    spec = spec_of(
        *OBJECTS,
        restricts,
        binding("r", "restricts", "User:alice", namespace="t1"),
        two,
        binding("two", "two", "User:two"),
    )
    assert spec["indexed"] == ["configmaps", "secrets", "widgets.example.com"]
    (two_id,) = spec["clusterUsers"]["two"]
    assert spec["roles"][two_id]["widgets.example.com"] == {}
    assert set(spec["roles"][two_id]) == {DEFAULT, "widgets.example.com"}
    for key in ("configmaps", "secrets"):
        assert [g["role"] for g in granted(spec, "clusterUsers", "two", key)] == ["clusterrole two"]
    assert granted(spec, "clusterUsers", "two", "widgets.example.com") == []


def test_a_role_with_an_invalid_annotation_is_void_with_the_webhooks_words() -> None:
    broken = role("broken", "t1", [rule("create", "configmaps")], "{not json")
    spec = spec_of(broken, binding("b", "broken", "User:dave", namespace="t1"))
    (grant,) = spec["grants"].values()
    assert grant["role"] == "role t1/broken"
    assert grant["invalid"].startswith("role t1/broken grants nothing here: invalid ")


@pytest.mark.parametrize(
    ("verbs", "names", "expected"),
    [
        pytest.param("create", "c1 c2", {"CREATE": ["c1", "c2"]}, id="create-named"),
        pytest.param("update patch", "c1", {"UPDATE": ["c1"]}, id="update-named"),
        pytest.param("delete deletecollection", "c1", {"DELETE": ["c1"]}, id="no-named-collection"),
        pytest.param(
            "*",
            "",
            {o: None for o in ("CREATE", "UPDATE", "DELETE", "DELETECOLLECTION")},
            id="any-name",
        ),
    ],
)
def test_resource_names_are_carried_per_operation(
    verbs: str, names: str, expected: dict[str, list[str] | None]
) -> None:
    named = role(
        "named", "t1", [rule(verbs, "configmaps", names=names)], {"configmaps": {"team": ["a"]}}
    )
    spec = spec_of(named, binding("n", "named", "User:erin", namespace="t1"))
    found = {
        op: grants[0].get("names")
        for op in ("CREATE", "UPDATE", "DELETE", "DELETECOLLECTION")
        if (grants := granted(spec, "users", "erin", op=op))
    }
    assert found == expected


def test_modes_are_carried_and_flag_the_softened_namespaces() -> None:
    warned = role(
        "warned", "t1", [rule("*", "configmaps")], {"configmaps": {"team": ["a"]}}, mode=WARN
    )
    spec = spec_of(warned, binding("w", "warned", "User:a", namespace="t1"))
    assert [g["mode"] for g in spec["grants"].values()] == [WARN]
    assert spec["softened"] is True
    assert "softened" not in spec_of(*OBJECTS)
    globally = render(snapshot(*OBJECTS), "t1", Target.of(TARGET.resources, Options(mode=AUDIT)))
    assert globally.spec["mode"] == AUDIT and globally.spec["softened"] is True


@pytest.mark.parametrize(
    ("softening", "options"),
    [
        pytest.param(True, Options(), id="a-warn-role"),
        pytest.param(False, Options(mode=AUDIT), id="the-global-mode"),
        pytest.param(False, Options(), id="nothing-softened"),
    ],
)
def test_the_compiler_leaves_a_namespace_where_a_denial_is_softened_to_the_webhook(
    softening: bool, options: Options
) -> None:
    warned = role(
        "warned", "t1", [rule("*", "configmaps")], {"configmaps": {"team": ["a"]}}, mode=WARN
    )
    objects = (*OBJECTS, warned, binding("w", "warned", "User:a", namespace="t1"))
    found = snapshot(*(objects if softening else OBJECTS))
    target = Target.of(TARGET.resources, options, delegate_softened=True)
    rendered = render(found, "t1", target)
    if not softening and options.mode == "enforce":
        assert rendered.delegated is None and "roles" in rendered.spec
        return
    assert rendered.reason == SOFTENED
    assert rendered.delegated is not None and "webhook keeps judging" in rendered.delegated
    assert "roles" not in rendered.spec and "softened" in rendered.spec
    # Without it (--compile-softened), the same namespace is compiled, flagged for the modes.
    compiled = render(found, "t1", Target.of(TARGET.resources, options))
    assert compiled.delegated is None and compiled.spec["softened"] is True


def test_resources_the_webhook_keeps_are_never_compiled() -> None:
    every = [Resource(g, r) for g, r in WEBHOOK_RESOURCES] + [Resource("", "pods", "exec")]
    assert not any(map(in_scope, every))
    assert Target.of([*every, CONFIGMAPS], Options()).resources == (CONFIGMAPS,)


def test_a_namespace_over_the_size_limit_is_delegated_never_truncated() -> None:
    whole = render(snapshot(*OBJECTS), "t1", TARGET)
    small = render(snapshot(*OBJECTS), "t1", Target(TARGET.resources, Options(), whole.size - 1))
    assert small.delegated is not None and f"{whole.size} bytes" in small.delegated
    assert small.spec == {"mode": "enforce", "allowUnlabeled": False, "delegated": small.delegated}
    assert whole.delegated is None
    assert whole.size == len(json.dumps(whole.spec, separators=(",", ":")).encode())


def many_names(names: int, rules: int, resources: str = "configmaps secrets") -> Any:
    """A restricted Role granting update and delete of ``names`` objects, spread over ``rules``
    rules, and its binding, in t1."""
    per = names // rules
    spread = [
        rule("get update delete", resources, names=" ".join(f"n{r}-{i}" for i in range(per)))
        for r in range(rules)
    ]
    named = role("named", "t1", spread, {"configmaps": {"team": ["a"]}})
    return snapshot(named, binding("n", "named", "User:erin", namespace="t1"))


WIDE = Target.of([CONFIGMAPS, SECRETS, *(Resource("example.com", f"w{i}") for i in range(20))])


@pytest.mark.parametrize(
    "rules",
    [
        pytest.param(lambda n: 1, id="one rule listing every name"),
        pytest.param(lambda n: n // 100, id="a rule per hundred names"),
        pytest.param(lambda n: n // 10, id="a rule per ten names"),
    ],
)
def test_rendering_work_grows_linearly_with_the_resource_names_roles_list(rules: Any) -> None:
    """Counted, not timed: the units of ``Work`` (each rule and name looked at) per name stay
    the same from 1,000 to 16,000 names, however the names are spread over rules (testing every
    name against every rule made that quadratic)."""
    per_name = []
    for names in (1_000, 4_000, 16_000):
        rendered = render(many_names(names, rules(names)), "t1", WIDE)
        assert rendered.delegated is None
        assert len(granted(rendered.spec, "users", "erin", op="UPDATE")[0]["names"]) == names
        per_name.append(rendered.work / names)
    assert max(per_name) < 1.1 * min(per_name), per_name
    assert max(per_name) < 10, per_name  # a few units per name and operation, whatever the rules


def test_a_namespace_over_the_work_budget_is_delegated_and_stops_early() -> None:
    """Past ``max_work`` the render stops and the namespace is left to the webhook, saying why;
    the other namespaces of the same snapshot are rendered whole."""
    heavy = many_names(20_000, 200)
    whole = render(heavy, "t1", WIDE)
    budget = whole.work // 4
    bounded = Target.of(WIDE.resources, max_work=budget)
    over = render(heavy, "t1", bounded)
    assert over.reason == "TooComplex" and over.delegated is not None
    assert f"more than {budget} units of work" in over.delegated
    assert over.spec == {"mode": "enforce", "allowUnlabeled": False, "delegated": over.delegated}
    assert budget < over.work <= budget + 20_000 + 200  # stopped within one step: a name list
    assert render(heavy, "t2", bounded).delegated is None
    assert whole.reason == "" and over.work < whole.work


@pytest.mark.parametrize(
    ("annotation", "delegated"),
    [
        pytest.param({"configmaps/proxy": {"team": ["a"]}}, True, id="only-a-subresource"),
        pytest.param(
            {"configmaps": {"team": ["a", "b"]}, "configmaps/proxy": {"team": ["a"]}},
            True,
            id="narrower-subresource",
        ),
        pytest.param(
            {"*": {"team": ["a"]}, "*/status": {"team": ["a"]}}, False, id="same-requirements"
        ),
        pytest.param({"pods/exec": {"team": ["a"]}}, False, id="a-resource-the-webhook-keeps"),
    ],
)
def test_a_namespace_whose_roles_restrict_subresources_more_is_delegated(
    annotation: dict[str, Any], delegated: bool
) -> None:
    """A change of an object's labels is judged by its subresource entries too, which only the
    webhook does: the policy must not judge such a namespace's writes alone."""
    narrow = role("narrow", "t1", [rule("*", "configmaps configmaps/proxy pods/exec")], annotation)
    bound = binding("dan", "narrow", "User:dan", namespace="t1")
    rendered = render(snapshot(*OBJECTS, narrow, bound), "t1", TARGET)
    assert (rendered.delegated is not None) is delegated, rendered.delegated
    if delegated:
        assert rendered.delegated == (
            "in namespace t1, role t1/narrow restricts subresources of configmaps more than its "
            "writes, which only the webhook judges on a change of labels: the webhook keeps "
            "judging its writes"
        )
        assert rendered.reason == "SubresourceEntries"
    # Other namespaces are not concerned.
    assert render(snapshot(*OBJECTS, narrow, bound), "t2", TARGET).delegated is None


GLOBS = ["a", "shared-*", "stag?", "*-dev-*", "v?.?", "*", "a.b", "*?", "x*y*z"]
VALUES = [
    "a",
    "shared-",
    "shared-x",
    "stag1",
    "stag",
    "q-dev-w",
    "v1.2",
    "v1x2",
    "",
    "a.b",
    "axb",
    "xyz",
    "x-y-z",
    "zyx",
]


@pytest.mark.parametrize("text", GLOBS)
def test_glob_patterns_match_exactly_what_the_glob_matches(text: str) -> None:
    glob, pattern = Glob.compile(text), glob_pattern(Glob.compile(text))
    # Only literals (escaped unless a word character), "." and ".*", anchored: linear in RE2.
    assert re.fullmatch(r"\^(\\[^A-Za-z0-9_]|[A-Za-z0-9_]|\.\*|\.)*\\z", pattern)
    # Matched by RE2, the engine behind CEL's matches(), as the API server matches it.
    for value in VALUES:
        assert bool(re2.search(pattern, value)) == glob.matches(value), (text, value)


@pytest.mark.parametrize(
    ("globs", "tests"),
    [
        pytest.param(["a", "b"], {"exact": ["a", "b"]}, id="literals"),
        pytest.param(["team-*", "*"], {"prefixes": ["team-", ""]}, id="prefixes"),
        pytest.param(["*-dev", "**x"], {"suffixes": ["-dev", "x"]}, id="suffixes"),
        pytest.param(
            ["a*b", "v?.?", "*x*"], {"patterns": ["^(?:a.*b|v.\\..|.*x.*)\\z"]}, id="one-pattern"
        ),
        pytest.param(["?*", "*?"], {"patterns": ["^(?:..*|..*)\\z"]}, id="any-is-no-prefix"),
    ],
)
def test_each_glob_is_the_cheapest_test_of_its_shape(
    globs: list[str], tests: dict[str, list[str]]
) -> None:
    empty: dict[str, list[str]] = {"exact": [], "prefixes": [], "suffixes": [], "patterns": []}
    assert value_tests([Glob.compile(g) for g in globs]) == {**empty, **tests}


@pytest.mark.parametrize("count", [1, 3, 64])
def test_the_tests_of_a_requirement_accept_exactly_what_its_globs_accept(count: int) -> None:
    """As the policy runs them: a lookup, startsWith, endsWith, then RE2 ``matches``."""
    globs = [Glob.compile(text) for text in (GLOBS * 4)[:count]]
    tests = value_tests(globs)
    assert len(tests["patterns"]) <= 1
    for value in VALUES:
        passed = (
            value in tests["exact"]
            or any(value.startswith(p) for p in tests["prefixes"])
            or any(value.endswith(s) for s in tests["suffixes"])
            or any(re2.search(p, value) for p in tests["patterns"])
        )
        assert passed == any(g.matches(value) for g in globs), (globs, value)


# --- incremental -------------------------------------------------------------------------------

COMPILER = Compiler((DEFAULT_ANNOTATION_KEY,))
BASE = (
    *OBJECTS,
    role("view-a", "", [rule("*", "configmaps")], {"configmaps": {"team": ["a"]}}),
    binding("t2-view", "view-a", "User:frank", namespace="t2", role_kind="ClusterRole"),
    role("team-b", "t3", [rule("*", "configmaps")], {"configmaps": {"team": ["b"]}}),
    binding("bob-b", "team-b", "User:bob", namespace="t3"),
    ("Namespace", {"kind": "Namespace", "metadata": {"name": "t4"}}),
)


def compiled(kind_obj: tuple[str, dict[str, Any]]) -> Any:
    return BY_KIND[kind_obj[0]].compile(COMPILER, kind_obj[1])


def live_of(objects: tuple[tuple[str, dict[str, Any]], ...]) -> LiveSnapshot:
    by_kind: dict[str, list[Any]] = defaultdict(list)
    for item in objects:
        by_kind[item[0]].append(compiled(item))
    return LiveSnapshot.build(by_kind)


CHANGES = [
    pytest.param(None, binding("x", "team-a", "User:zed", namespace="t1"), {"t1"}, id="rb-add"),
    pytest.param(OBJECTS[3], None, {"t1"}, id="rb-delete"),
    pytest.param(
        TEAM_A,
        role("team-a", "t1", [rule("*", "configmaps")], {"configmaps": {"team": ["z"]}}),
        {"t1"},
        id="role-update",
    ),
    pytest.param(
        BASE[8],
        role("view-a", "", [rule("*", "configmaps")], {"configmaps": {"team": ["q"]}}),
        {"t2"},
        id="clusterrole-via-rb",
    ),
    pytest.param(None, binding("all-a", "view-a", "Group:tenants"), {CLUSTER}, id="crb-add"),
    pytest.param(
        None,
        ("Namespace", {"kind": "Namespace", "metadata": {"name": "t5"}}),
        {"t5"},
        id="namespace-add",
    ),
]


@pytest.mark.parametrize(("old", "new", "expected"), CHANGES)
def test_a_change_touches_the_namespaces_whose_parameters_it_may_alter(
    old: tuple[str, dict[str, Any]] | None,
    new: tuple[str, dict[str, Any]] | None,
    expected: set[str] | frozenset[str],
) -> None:
    before = live_of(BASE)
    kind = (old or new)[0]  # type: ignore[index]
    change = (kind, compiled(old) if old else None, compiled(new) if new else None)
    after = before.apply([change])
    found = touched(after, [change])
    assert found == expected
    # Every namespace whose parameters changed, appeared or went is among those found, and so
    # is the cluster part when it changed (a write of the policy, not of every namespace).
    was, now = namespaces_of(before.snapshot), namespaces_of(after.snapshot)
    changed = (was ^ now) | {
        ns
        for ns in was & now
        if render(before.snapshot, ns, TARGET).spec != render(after.snapshot, ns, TARGET).spec
    }
    if render_cluster(before.snapshot, TARGET) != render_cluster(after.snapshot, TARGET):
        changed.add(CLUSTER)
    assert changed <= found
    assert changed, "the change must alter some namespace's parameters or the cluster part"


def test_a_cluster_role_bound_in_a_namespace_and_cluster_wide_touches_both() -> None:
    before = live_of((*BASE, binding("all-a", "view-a", "Group:tenants")))
    new = role("view-a", "", [rule("*", "configmaps")], {"configmaps": {"team": ["q"]}})
    change = ("ClusterRole", compiled(BASE[8]), compiled(new))
    assert touched(before.apply([change]), [change]) == {"t2", CLUSTER}


CLUSTER_CHANGES = [
    (None, binding("all-a", "view-a", "Group:tenants")),
    (
        BASE[8],
        role("view-a", "", [rule("*", "configmaps")], {"configmaps": {"team": ["q", "r*"]}}),
    ),
    (None, role("edit-all", "", [rule("create", "configmaps secrets")])),
    (None, binding("edit-all", "edit-all", "User:alice", "Group:tenants")),
    (binding("all-a", "view-a", "Group:tenants"), None),
]


def test_cluster_bindings_resolved_once_follow_every_change_and_every_snapshot() -> None:
    # The cluster scope is resolved once for all namespaces of a snapshot: after each change,
    # and for snapshots rendered in any order, every namespace is what a snapshot indexed whole
    # from the same objects renders.
    lives = [live_of(BASE)]
    for old, new in CLUSTER_CHANGES:
        kind = (old or new)[0]  # type: ignore[index]
        change = (kind, compiled(old) if old else None, compiled(new) if new else None)
        lives.append(lives[-1].apply([change], whole=False))
    for live in [*lives, *reversed(lives)]:
        whole = LiveSnapshot.of(live.objects)
        for namespace in sorted(namespaces_of(live.snapshot)):
            ours = read_as_the_policy(live.snapshot, namespace, TARGET)
            assert ours == read_as_the_policy(whole.snapshot, namespace, TARGET)
    # The changes did reach the cluster-wide subjects.
    first, last = (
        read_as_the_policy(live.snapshot, "t1", TARGET) for live in (lives[0], lives[-1])
    )
    assert "alice" not in first["clusterUsers"]
    assert grant_roles(last, "clusterUsers", "alice") == ["clusterrole edit-all"]


def test_the_namespaces_view_is_the_set_of_namespaces_getting_parameters() -> None:
    state = live_of(BASE).snapshot
    view = Namespaces(state)
    assert set(view) == namespaces_of(state) == {"t1", "t2", "t3", "t4"}
    assert all(name in view for name in namespaces_of(state))
    # The cluster scope ("") and a namespace with neither a Namespace nor a RoleBinding are not.
    assert "" not in view and "t9" not in view and len(view) == 4


LITERALS = [
    pytest.param({"a": ["c0"], "b": []}, id="map-of-lists"),
    pytest.param({"role": "x", "unrestricted": True}, id="mixed-map"),
    pytest.param(
        {"c0": {"role": "x", "invalid": "why"}, "c1": {"role": "y", "unrestricted": True}},
        id="maps-of-differing-types",
    ),
    pytest.param(["a", 1, False, [], {}], id="mixed-list"),
    pytest.param({'quote"d': "back\\slash\n", "ünï": "çødé"}, id="escapes"),
    pytest.param({}, id="empty"),
]


@pytest.mark.parametrize("value", LITERALS)
def test_a_cel_literal_is_the_value_and_each_aggregate_one_type(value: Any) -> None:
    """The cluster part's constants: what CEL reads back is the JSON value, and no list or map
    mixes element types (the API server refuses that) but through ``dyn``."""
    literal = cel_literal(value)
    env = celpy.Environment()
    assert env.program(env.compile(literal)).evaluate({}) == celpy.json_to_cel(value)


def _cluster_state(users: int) -> Snapshot:
    """``users`` users, each bound cluster-wide to a restricted ClusterRole of their own, and
    one ClusterRole bound to all of them."""
    objects: list[Any] = [role("shared", "", [rule("*", "secrets")])]
    for i in range(users):
        objects.append(
            role(f"c{i}", "", [rule("*", "configmaps")], {"configmaps": {"team": [f"t{i}"]}})
        )
        objects.append(binding(f"c{i}", f"c{i}", f"User:u{i}"))
    objects.append(binding("shared", "shared", *(f"User:u{i}" for i in range(users))))
    return snapshot(*objects)


def test_the_cluster_part_is_split_whole_subjects_with_what_they_need() -> None:
    state = _cluster_state(40)
    whole = render_cluster(state, TARGET)
    assert len(whole.chunks) == 1
    split = render_cluster(state, replace(TARGET, chunk_code_points=1500))
    assert split.delegated is None and len(split.chunks) > 3
    env = celpy.Environment()
    seen: dict[str, list[str]] = {}
    for chunk in split.chunks:
        assert len(chunk) <= 1500
        value = env.program(env.compile(chunk)).evaluate({})
        for subject, ids in value["users"].items():
            assert str(subject) not in seen, "a subject is in one chunk"
            seen[str(subject)] = [str(i) for i in ids]
            for i in ids:  # every role and grant a subject needs is in its chunk
                for ops in value["roles"][i].values():
                    assert all(g in value["grants"] for g in ops.values())
    assert seen == whole.spec["users"]
    # Each map holds one type: no ``dyn`` but the chunk's own values (the API server checks a
    # literal of many in seconds).
    assert all(chunk.count("dyn(") == 6 for chunk in split.chunks)


@pytest.mark.parametrize(
    ("users", "code_points", "cause"),
    [
        pytest.param(200, 2000, "TooLarge", id="too-many-chunks"),
        pytest.param(1, 100, "TooLarge", id="a-subject-larger-than-a-chunk"),
    ],
)
def test_a_cluster_part_too_large_leaves_every_namespace_to_the_webhook(
    users: int, code_points: int, cause: str
) -> None:
    state = _cluster_state(users)
    target = replace(TARGET, chunk_code_points=code_points)
    part = render_cluster(state, target)
    assert part.chunks == () and part.reason == cause
    rendered = render(state, "t9", target)
    assert rendered.reason == cause and rendered.delegated is not None
    assert "ClusterRoleBindings" in rendered.delegated


def test_the_unjudged_resources_are_a_map_the_policy_looks_a_resource_up_in() -> None:
    literal = unjudged_literal(["secrets", "widgets.example.com"])
    env = celpy.Environment()
    program = env.program(env.compile(f"[key in {literal}, 'configmaps' in {literal}]"))
    found = program.evaluate({"key": celpy.json_to_cel("widgets.example.com")})
    assert found == celpy.json_to_cel([True, False])


@pytest.mark.parametrize(
    ("served", "delegated"),
    [
        pytest.param(500, False, id="within-the-limit"),
        pytest.param(1000, True, id="past-it"),
    ],
)
def test_served_resources_past_the_policy_s_share_leave_every_namespace_to_the_webhook(
    served: int, delegated: bool
) -> None:
    """The list of resources no annotation restricts is the cluster's (discovery's), stored in
    the policy: one too long for it is never truncated (a resource left out would be refused
    everywhere, one kept wrongly allowed), every namespace goes to the webhook."""
    many = [Resource("example.com", f"widgets-of-a-rather-long-name-{i:04}") for i in range(served)]
    target = Target.of([CONFIGMAPS, *many], Options())
    state = snapshot(*OBJECTS)
    part = render_cluster(state, target)
    rendered = render(state, "t1", target)
    assert (part.delegated is not None, rendered.delegated is not None) == (delegated, delegated)
    if delegated:
        assert part.reason == rendered.reason == "TooLarge" and part.unjudged == ()
        assert f"the {served} served resources" in str(rendered.delegated)
    else:
        assert len(part.unjudged) == served  # configmaps is indexed: every other one
