"""The permission annotation: globs, schema validation and which entries decide for a resource."""

from __future__ import annotations

import json

import pytest

from app.engine.model import Resource
from app.engine.policy import (
    AnnotationError,
    Glob,
    parse_permissions,
    permissions_of,
)

CORE = ""


def res(text: str, group: str = CORE) -> Resource:
    """``res("pods/exec")`` → core pods/exec; ``res("deployments", "apps")``."""
    resource, _, sub = text.partition("/")
    return Resource(group, resource, sub)


def perms(document: object, default_label_key: str | None = None):
    return parse_permissions(json.dumps(document), default_label_key=default_label_key)


# --- Glob -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "value", "expected"),
    [
        pytest.param("a", "a", True, id="literal-equal"),
        pytest.param("a", "ab", False, id="literal-no-prefix-match"),
        pytest.param("a", "A", False, id="literal-case-sensitive"),
        pytest.param("a", "", False, id="literal-vs-empty"),
        pytest.param("*", "", True, id="star-matches-empty"),
        pytest.param("*", "anything-at-all", True, id="star-matches-all"),
        pytest.param("team-*", "team-a", True, id="star-suffix"),
        pytest.param("team-*", "team-", True, id="star-suffix-empty"),
        pytest.param("team-*", "xteam-a", False, id="star-anchored-at-start"),
        pytest.param("*-prod", "eu-prod", True, id="star-prefix"),
        pytest.param("*-prod", "eu-prod-2", False, id="star-anchored-at-end"),
        pytest.param("a*b*c", "a-x-b-y-c", True, id="several-stars"),
        pytest.param("v?", "v1", True, id="question-one-char"),
        pytest.param("v?", "v", False, id="question-not-zero-chars"),
        pytest.param("v?", "v12", False, id="question-not-two-chars"),
        # Literal characters that are regex metacharacters must stay literal inside a glob.
        pytest.param("a.b*", "a.b1", True, id="dot-literal-matches-dot"),
        pytest.param("a.b*", "aXb1", False, id="dot-is-not-any-char"),
        pytest.param("v1.*", "v1.2", True, id="dot-then-star"),
        pytest.param("v1.*", "v102", False, id="dot-then-star-needs-dot"),
        pytest.param("a+*", "a+b", True, id="plus-literal"),
        pytest.param("a+*", "aab", False, id="plus-not-repetition"),
        pytest.param("(a|b)*", "(a|b)x", True, id="parens-literal"),
        pytest.param("(a|b)*", "ax", False, id="alternation-not-regex"),
        pytest.param("[ab]?", "[ab]x", True, id="brackets-literal"),
        pytest.param("[ab]?", "ax", False, id="class-not-regex"),
        pytest.param("^a$*", "^a$", True, id="anchors-literal"),
        # A literal is compared by equality, even with metacharacters in it.
        pytest.param("a.b", "a.b", True, id="literal-with-dot"),
        pytest.param("a.b", "axb", False, id="literal-dot-not-wildcard"),
    ],
)
def test_glob_matches(pattern: str, value: str, expected: bool) -> None:
    assert Glob.compile(pattern).matches(value) is expected


def test_glob_literal_has_no_regex() -> None:
    assert Glob.compile("app-intent").is_literal
    assert not Glob.compile("app-*").is_literal
    assert not Glob.compile("app-?").is_literal


def test_glob_star_does_not_stop_at_newline() -> None:
    # Label values cannot hold newlines, but a glob must never be weaker than it claims.
    assert Glob.compile("a*").matches("a\nb")


def test_glob_equality_ignores_compiled_regex() -> None:
    assert Glob.compile("a*") == Glob.compile("a*")
    assert Glob.compile("a*") != Glob.compile("a?")


