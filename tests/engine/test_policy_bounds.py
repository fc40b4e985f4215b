"""What requests and written objects can make the policy layer keep: bounded, whatever they are.

``Permissions.entries_for`` is asked about every resource a SubjectAccessReview names, and the
API server authorizes ``GET .../pods/web-a/<anything>`` before it routes the request, so the
resource, group and subresource are a tenant's free text. Compiled annotations and RBAC rules
come from objects a namespace admin writes and rewrites.
"""

from __future__ import annotations

import gc
import json
import random
import string
import tracemalloc
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.engine import policy, rbac
from app.engine.model import Resource
from app.engine.policy import Entry, Permissions, parse_permissions, permissions_of
from app.engine.rbac import Compiler
from tests.support import role, rule

ANNOTATION = {
    "pods": {"team": ["a"]},
    "pods/log": {"team": ["a"]},
    "deployments.apps": {"team": ["a"]},
    "*.example.com": {"team": ["a"]},
    "mwan3*": {"team": ["a"]},
    "*/status": {"team": ["a"]},
    "*": {"team": ["a", "b"]},
}


def reference(permissions: Permissions, res: Resource) -> tuple[Entry, ...]:
    """``entries_for`` by definition, without the memo."""
    ranked = [(entry.rank(res), entry) for entry in permissions.entries]
    best = max((r for r, _ in ranked), default=0)
    return tuple(e for r, e in ranked if best and r == best)


def hostile(rng: random.Random, length: int) -> str:
    return "".join(rng.choices(string.ascii_lowercase + "-./*?", k=length))


def test_made_up_resources_share_the_annotations_classes_and_keep_no_text() -> None:
    permissions = parse_permissions(json.dumps(ANNOTATION))
    rng = random.Random(7)
    for i in range(3000):
        res = Resource(
            rng.choice(["", "apps", "example.com", hostile(rng, 300)]),
            rng.choice(["pods", "deployments", "mwan3-x", f"{hostile(rng, 40)}{i}"]),
            rng.choice(["", "log", "status", f"{hostile(rng, 4096)}{i}"]),
        )
        assert permissions.entries_for(res) == reference(permissions, res), res
    memo = permissions._memo
    # Classes: 3 resource texts and "other", 2 groups and "other", 2 subresources, none and
    # "other"; the partial glob mwan3* splits "other" resources in two.
    assert 0 < len(memo) <= 5 * 3 * 4
    assert len(memo) <= policy.MEMO_BASE + policy.MEMO_PER_ENTRY * len(ANNOTATION)
    # The only texts a key holds are the annotation's own literals (and "" for no subresource).
    kept = {part for key in memo for part in key if isinstance(part, str)}
    assert kept <= {"pods", "deployments", "apps", "example.com", "log", "status", ""}, kept


def test_an_annotation_with_many_literals_bounds_its_memo_by_its_size() -> None:
    annotation = {f"r{i}": {"team": ["a"]} for i in range(200)}
    annotation.update({f"*/{sub}": {"team": ["a"]} for sub in ("status", "scale", "log", "exec")})
    permissions = parse_permissions(json.dumps(annotation))
    for i in range(200):
        for sub in ("", "status", "scale", "log", "exec", "x"):
            res = Resource("", f"r{i}", sub)
            assert permissions.entries_for(res) == reference(permissions, res)
    # 200 resources by 6 subresource classes: more classes than the memo keeps.
    limit = policy.MEMO_BASE + policy.MEMO_PER_ENTRY * len(annotation)
    assert limit < 200 * 6 and len(permissions._memo) == limit
    # The oldest classes went first: the newest are still answered from the memo.
    other = policy._OTHER
    assert ("r199", other, other) in permissions._memo
    assert ("r0", other, "") not in permissions._memo


# Annotations from literals, partial globs and ``*`` over a small alphabet, so that requests
# meet them; requests from the same alphabet plus texts no annotation names.
PARTS = st.sampled_from(["a", "b", "ab", "a*", "*b", "?", "*", "a?b*"])
PATTERN = st.tuples(PARTS, st.none() | PARTS, st.none() | PARTS).map(
    lambda t: t[0] + (f".{t[1]}" if t[1] else "") + (f"/{t[2]}" if t[2] else "")
)
ANNOTATIONS = st.dictionaries(PATTERN, st.just({"team": ["a"]}), min_size=1, max_size=6)
TEXT = st.sampled_from(["", "a", "b", "ab", "abb", "ba", "x" * 70]) | st.text("ab", max_size=4)
RESOURCES = st.builds(Resource, TEXT, TEXT.filter(bool), TEXT)


