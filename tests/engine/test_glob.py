"""Globs: matching semantics against a slow reference, sound coverage, and linear-time matching."""

from __future__ import annotations

import fnmatch
import itertools
import time
from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine.glob import Glob, normalize
from app.engine.policy import MAX_WILDCARDS, parse_permissions


def reference(pattern: str, value: str) -> bool:
    """The textbook definition, by dynamic programming over (pattern, value) positions."""

    @cache
    def match(i: int, j: int) -> bool:
        if i == len(pattern):
            return j == len(value)
        if pattern[i] == "*":
            return match(i + 1, j) or (j < len(value) and match(i, j + 1))
        if j == len(value):
            return False
        return pattern[i] in ("?", value[j]) and match(i + 1, j + 1)

    return match(0, 0)


# --- Matching ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "value", "expected"),
    [
        pytest.param("a", "a", True, id="literal-equal"),
        pytest.param("a", "ab", False, id="literal-no-prefix-match"),
        pytest.param("a", "A", False, id="literal-case-sensitive"),
        pytest.param("a", "", False, id="literal-vs-empty"),
        pytest.param("", "", True, id="empty-matches-empty"),
        pytest.param("", "a", False, id="empty-matches-only-empty"),
        pytest.param("*", "", True, id="star-matches-empty"),
        pytest.param("*", "anything-at-all", True, id="star-matches-all"),
        pytest.param("**", "x", True, id="double-star"),
        pytest.param("team-*", "team-a", True, id="star-suffix"),
        pytest.param("team-*", "team-", True, id="star-suffix-empty"),
        pytest.param("team-*", "xteam-a", False, id="star-anchored-at-start"),
        pytest.param("*-prod", "eu-prod", True, id="star-prefix"),
        pytest.param("*-prod", "eu-prod-2", False, id="star-anchored-at-end"),
        pytest.param("a*b*c", "a-x-b-y-c", True, id="several-stars"),
        pytest.param("a*a", "a", False, id="prefix-and-suffix-may-not-overlap"),
        pytest.param("a*a", "aa", True, id="prefix-and-suffix-adjacent"),
        pytest.param("*aa", "aaa", True, id="suffix-overlapping-run"),
        pytest.param("*ab*ab", "abab", True, id="segment-then-suffix"),
        pytest.param("*ab*ab", "ab", False, id="segment-and-suffix-need-room"),
        pytest.param("*a*b*", "bbba", False, id="segments-in-order"),
        pytest.param("*a*b*", "bab", True, id="segments-found-leftmost"),
        pytest.param("v?", "v1", True, id="question-one-char"),
        pytest.param("v?", "v", False, id="question-not-zero-chars"),
        pytest.param("v?", "v12", False, id="question-not-two-chars"),
        pytest.param("?", "", False, id="question-vs-empty"),
        pytest.param("*?", "", False, id="star-question-needs-one"),
        pytest.param("*?*", "x", True, id="star-question-star"),
        pytest.param("?*?", "x", False, id="two-questions-need-two"),
        pytest.param("a?c*", "abcde", True, id="question-then-star"),
        pytest.param("*a?c", "xxabcabc", True, id="star-then-question-late"),
        pytest.param("*a?c", "xxabcabd", False, id="star-then-question-miss"),
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
    assert reference(pattern, value) is expected  # the reference agrees with the table


def test_glob_literal_is_compared_by_equality() -> None:
    assert Glob.compile("app-intent").is_literal
    assert not Glob.compile("app-*").is_literal
    assert not Glob.compile("app-?").is_literal


def test_glob_star_does_not_stop_at_newline() -> None:
    # Label values cannot hold newlines, but a glob must never be weaker than it claims.
    assert Glob.compile("a*").matches("a\nb")
    assert Glob.compile("a?b").matches("a\nb")


def test_glob_equality_is_by_text() -> None:
    assert Glob.compile("a*") == Glob.compile("a*")
    assert Glob.compile("a*") != Glob.compile("a?")
    assert Glob.compile("a**") != Glob.compile("a*")  # equal languages, different spellings


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        pytest.param("abc", "abc", id="literal"),
        pytest.param("**", "*", id="stars-collapse"),
        pytest.param("*?", "?*", id="questions-first"),
        pytest.param("a*?*?b", "a??*b", id="mixed-run"),
        pytest.param("??", "??", id="questions-alone-stay"),
        pytest.param("*a*?", "*a?*", id="two-runs"),
    ],
)
def test_normalize(text: str, canonical: str) -> None:
    assert normalize(text) == canonical