@pytest.mark.parametrize(
    ("outer", "inner", "expected"),
    [
        pytest.param("*", "anything", True, id="star-covers-literal"),
        pytest.param("*", "team-*", True, id="star-covers-glob"),
        pytest.param("*", "*", True, id="star-covers-star"),
        pytest.param("a", "a", True, id="literal-covers-itself"),
        pytest.param("a", "b", False, id="literal-not-other-literal"),
        pytest.param("a", "*", False, id="literal-not-star"),
        pytest.param("a", "a*", False, id="literal-not-glob"),
        pytest.param("team-*", "team-a", True, id="glob-covers-matching-literal"),
        pytest.param("team-*", "other", False, id="glob-not-non-matching-literal"),
        pytest.param("team-*", "team-*", True, id="glob-covers-itself"),
        pytest.param("team-*", "*", False, id="glob-not-star"),
        # Subset of globs that cannot be proven: refused (the safe direction).
        pytest.param("team-*", "team-a*", False, id="unprovable-glob-subset-refused"),
        pytest.param("v?", "v1", True, id="question-covers-literal"),
        pytest.param("v?", "v12", False, id="question-not-longer-literal"),
    ],
)
def test_glob_covers(outer: str, inner: str, expected: bool) -> None:
    assert Glob.compile(outer).covers(Glob.compile(inner)) is expected


# --- Parsing and schema validation -----------------------------------------------------------


def test_parse_full_form() -> None:
    p = perms({"configmaps": {"team": ["a", "b*"], "env": ["prod"]}})
    (entry,) = p.entries
    assert entry.pattern == "configmaps"
    assert entry.group is None and entry.subresource is None
    assert [r.key for r in entry.requirements] == ["team", "env"]
    assert entry.requirement("team").allows("a")
    assert entry.requirement("team").allows("b2")
    assert not entry.requirement("team").allows("c")
    assert entry.requirement("missing") is None
    assert entry.describe() == "team in [a, b*] and env in [prod]"


def test_parse_pattern_parts() -> None:
    p = perms({"mwan3*.batch.sdewan.akraino.org/status": {"k": ["v"]}})
    (entry,) = p.entries
    assert entry.resource.text == "mwan3*"
    assert entry.group is not None and entry.group.text == "batch.sdewan.akraino.org"
    assert entry.subresource is not None and entry.subresource.text == "status"


def test_shorthand_uses_default_label_key() -> None:
    p = perms({"mwan3policies": ["app-intent"]}, default_label_key="sdewan-bucket-type")
    (entry,) = p.entries
    assert [(r.key, [g.text for g in r.values]) for r in entry.requirements] == [
        ("sdewan-bucket-type", ["app-intent"])
    ]


def test_annotation_key_is_recorded() -> None:
    p = parse_permissions('{"pods": {"a": ["b"]}}', annotation_key="example.com/perm")
    assert p.annotation_key == "example.com/perm"


def test_prefixed_label_key_and_empty_value_are_valid() -> None:
    p = perms({"pods": {"example.com/team": ["", "a"]}})
    req = p.entries[0].requirement("example.com/team")
    assert req is not None and req.allows("") and req.allows("a") and not req.allows("b")


