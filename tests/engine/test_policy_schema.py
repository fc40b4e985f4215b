"""The annotation schema's compiled predicate answers exactly as jsonschema does.

``parse_permissions`` trusts the predicate when it accepts a document, so a document it accepted
and jsonschema rejected would widen access: both are asked about many generated documents,
valid ones, near-valid ones (one part at or past a limit) and arbitrary JSON.
"""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.engine.policy import (
    _FEW_WILDCARDS_RESOURCE,
    _FEW_WILDCARDS_VALUE,
    _LABEL_KEY,
    _RESOURCE_PATTERN,
    _VALUE_GLOB,
    MAX_VALUES_PER_KEY,
    MAX_WILDCARDS,
    SCHEMA,
    AnnotationError,
    compile_schema,
    parse_permissions,
)

VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
VALID = compile_schema(SCHEMA)

# Characters the patterns treat differently, and a few they never allow.
ALPHABET = "aZ09-_.*?/ \n\té"


def _near(pattern: str) -> st.SearchStrategy[str]:
    """Strings matching ``pattern``, sometimes changed at one end (a trailing newline, which
    ``$`` lets through, an extra character, a stray one)."""
    base = st.from_regex(re.compile(pattern), fullmatch=True)
    return st.one_of(
        base,
        st.builds(lambda s, c: s + c, base, st.sampled_from([*list(ALPHABET), "\n", "a" * 64])),
        st.builds(lambda s, c: c + s, base, st.sampled_from(list(ALPHABET))),
    )


def _stars(longest: int) -> st.SearchStrategy[str]:
    """Globs with a wildcard count around the limit and runs around the longest allowed."""
    run = st.integers(0, longest + 1).map(lambda n: "a" * n)
    return st.lists(st.tuples(run, st.sampled_from("*?")), max_size=MAX_WILDCARDS + 2).map(
        lambda parts: "".join(r + w for r, w in parts)
    )


STRINGS = st.one_of(
    _near(_RESOURCE_PATTERN),
    _near(_LABEL_KEY),
    _near(_VALUE_GLOB),
    _near(_FEW_WILDCARDS_VALUE),
    _near(_FEW_WILDCARDS_RESOURCE),
    _stars(63),
    _stars(63 + 1 + 253 + 1 + 63),
    st.text(ALPHABET, max_size=80),
)
SCALARS = st.one_of(STRINGS, st.integers(), st.booleans(), st.none(), st.floats(allow_nan=False))
VALUES = st.lists(st.one_of(STRINGS, SCALARS), max_size=4)
LABELS = st.dictionaries(STRINGS, st.one_of(VALUES, SCALARS, st.dictionaries(STRINGS, VALUES)))
# Shaped like annotations (resource pattern → values or labels), and arbitrary JSON.
SHAPED = st.dictionaries(STRINGS, st.one_of(VALUES, LABELS, SCALARS), max_size=4)
ANY_JSON = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(STRINGS, inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(SHAPED, ANY_JSON, st.lists(SHAPED, max_size=2)))
def test_the_compiled_schema_agrees_with_jsonschema(document: Any) -> None:
    assert VALID(document) == VALIDATOR.is_valid(document)


@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow])
@given(SHAPED)
def test_an_annotation_is_accepted_only_when_jsonschema_accepts_it(document: Any) -> None:
    raw = json.dumps(document)
    try:
        parse_permissions(raw, default_label_key="team")
    except AnnotationError as exc:
        if VALIDATOR.is_valid(document):  # valid, so refused for another cause: said so
            assert "schema violation" not in str(exc)
    else:
        assert VALIDATOR.is_valid(document)


@pytest.mark.parametrize(
    "document",
    [
        pytest.param({"configmaps": {"team": ["a"]}}, id="valid"),
        pytest.param({"configmaps\n": ["a"]}, id="trailing-newline-key"),
        pytest.param({"configmaps": {"team": ["a\n"]}}, id="trailing-newline-value"),
        pytest.param({"configmaps": {"team": ["a" * 63]}}, id="longest-value"),
        pytest.param({"configmaps": {"team": ["a" * 64]}}, id="value-too-long"),
        pytest.param({"configmaps": {"team": ["*" * MAX_WILDCARDS]}}, id="most-wildcards"),
        pytest.param({"configmaps": {"team": ["*" * (MAX_WILDCARDS + 1)]}}, id="too-many"),
        pytest.param({"configmaps": {}}, id="no-labels"),
        pytest.param({"configmaps": []}, id="no-values"),
        pytest.param({"configmaps": "a"}, id="string-value"),
        pytest.param({}, id="empty"),
        pytest.param([], id="array"),
        pytest.param({"configmaps": {"team": [1]}}, id="number-value"),
        pytest.param({"configmaps": {"-team": ["a"]}}, id="bad-label-key"),
        pytest.param({"configmaps": ["a"] * MAX_VALUES_PER_KEY}, id="most-values"),
        pytest.param({"configmaps": ["a"] * (MAX_VALUES_PER_KEY + 1)}, id="too-many-values"),
        pytest.param(
            {"configmaps": {"team": ["a"] * (MAX_VALUES_PER_KEY + 1)}}, id="too-many-for-key"
        ),
    ],
)
def test_the_compiled_schema_on_the_edges(document: Any) -> None:
    assert VALID(document) == VALIDATOR.is_valid(document)


@pytest.mark.parametrize(
    ("schema", "document"),
    [
        pytest.param({"then": {"type": "string"}}, 1, id="then-without-if"),
        pytest.param({"else": {"type": "string"}}, 1, id="else-without-if"),
        pytest.param({"if": {"type": "string"}}, 1, id="if-alone"),
        pytest.param({"type": ["string", "array"]}, [], id="type-list"),
        pytest.param({"pattern": "a"}, 1, id="pattern-on-non-string"),
        pytest.param({"maxItems": 1}, [1, 2], id="max-items-over"),
        pytest.param({"maxItems": 1}, "ab", id="max-items-on-non-array"),
    ],
)
def test_compiled_keywords_follow_jsonschema(schema: dict[str, Any], document: Any) -> None:
    assert compile_schema(schema)(document) == jsonschema.Draft202012Validator(schema).is_valid(
        document
    )


def test_a_keyword_it_does_not_implement_is_refused() -> None:
    with pytest.raises(ValueError, match="uniqueItems"):
        compile_schema({"type": "array", "uniqueItems": True})