def test_universal() -> None:
    assert Glob.compile("*").is_universal
    assert Glob.compile("***").is_universal
    assert not Glob.compile("*?").is_universal
    assert not Glob.compile("a*").is_universal


PATTERNS = st.text(alphabet="ab.-*?", max_size=12)
VALUES = st.text(alphabet="ab.-", max_size=14)


@settings(max_examples=600, deadline=None)
@given(pattern=PATTERNS, value=VALUES)
def test_matching_equals_the_reference(pattern: str, value: str) -> None:
    expected = reference(pattern, value)
    assert Glob.compile(pattern).matches(value) is expected
    # fnmatch is the standard library's reading of the same syntax (no [ ] in our alphabet).
    assert fnmatch.fnmatchcase(value, pattern) is expected


@settings(max_examples=300, deadline=None)
@given(pattern=PATTERNS, data=st.data())
def test_a_glob_matches_its_own_instances(pattern: str, data: st.DataObject) -> None:
    value = instance(pattern, data)
    assert Glob.compile(pattern).matches(value)


def instance(pattern: str, data: st.DataObject) -> str:
    """A string the glob matches: each ``?`` and ``*`` replaced by drawn text."""
    parts = []
    for ch in pattern:
        if ch == "?":
            parts.append(data.draw(st.sampled_from("ab.-")))
        elif ch == "*":
            parts.append(data.draw(st.text(alphabet="ab.-", max_size=4)))
        else:
            parts.append(ch)
    return "".join(parts)


# --- Coverage ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("outer", "inner", "expected"),
    [
        pytest.param("*", "anything", True, id="star-covers-literal"),
        pytest.param("*", "team-*", True, id="star-covers-glob"),
        pytest.param("*", "*", True, id="star-covers-star"),
        pytest.param("**", "?*", True, id="double-star-covers-all"),
        pytest.param("a", "a", True, id="literal-covers-itself"),
        pytest.param("a", "b", False, id="literal-not-other-literal"),
        pytest.param("a", "*", False, id="literal-not-star"),
        pytest.param("a", "a*", False, id="literal-not-glob"),
        pytest.param("a", "?", False, id="literal-not-question"),
        pytest.param("team-*", "team-a", True, id="glob-covers-matching-literal"),
        pytest.param("team-*", "other", False, id="glob-not-non-matching-literal"),
        pytest.param("team-*", "team-*", True, id="glob-covers-itself"),
        pytest.param("team-*", "*", False, id="glob-not-star"),
        pytest.param("team-*", "team-a*", True, id="glob-covers-narrower-prefix"),
        pytest.param("team-*", "team-??", True, id="star-covers-questions"),
        pytest.param("team-*", "team*", False, id="glob-not-wider-prefix"),
        pytest.param("team-??", "team-*", False, id="questions-not-star"),
        pytest.param("team-?*", "team-*", False, id="needs-one-char-not-star"),
        pytest.param("team-?*", "team-*?", True, id="order-within-run-is-free"),
        pytest.param("?*", "*a", True, id="run-absorbs-star-then-literal"),
        pytest.param("??*", "*a*b", True, id="run-counts-literals-around-stars"),
        pytest.param("??*", "*a*", False, id="run-needs-two-chars"),
        pytest.param("*-dev-*", "eu-*-dev-*", True, id="middle-segment"),
        pytest.param("*-dev-*", "*-dev*", False, id="middle-segment-cut-short"),
        pytest.param("a*b*c", "a*bxb*c", True, id="segments-in-order"),
        pytest.param("a*b*c", "a*c*b*c", True, id="star-absorbs-other-segments"),
        pytest.param("a*c*b", "a*b*c*b", True, id="segments-matched-late"),
        pytest.param("v?", "v1", True, id="question-covers-literal"),
        pytest.param("v?", "v12", False, id="question-not-longer-literal"),
        pytest.param("v?", "v?", True, id="question-covers-question"),
        pytest.param("v1", "v?", False, id="literal-not-question-in-glob"),
    ],
)
def test_glob_covers(outer: str, inner: str, expected: bool) -> None:
    assert Glob.compile(outer).covers(Glob.compile(inner)) is expected


@settings(max_examples=600, deadline=None)
@given(outer=PATTERNS, inner=PATTERNS, data=st.data())
def test_coverage_is_sound(outer: str, inner: str, data: st.DataObject) -> None:
    """Whatever ``covers`` accepts, the outer glob matches every instance of the inner one."""
    if Glob.compile(outer).covers(Glob.compile(inner)):
        assert Glob.compile(outer).matches(instance(inner, data))