@pytest.mark.parametrize(
    ("raw", "default_label_key", "fragment"),
    [
        pytest.param("{", None, "not valid JSON", id="bad-json"),
        pytest.param("", None, "not valid JSON", id="empty-string"),
        pytest.param("{}", None, "should be non-empty", id="empty-object"),
        pytest.param("[]", None, "is not of type 'object'", id="top-level-list"),
        pytest.param("null", None, "is not of type 'object'", id="null"),
        pytest.param('"configmaps"', None, "is not of type 'object'", id="top-level-string"),
        pytest.param('{"configmaps": []}', "team", "at configmaps", id="empty-list"),
        pytest.param('{"configmaps": {}}', None, "at configmaps", id="empty-label-map"),
        pytest.param('{"configmaps": {"team": []}}', None, "at configmaps", id="empty-value-list"),
        pytest.param(
            '{"configmaps": {"Bad Key": ["a"]}}',
            None,
            "at configmaps: 'Bad Key' is not a label key",
            id="label-key-space",
        ),
        pytest.param(
            '{"configmaps": {"' + "k" * 64 + '": ["a"]}}',
            None,
            "is not a label key ([prefix/]name, name at most 63 characters)",
            id="label-key-name-too-long",
        ),
        pytest.param(
            '{"configmaps": {"-team": ["a"]}}', None, "at configmaps", id="label-key-leading-dash"
        ),
        pytest.param(
            '{"configmaps": {"Example.com/team": ["a"]}}',
            None,
            "at configmaps",
            id="label-key-uppercase-prefix",
        ),
        pytest.param(
            '{"configmaps": {"team": [1]}}', None, "at configmaps/team/0", id="non-string-value"
        ),
        pytest.param(
            '{"configmaps": {"team": [null]}}', None, "at configmaps/team/0", id="null-value"
        ),
        pytest.param(
            '{"configmaps": {"team": "a"}}', None, "at configmaps/team", id="value-not-a-list"
        ),
        pytest.param(
            '{"configmaps": {"team": ["a b"]}}',
            None,
            "at configmaps/team/0: 'a b' is not a label value glob",
            id="value-space",
        ),
        pytest.param(
            '{"configmaps": {"team": ["' + "a" * 64 + '"]}}',
            None,
            "at configmaps/team/0",
            id="value-too-long",
        ),
        pytest.param('{"configmaps": "a"}', "team", "at configmaps", id="entry-is-string"),
        pytest.param(
            '{"config maps": {"t": ["a"]}}',
            None,
            "'config maps' is not a resource pattern",
            id="bad-resource",
        ),
        pytest.param('{"pods/exec/x": {"t": ["a"]}}', None, "pods/exec/x", id="two-slashes"),
        pytest.param('{"configmaps": ["a"]}', None, "no default label key", id="shorthand-no-key"),
    ],
)
def test_invalid_annotations(raw: str, default_label_key: str | None, fragment: str) -> None:
    with pytest.raises(AnnotationError) as info:
        parse_permissions(raw, default_label_key=default_label_key)
    assert fragment in str(info.value)


def test_schema_error_names_its_location() -> None:
    with pytest.raises(AnnotationError, match=r"^schema violation at configmaps/team/0: "):
        parse_permissions('{"configmaps": {"team": [1]}}')


def test_shorthand_error_names_the_entry_and_the_fix() -> None:
    with pytest.raises(AnnotationError) as info:
        parse_permissions('{"mwan3policies": ["app-intent"]}')
    message = str(info.value)
    assert "'mwan3policies'" in message
    assert "--default-label-key" in message


# --- permissions_of: which annotation a role carries -----------------------------------------

KEYS = ("labelrbac.io/permissions", "sdewan-bucket-type-permission")


def test_no_configured_key_means_no_permissions() -> None:
    assert permissions_of({}, KEYS, None) is None
    assert permissions_of({"unrelated": '{"pods": ["x"]}'}, KEYS, None) is None


def test_any_configured_key_is_read() -> None:
    p = permissions_of(
        {"sdewan-bucket-type-permission": '{ "mwan3policies": ["app-intent"] }'},
        KEYS,
        "sdewan-bucket-type",
    )
    assert p is not None
    assert p.annotation_key == "sdewan-bucket-type-permission"
    assert p.entries[0].requirement("sdewan-bucket-type") is not None


def test_unconfigured_key_is_ignored() -> None:
    # Only the keys the webhook is configured with count; a look-alike key is just an annotation.
    p = permissions_of({"sdewan-bucket-type-permission": "{"}, KEYS[:1], None)
    assert p is None


def test_two_configured_keys_present_is_invalid() -> None:
    annotations = {KEYS[0]: '{"pods": {"a": ["b"]}}', KEYS[1]: '{"pods": {"a": ["b"]}}'}
    with pytest.raises(AnnotationError, match="more than one permission annotation") as info:
        permissions_of(annotations, KEYS, None)
    assert KEYS[0] in str(info.value) and KEYS[1] in str(info.value)


def test_invalid_value_error_names_the_key() -> None:
    with pytest.raises(AnnotationError, match=r"^invalid labelrbac\.io/permissions annotation: "):
        permissions_of({KEYS[0]: "{}"}, KEYS, None)


