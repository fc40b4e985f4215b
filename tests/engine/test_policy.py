"""The permission annotation: globs, schema validation and which entries decide for a resource."""

from __future__ import annotations

import json
import time

import pytest

from app.engine.model import Resource
from app.engine.policy import (
    AnnotationError,
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


WILD = "a glob with at most 16 wildcards (* and ? together)"
RESOURCE_LIMITS = "resource and subresource at most 63 characters, group at most 253"


@pytest.mark.parametrize(
    ("pattern", "fragment"),
    [
        pytest.param("r" * 64, RESOURCE_LIMITS, id="resource-over-63"),
        pytest.param("pods." + "g" * 254, RESOURCE_LIMITS, id="group-over-253"),
        pytest.param("pods/" + "s" * 64, RESOURCE_LIMITS, id="subresource-over-63"),
        pytest.param("*a" * 17, WILD, id="resource-17-stars"),
        pytest.param("pods.*.*.*.*.*.*/" + "?" * 11, WILD, id="wildcards-counted-across-parts"),
        pytest.param("r" * 64 + "*" * 20, RESOURCE_LIMITS, id="length-reported-before-count"),
    ],
)
def test_resource_pattern_bounds(pattern: str, fragment: str) -> None:
    with pytest.raises(AnnotationError) as info:
        parse_permissions(json.dumps({pattern: {"t": ["a"]}}))
    assert f"{pattern!r} is not" in str(info.value)
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        pytest.param("*a" * 8 + "*b" + "?" * 8, WILD, id="value-17-wildcards"),
        pytest.param("?" * 17, WILD, id="value-17-questions"),
        pytest.param("*" * 64, "at most 63 of", id="value-over-63-stars"),
    ],
)
def test_value_glob_bounds(value: str, fragment: str) -> None:
    with pytest.raises(AnnotationError) as info:
        parse_permissions(json.dumps({"configmaps": {"team": [value]}}))
    assert "at configmaps/team/0" in str(info.value)
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    "pattern",
    [
        pytest.param("r" * 63, id="resource-63"),
        pytest.param("r" * 63 + "." + "g" * 253 + "/" + "s" * 63, id="every-part-at-its-limit"),
        pytest.param("*a" * 16, id="resource-16-stars"),
        pytest.param("*.*/*", id="all-wildcards"),
    ],
)
def test_patterns_at_the_limits_are_valid(pattern: str) -> None:
    (entry,) = perms({pattern: {"team": ["?" * 16, "*a" * 8, "v" * 63]}}).entries
    assert entry.pattern == pattern


def test_annotation_nested_beyond_the_recursion_limit_is_invalid() -> None:
    deep = '{"configmaps": {"team": ' + "[" * 100_000 + "]" * 100_000 + "}}"
    with pytest.raises(AnnotationError, match="not valid JSON: nested too deeply"):
        parse_permissions(deep)


def test_schema_rejects_huge_hostile_text_quickly() -> None:
    """Schema patterns run Python's backtracking re on text of any size: each gives up at once.

    Near misses a megabyte long in every place a pattern meets text: resource patterns, label
    keys (prefix and name) and value globs, dense with the characters each pattern repeats.
    """
    size = 1_000_000
    hostile = [
        "a" * size + "!",
        "a." * (size // 2) + "!",
        "*a" * (size // 2) + "!",
        "a" + "." * size + "a/b",
        "a" * 252 + "/" + "a" * size,
        ("a" * 63 + "*") * (size // 64),
        "?" * size,
        "-" * size,
    ]
    started = time.process_time()
    for text in hostile:
        for document in (
            {text: {"team": ["a"]}},
            {"configmaps": {text: ["a"]}},
            {"configmaps": {"team": [text]}},
        ):
            with pytest.raises(AnnotationError):
                parse_permissions(json.dumps(document))
    elapsed = time.process_time() - started
    # Reading and writing the JSON dominates (24 megabytes); matching must add nothing to it.
    assert elapsed < 5.0, f"24 hostile annotations took {elapsed:.2f}s"


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


# --- Identical annotations compile once -------------------------------------------------------


def test_identical_annotations_share_one_compiled_permissions() -> None:
    text = '{"configmaps": {"team": ["shared-cache-a"]}}'
    first = permissions_of({KEYS[0]: text}, KEYS, None)
    again = permissions_of({KEYS[0]: str(text.encode().decode())}, KEYS, None)
    assert first is not None and again is first
    # Anything that changes what the text compiles to is a different entry.
    other_key = permissions_of({KEYS[1]: text}, KEYS, None)
    assert other_key is not None and other_key is not first
    assert other_key.annotation_key == KEYS[1]
    shorthand = '{"configmaps": ["shared-cache-a"]}'
    with pytest.raises(AnnotationError, match="no default label key"):
        permissions_of({KEYS[0]: shorthand}, KEYS, None)
    with_default = permissions_of({KEYS[0]: shorthand}, KEYS, "team")
    assert with_default is not None
    assert with_default.entries[0].requirement("team") is not None


def test_an_invalid_annotation_is_refused_every_time_with_its_cause() -> None:
    bad = '{"configmaps": {"team": ["a b"]}}'
    messages = []
    for _ in range(2):
        with pytest.raises(AnnotationError) as info:
            permissions_of({KEYS[0]: bad}, KEYS, None)
        messages.append(str(info.value))
    assert messages[0] == messages[1]
    assert "schema violation at configmaps/team/0" in messages[0]


def test_a_long_annotation_is_compiled_without_the_cache() -> None:
    # Past the cached size every role's text is compiled on its own: still correct.
    values = [f"v{i:04d}{'x' * 58}" for i in range(64)]
    text = json.dumps({"configmaps": {"team": values, "env": values, "tier": values}})
    assert len(text) > 8192
    first = permissions_of({KEYS[0]: text}, KEYS, None)
    again = permissions_of({KEYS[0]: text}, KEYS, None)
    assert first is not None and again is not None and again is not first
    assert first == again and len(first.entries[0].requirements[0].values) == 64


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