def test_coverage_agrees_with_brute_force_on_small_globs() -> None:
    """Every pair of globs of up to 3 symbols over {a, b}: covers() is exact.

    Inclusion is decided by brute force over every string of up to 6 characters over {a, b, c},
    which is long enough for globs this short (a counterexample needs at most |inner|+|outer|).
    """
    globs = ["".join(p) for n in range(4) for p in itertools.product("ab*?", repeat=n)]
    strings = ["".join(p) for n in range(7) for p in itertools.product("abc", repeat=n)]
    language = {g: frozenset(s for s in strings if reference(g, s)) for g in globs}
    compiled = {g: Glob.compile(g) for g in globs}
    wrong = [
        (outer, inner)
        for outer in globs
        for inner in globs
        if compiled[outer].covers(compiled[inner]) != (language[inner] <= language[outer])
    ]
    assert wrong == []


# --- Linear time ------------------------------------------------------------------------------

LONGEST_VALUE = 63  # label values
LONGEST_GROUP = 253  # DNS subdomain


def _hostile_globs(length: int) -> list[str]:
    """Near-miss globs of ``length`` characters, within the schema's wildcard limit and far past
    it (the matcher must not depend on the schema for its speed)."""
    half = length // 2
    shapes = [
        "*a" * MAX_WILDCARDS + "*b",  # the classic: every star can take any share of the a's
        "*a" * half + "*b",
        "*" + "a" * (length - 2) + "b",
        "*a?" * (length // 3),
        "?*" * half + "b",
        "*" + "?" * (length - 2) + "b",
        "a?" * half + "b",
        "*" + "a*" * (half - 1) + "?b",
        "*aa*aa*aa*aa*aa*aa*aa*aa*aa*aa*aa*aa*aa*aa*ab",
        "*" + "-" * (length - 2) + "*",
    ]
    return [shape[:length] for shape in shapes]


def _hostile_values(length: int) -> list[str]:
    return [
        "a" * length,
        "a" * (length - 1) + "c",
        "ab" * (length // 2) + "a",
        "a" * (length // 2) + "b" + "a" * (length // 2),
        "-" * length,
        "?" * length,
        "",
    ]


def test_worst_globs_match_the_longest_inputs_quickly() -> None:
    """Thousands of the worst matches and coverage checks finish well within a second of CPU.

    CPU time rather than wall-clock time: on a loaded machine the process waits for a core, and
    that says nothing about what a match costs.

    The regular expression these globs used to become needs over 20 s for the first pattern
    with 7 stars against 63 ``a``, and grows tenfold with each further star.
    """
    batch = [
        (Glob.compile(pattern), value)
        for length, value_length in ((LONGEST_VALUE, LONGEST_VALUE), (LONGEST_GROUP, LONGEST_GROUP))
        for pattern in _hostile_globs(length)
        for value in _hostile_values(value_length)
    ]
    globs = [glob for glob, _ in batch[:: len(_hostile_values(1))]]
    # A hostile annotation reaches the matcher through the schema and the compiled entry.
    schema_legal = "*a" * (MAX_WILDCARDS - 1) + "*b"
    permissions = parse_permissions(
        f'{{"configmaps": {{"team": ["{schema_legal}", "{"?*" * (MAX_WILDCARDS // 2)}"]}}}}'
    )
    (entry,) = permissions.entries

    started = time.process_time()
    matches = 0
    for _ in range(20):
        for glob, value in batch:
            matches += glob.matches(value)
        entry.violation({"team": "a" * LONGEST_VALUE}, allow_unlabeled=False)
    for outer in globs:
        for inner in globs:
            outer.covers(inner)
    elapsed = time.process_time() - started

    count = 20 * (len(batch) + 2) + len(globs) ** 2
    assert count > 3000
    assert elapsed < 1.0, f"{count} matches and coverage checks took {elapsed:.2f}s"
    assert matches > 0  # the batch is not all misses: the matcher did real work


def test_matching_time_grows_linearly_with_the_input() -> None:
    """A value 64 times longer costs about 64 times as much, not 64² or worse."""
    glob = Glob.compile("*a?" * MAX_WILDCARDS + "b")
    star_glob = Glob.compile("*a" * MAX_WILDCARDS + "*b")

    def cost(length: int) -> float:
        value = "a" * length
        started = time.process_time()
        for _ in range(5):
            glob.matches(value)
            star_glob.matches(value)
        return time.process_time() - started

    short, long = cost(1_000), cost(64_000)
    # Linear would be 64 times; allow generous noise, far below quadratic (4096 times).
    assert long < 64 * 8 * max(short, 1e-4)