# --- entries_for: which entries decide -------------------------------------------------------


def deciding(document: dict, resource: Resource) -> list[str]:
    return [e.pattern for e in perms(document).entries_for(resource)]


@pytest.mark.parametrize(
    ("document", "resource", "expected"),
    [
        pytest.param({"configmaps": {"t": ["a"]}}, res("configmaps"), ["configmaps"], id="exact"),
        pytest.param({"configmaps": {"t": ["a"]}}, res("secrets"), [], id="other-resource"),
        pytest.param(
            {"configmaps": {"t": ["a"]}},
            res("configmaps", "example.com"),
            ["configmaps"],
            id="no-group-means-any-group",
        ),
        pytest.param(
            {"deployments.apps": {"t": ["a"]}},
            res("deployments", "extensions"),
            [],
            id="explicit-group-must-match",
        ),
        pytest.param(
            {"deployments.apps": {"t": ["a"]}},
            res("deployments", "apps"),
            ["deployments.apps"],
            id="explicit-group-matches",
        ),
        pytest.param(
            {"ingresses.*.k8s.io": {"t": ["a"]}},
            res("ingresses", "networking.k8s.io"),
            ["ingresses.*.k8s.io"],
            id="group-glob",
        ),
        pytest.param(
            {"mwan3*": {"t": ["a"]}},
            res("mwan3policies", "batch.sdewan.akraino.org"),
            ["mwan3*"],
            id="resource-glob",
        ),
        pytest.param(
            {"pods": {"t": ["a"]}}, res("pods/exec"), ["pods"], id="parent-covers-subresource"
        ),
        pytest.param(
            {"pods/exec": {"t": ["a"]}}, res("pods"), [], id="subresource-entry-not-for-parent"
        ),
        pytest.param(
            {"pods/exec": {"t": ["a"]}}, res("pods/log"), [], id="subresource-entry-other-sub"
        ),
        pytest.param(
            {"pods": {"t": ["a"]}, "pods/exec": {"t": ["b"]}},
            res("pods/exec"),
            ["pods/exec"],
            id="subresource-overrides-parent",
        ),
        pytest.param(
            {"pods": {"t": ["a"]}, "pods/exec": {"t": ["b"]}},
            res("pods/log"),
            ["pods"],
            id="other-subresource-falls-back-to-parent",
        ),
        pytest.param(
            {"pods": {"t": ["a"]}, "pods/exec": {"t": ["b"]}},
            res("pods"),
            ["pods"],
            id="parent-ignores-subresource-entry",
        ),
        pytest.param(
            {"*.apps": {"t": ["a"]}, "*/scale": {"t": ["b"]}},
            res("deployments/scale", "apps"),
            ["*/scale"],
            id="glob-subresource-beats-parent-with-group",
        ),
        pytest.param(
            {"*": {"t": ["a"]}, "configmaps": {"t": ["b"]}},
            res("configmaps"),
            ["configmaps"],
            id="literal-beats-star",
        ),
        pytest.param(
            {"*": {"t": ["a"]}, "configmaps": {"t": ["b"]}},
            res("secrets"),
            ["*"],
            id="star-for-the-rest",
        ),
        pytest.param(
            {"*.apps": {"t": ["a"]}, "deployments": {"t": ["b"]}},
            res("deployments", "apps"),
            ["deployments"],
            id="literal-resource-beats-explicit-group",
        ),
        pytest.param(
            {"deployments": {"t": ["a"]}, "deployments.apps": {"t": ["b"]}},
            res("deployments", "apps"),
            ["deployments.apps"],
            id="explicit-group-beats-none",
        ),
        pytest.param(
            {"mwan3*": {"t": ["a"]}, "mwan3policies": {"t": ["b"]}},
            res("mwan3policies", "batch.sdewan.akraino.org"),
            ["mwan3policies"],
            id="literal-beats-glob",
        ),
        pytest.param(
            {"mwan3*": {"t": ["a"]}, "*policies": {"t": ["b"]}},
            res("mwan3policies", "batch.sdewan.akraino.org"),
            ["mwan3*", "*policies"],
            id="tie-returns-all",
        ),
        pytest.param(
            {"pods/*": {"t": ["a"]}, "*/exec": {"t": ["b"]}},
            res("pods/exec"),
            ["*/exec"],
            id="literal-subresource-beats-literal-resource",
        ),
        pytest.param(
            {"pods/*": {"t": ["a"]}, "pods/exec": {"t": ["b"]}},
            res("pods/exec"),
            ["pods/exec"],
            id="literal-subresource-beats-subresource-glob",
        ),
        pytest.param(
            {"pods": {"t": ["a"]}, "pods/*": {"t": ["b"]}},
            res("pods/exec"),
            ["pods/*"],
            id="subresource-glob-beats-parent",
        ),
    ],
)
def test_entries_for(document: dict, resource: Resource, expected: list[str]) -> None:
    assert deciding(document, resource) == expected