@given(ANNOTATIONS, st.lists(RESOURCES, min_size=1, max_size=20), st.lists(RESOURCES, max_size=60))
def test_the_answer_is_the_same_with_the_memo_cold_or_full(
    annotation: dict[str, Any], asked: list[Resource], before: list[Resource]
) -> None:
    text = json.dumps(annotation)
    cold = parse_permissions(text)
    full = parse_permissions(text)
    for res in before * 3:  # fills the memo, past its bound for the smaller annotations
        full.entries_for(res)
    for res in asked:
        expected = reference(cold, res)
        assert cold.entries_for(res) == expected
        assert cold.entries_for(res) == expected  # now from the memo
        assert full.entries_for(res) == expected
    assert len(full._memo) <= policy.MEMO_BASE + policy.MEMO_PER_ENTRY * len(annotation)


def test_compiled_annotations_are_bounded_in_total_text() -> None:
    """A role rewritten with ever new annotations: the cache keeps at most its budget."""
    keys = ("labelrbac.io/permissions",)
    # About 5 KiB per annotation: 80 globs of 61 characters under two label keys.
    values = ",".join(f'"{i:02d}{"v" * 58}"' for i in range(40))
    gc.collect()
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        for i in range(500):  # 2.5 MB of distinct annotations
            raw = f'{{"r{i}": {{"team": [{values}], "env": [{values}]}}}}'
            found = permissions_of({keys[0]: raw}, keys, None)
            assert found is not None and found.entries[0].pattern == f"r{i}"
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert policy._cache_chars <= policy._CACHE_TEXTS
    assert sum(len(raw) for raw, _, _ in policy._cache) == policy._cache_chars
    assert len(policy._cache) < 250
    # The compiled forms of the last megabyte of text at most, not of all 2.5 MB.
    assert grown < 6 * policy._CACHE_TEXTS, grown  # 10 MB when every text is kept


def test_interned_rules_leave_with_the_last_role_using_them() -> None:
    compiler = Compiler(("labelrbac.io/permissions",))
    gc.collect()
    before = len(rbac._rules)
    names = " ".join(f"name-{i:05d}" for i in range(2000))  # a long resourceNames list
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        for i in range(300):  # one Role rewritten 300 times with ever new rules
            _, obj = role("r", "t1", [rule("get", "configmaps", names=f"{names} n{i}")])
            compiled = compiler.role(obj)
            assert len(compiled.rules[0].names) == 2001
        shared = compiler.role(role("s", "t1", [rule("get", "configmaps")])[1])
        again = compiler.role(role("t", "t2", [rule("get", "configmaps")])[1])
        assert again.rules[0] is shared.rules[0]  # equal rules still share one object
        del compiled
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert len(rbac._rules) <= before + 1  # the shared rule, held by the roles above
    assert grown < 1_000_000, grown  # all 300 rules of 2,001 names: tens of MB


def _globs(n: int, prefix: str = "v") -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


@pytest.mark.parametrize(
    ("annotation", "error"),
    [
        pytest.param({"configmaps": {"team": _globs(64)}}, None, id="most-for-one-key"),
        pytest.param(
            {f"r{i}": {"team": _globs(64)} for i in range(4)}, None, id="most-for-one-role"
        ),
        pytest.param(
            {"configmaps": {"team": _globs(65)}},
            "schema violation at configmaps/team: 65 value globs, over the limit of 64 for one "
            "label key; write one glob for a family of values (team-*) or split the role",
            id="one-key-over",
        ),
        pytest.param(
            {"configmaps": _globs(5000)},
            "schema violation at configmaps: 5000 value globs, over the limit of 64 for one "
            "label key; write one glob for a family of values (team-*) or split the role",
            id="shorthand-over",
        ),
        pytest.param(
            {"configmaps": {"team": _globs(64), "env": _globs(64), "tier": _globs(64)},
             "secrets": {"team": _globs(64), "env": ["x"]}},
            "257 value globs in all, over the limit of 256 per role; write one glob for a "
            "family of values (team-*) or split the role",
            id="role-over",
        ),
    ],
)  # fmt: skip
def test_value_globs_are_bounded_per_key_and_per_role(
    annotation: dict[str, Any], error: str | None
) -> None:
    """Every glob is a test run on each write carrying its label, by the webhook and by the
    compiled policy: a role bound to others must not make their writes cost without bound."""
    raw = json.dumps(annotation)
    if error is None:
        parse_permissions(raw, default_label_key="team")
        return
    with pytest.raises(policy.AnnotationError) as caught:
        parse_permissions(raw, default_label_key="team")
    assert str(caught.value) == error
    # A role carrying it is void (grants nothing through the webhook), as for any invalid
    # annotation, and the message never quotes the globs.
    _, obj = role("heavy", "t1", [rule("*", "configmaps")], annotation)
    compiled = Compiler(("labelrbac.io/permissions",), "team").role(obj)
    assert compiled.error == f"invalid labelrbac.io/permissions annotation: {error}"
    assert "v17" not in compiled.error