def test_tied_entries_all_apply() -> None:
    # Two equally specific entries both decide: a label set must satisfy both (AND).
    p = perms({"mwan3*": {"team": ["a", "b"]}, "*policies": {"team": ["b", "c"]}})
    entries = p.entries_for(res("mwan3policies", "batch.sdewan.akraino.org"))
    assert len(entries) == 2

    def ok(team: str) -> bool:
        return all(e.violation({"team": team}, allow_unlabeled=False) is None for e in entries)

    assert ok("b")
    assert not ok("a")
    assert not ok("c")


def test_entries_for_is_stable_across_calls() -> None:
    p = perms({"pods": {"t": ["a"]}, "pods/exec": {"t": ["b"]}})
    first = p.entries_for(res("pods/exec"))
    assert p.entries_for(res("pods/exec")) == first
    assert p.entries_for(res("pods")) != first


# --- Entry.violation -------------------------------------------------------------------------


def entry(document: dict):
    (only,) = perms(document).entries
    return only


def test_and_across_keys_or_within_a_key() -> None:
    e = entry({"pods": {"team": ["a", "b"], "env": ["prod"]}})
    assert e.violation({"team": "a", "env": "prod"}, False) is None
    assert e.violation({"team": "b", "env": "prod", "other": "x"}, False) is None
    wrong = e.violation({"team": "c", "env": "prod"}, False)
    assert wrong is not None and (wrong.key, wrong.value) == ("team", "c")
    wrong = e.violation({"team": "a", "env": "dev"}, False)
    assert wrong is not None and (wrong.key, wrong.value) == ("env", "dev")


def test_missing_label_fails_unless_unlabeled_allowed() -> None:
    e = entry({"pods": {"team": ["*"]}})
    missing = e.violation({}, allow_unlabeled=False)
    assert missing is not None and (missing.key, missing.value) == ("team", None)
    assert e.violation({}, allow_unlabeled=True) is None
    # allow_unlabeled tolerates absence, never a wrong value.
    e = entry({"pods": {"team": ["a"]}})
    assert e.violation({"team": "b"}, allow_unlabeled=True) is not None


def test_star_value_requires_presence() -> None:
    e = entry({"pods": {"team": ["*"]}})
    assert e.violation({"team": ""}, False) is None
    assert e.violation({"other": "x"}, False) is not None


@pytest.mark.parametrize(
    ("value", "existing", "text"),
    [
        pytest.param("b", False, 'label team="b" is not permitted', id="new-wrong"),
        pytest.param(
            "b", True, 'the existing object\'s label team="b" is not permitted', id="old-wrong"
        ),
        pytest.param(None, False, "missing label team", id="new-missing"),
        pytest.param(None, True, "the existing object has no label team", id="old-missing"),
    ],
)
def test_violation_text(value: str | None, existing: bool, text: str) -> None:
    e = entry({"pods": {"team": ["a"]}})
    labels = {} if value is None else {"team": value}
    violation = e.violation(labels, False)
    assert violation is not None
    assert violation.describe(existing) == text
