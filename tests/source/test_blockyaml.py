"""The line reader of block-style YAML builds what PyYAML's safe loader builds, or leaves the text.

Every text is read both ways. Where the line reader reads it, PyYAML must load it without error
and its documents must be the same (compared by ``repr``: order, types, ``-0.0``); where it
leaves it, ``load_all`` must still give what PyYAML gives (documents or the same error). Tables
name YAML's corners; the tests that matter for speed also check that the reader did read the text
(kubectl's, helm's and PyYAML's block style, the recorded API objects, the scale benchmark's
files), so that leaving everything to PyYAML could not pass them.
"""

from __future__ import annotations

import datetime
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.source import blockyaml
from app.source.static import ManifestError, read_manifests
from app.source.yamlload import LOADER, describe_error, load_all
from bench.core.layout import write_dir
from tests.source.test_yamlload import assert_same, outcome
from tests.support import API, FIXTURES, RECENT, ROOT


def read(text: str) -> list[Any] | None:
    """The line reader's documents, or None where it leaves the text to PyYAML."""
    try:
        return list(blockyaml.documents(text))
    except blockyaml.Unread:
        return None


def check(text: str) -> bool:
    """Assert the reader builds what PyYAML builds or leaves the text; whether it read it."""
    got = read(text)
    if got is not None:
        expected = outcome(lambda t: yaml.load_all(t, Loader=LOADER), text)
        assert expected[0] == "ok", (text[:300], expected)
        try:
            assert repr(got) == repr(expected[1]), text[:300]
        except RecursionError:  # nested deeper than repr goes: compared with room to recurse
            limit = sys.getrecursionlimit()
            sys.setrecursionlimit(50_000)
            try:
                assert got == expected[1], text[:300]
            finally:
                sys.setrecursionlimit(limit)
    assert_same(text)
    return got is not None


# Plain scalars as YAML 1.1 types them (PyYAML's resolvers), each read in the three places a
# scalar goes: a mapping value, a sequence item and (where it is a string) a key.
READ_SCALARS = [
    pytest.param(text, id=text)
    for text in [
        "yes", "No", "ON", "off", "y", "n", "true", "False",  # booleans, and y/n that are not
        "0755", "0o17", "0x1F", "0b101", "1_000", "-0", "+12", "1:20", "190:20:30",  # ints
        "1.5", ".5", "1e3", "1.0e+3", "6.8523015e+5", ".inf", "-.Inf", ".NaN", "1:20.5",  # floats
        "~", "null", "Null", "NULL",
        "2001-12-14", "2001-12-14t21:59:43.10-05:00", "2001-12-14 21:59:43.10 -5",  # timestamps
        "2002-1-1", "2026-11-22T06:09:26Z",
        "a#b", "x:y", "http://example.com/a?b=c#d", "-1x", "a, b", "a[0]", "a{b}", "it's",
        "1.2.3", "f:metadata", ".", "a  b", "caf\u00e9", "\u00e9t\u00e9", "---x", "...x",
        "system:serviceaccount:kube-system:default", "a*", "a&b!c",
    ]
]  # fmt: skip


@pytest.mark.parametrize("scalar", READ_SCALARS)
def test_plain_scalars_are_typed_as_pyyaml_types_them(scalar: str) -> None:
    assert check(f"a: {scalar}\n")
    assert check(f"- {scalar}\n")
    assert check(f"a: {scalar}   # a comment\nb: 1\n")
    key = next(iter(yaml.load(f"{scalar}: 1", Loader=LOADER)))
    # a line starting with ``---`` or ``...`` is left, even where it is not a marker
    assert check(f"{scalar}: 1\n") == (isinstance(key, str) and scalar[:3] not in ("---", "..."))


# Texts PyYAML gives another meaning to, or rejects: the reader leaves them all.
LEFT = [
    pytest.param("a: =\n", id="value-tag"),
    pytest.param("a: <<\n", id="merge-as-value"),
    pytest.param("a:\n  <<: {x: 1}\n", id="merge-key"),
    pytest.param("yes: 1\n", id="boolean-key"),
    pytest.param("1: a\n", id="integer-key"),
    pytest.param("null: a\n", id="null-key"),
    pytest.param("a: &x 1\nb: *x\n", id="anchor-alias"),
    pytest.param("a: !!str 1\n", id="tag"),
    pytest.param("a: !custom 1\n", id="unknown-tag"),
    pytest.param("a: [[1], 2]\n", id="nested-flow-sequence"),
    pytest.param("a: [a: 1]\n", id="flow-pair"),
    pytest.param("a: [a, ]\n", id="flow-trailing-comma"),
    pytest.param("a: [a\n  , b]\n", id="flow-over-lines"),
    pytest.param("a: ['a,b']\n", id="flow-quoted-comma"),
    pytest.param("a: [*x]\n", id="flow-alias"),
    pytest.param("a: {b: 1}\n", id="flow-mapping"),
    pytest.param("a: >\n  folded\n", id="folded-scalar"),
    pytest.param("a: |2\n   x\n", id="indentation-indicator"),
    pytest.param("a: |\n\n  x\n", id="literal-starting-blank"),
    pytest.param('a: "x\\ny"\n', id="escapes"),
    pytest.param("a: b\n  c\n", id="plain-over-lines"),
    pytest.param("? a\n: b\n", id="complex-key"),
    pytest.param("- - a\n", id="sequence-in-sequence"),
    pytest.param("%YAML 1.1\n---\na: 1\n", id="directive"),
    pytest.param("--- a: 1\n", id="content-after-marker"),
    pytest.param("a: 1\n...\n", id="document-end"),
    pytest.param("a: 1", id="no-final-line-break"),
    pytest.param("a: 1\r\nb: 2\r\n", id="crlf"),
    pytest.param("a:\n\tb: 1\n", id="tab"),
    pytest.param("\ufeffa: 1\n", id="byte-order-mark"),
    pytest.param("a: b\u2028c\n", id="line-separator"),
    pytest.param("a: b\x85c\n", id="next-line"),
    pytest.param("a: b\x07\n", id="control-character"),
    pytest.param("just a scalar\n", id="scalar-document"),
    pytest.param("  a: 1\n", id="indented-document"),
    pytest.param("a: 1\n b: 2\n", id="bad-indentation"),
    pytest.param("a: b: c\n", id="mapping-in-plain"),
    pytest.param("a: x:\n", id="colon-at-end"),
    pytest.param("a: -\n", id="dash-value"),
    pytest.param("a: - b\n", id="item-as-value"),
    pytest.param("a: 1\n- b\n", id="item-after-mapping"),
    pytest.param("- a\nb: 1\n", id="key-after-sequence"),
    pytest.param("a:\n  - x\n  b: 1\n", id="key-at-sequence-column"),
    pytest.param("a: 'x\n", id="unclosed-quote"),
    pytest.param("a: 'x'y\n", id="after-closing-quote"),
    pytest.param("a: 'x'#c\n", id="comment-not-after-space"),
    pytest.param("'a':b\n", id="quoted-key-without-space"),
    pytest.param("a: 'x\nb: 1\n", id="continuation-at-key-column"),
    pytest.param("a #b: c\n", id="comment-in-key"),
    pytest.param("a : b\n", id="space-before-colon"),
    pytest.param("k" * 1100 + ": v\n", id="long-key"),
    pytest.param("a: @b\n", id="reserved-indicator"),
    pytest.param("a: *.example.com\n", id="alias-like"),
    pytest.param("a: `b`\n", id="backquote"),
    pytest.param("a: %b\n", id="percent"),
    pytest.param("a: ? b\n", id="question-mark"),
    pytest.param("a: :b\n", id="colon-start"),
    pytest.param("-a\n-\tb\n", id="dash-without-space"),
    pytest.param("a: 2001-02-30\n", id="impossible-date"),
    pytest.param("- 0x_\n", id="digitless-hex"),
    pytest.param("a: 0b_\nb: c\n  d: e\n", id="bad-integer-then-parse-error"),
    pytest.param("a: [1, 2001-13-01]\n", id="impossible-date-in-flow"),
    pytest.param("a: 0000-01-01\n", id="year-zero"),
    pytest.param("a: 2001-12-14 21:59:43.10 +25\n", id="impossible-offset"),
    pytest.param("a: " + "1" * 5000 + "\n", id="integer-beyond-pythons-limit"),
]


@pytest.mark.parametrize("text", LEFT)
def test_other_shapes_are_left_to_pyyaml(text: str) -> None:
    assert not check(text)


READ = [
    pytest.param("a: 1\nb:\n  c: x\n  d:\n  - 1\n  - 2\ne: z\n", id="nested"),
    pytest.param("a:\n    - x\n    - y\nb: 1\n", id="indented-sequence"),
    pytest.param("a:\n- b: 1\n  c: 2\n- d: 3\n", id="indentless-sequence-of-mappings"),
    pytest.param("-   a: 1\n    b: 2\n-  c: 3\n", id="items-with-wide-dashes"),
    pytest.param("- a:\n  - x\n  b: 1\n", id="indentless-in-compact-mapping"),
    pytest.param("a:\n-\n- x\n-   # c\n  y\nb:\n", id="empty-items"),
    pytest.param("a:\nb:   # c\nc: ''\nd: \"\"\n", id="empty-values"),
    pytest.param("a: []\nb: {}   # c\nc:\n- []\n- {}\n", id="empty-flow"),
    pytest.param("a: [get, list, '', \"*\", yes, 0755]  # c\nb: [ x ]\n", id="flow-sequence"),
    pytest.param("a:\n  b\n", id="scalar-on-its-own-line"),
    pytest.param("a:\n  'b\n   c'\n", id="quoted-on-its-own-line"),
    pytest.param("'a': 1\n\"b c\": 2\n'it''s': 3\n'#x': 4\n'a: b': 5\n", id="quoted-keys"),
    pytest.param("a: 'it''s'\nb: '#x # y'\nc: 'x: y'\nd: \"q'\"\ne: '  '\n", id="quoted"),
    pytest.param("a: 'x\n  y'\nb: \"p\n\n\n   q  \"\n", id="quoted-folded"),
    pytest.param("a: 'x   \n     y  '  # c\n", id="quoted-folded-spaces"),
    pytest.param("- 'x\n\n  y'\n- z\n", id="quoted-folded-item"),
    pytest.param("a: |\n  x\n   y\n\n  z\n\n\nb: 1\n", id="literal-clip"),
    pytest.param("a: |-\n  x\n  # not a comment\nb: 1\n", id="literal-strip"),
    pytest.param("a: |+\n  x\n\n\nb: 1\n", id="literal-keep"),
    pytest.param("a: |+\n  x\n\n", id="literal-keep-at-end"),
    pytest.param("a: |\n    x\n  # c\nb: 1\n", id="literal-then-comment"),
    pytest.param("a: |\n  x\n    \n  y\n", id="literal-spaces-line"),
    pytest.param("- |\n  x\n- y\n", id="literal-item"),
    pytest.param("a: 1\na: 2\nb: 3\na: 4\n", id="duplicate-keys"),
    pytest.param("# c\n\n---\n# d\na: 1\n---\n---\n- x\n---\n", id="documents"),
    pytest.param("---\n", id="one-empty-document"),
    pytest.param("# only a comment\n\n", id="no-document"),
    pytest.param("", id="empty"),
    pytest.param("a:\n  b:\n    c:\n      d: 1\n  e: 2\nf: 3\n", id="closing-levels"),
    pytest.param("a:\n  -\n    b: 1\n", id="mapping-under-empty-item"),
    pytest.param("a: ---\nb: ...\nc:\n- ---\n", id="markers-as-values"),
    pytest.param("".join(" " * i + "a:\n" for i in range(3000)), id="deep-mappings"),
    pytest.param(
        "".join(" " * i + "-\n" for i in range(3000)) + " " * 3000 + "x\n", id="deep-items"
    ),
]


@pytest.mark.parametrize("text", READ)
def test_block_style_is_read(text: str) -> None:
    assert check(text)


def test_every_document_before_the_first_unread_one_is_given_once() -> None:
    text = "a: 1\n---\nb: 2\n---\nc: &x 3\nd: *x\n"
    assert list(load_all(text)) == [{"a": 1}, {"b": 2}, {"c": 3, "d": 3}]
    documents = load_all("a: 1\n---\nb: [\n")
    assert next(documents) == {"a": 1}
    with pytest.raises(yaml.YAMLError):
        next(documents)


class _Literal(yaml.SafeDumper):
    """PyYAML's dumper writing strings over lines as literal block scalars, as kubectl does."""


_Literal.add_representer(
    str,
    lambda dumper, data: dumper.represent_scalar(
        "tag:yaml.org,2002:str", data, style="|" if "\n" in data else None
    ),
)


def _recorded_objects() -> list[tuple[str, Any]]:
    objects = []
    for folder in (API, RECENT / "api", FIXTURES / "admission-reviews"):
        for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
            body = json.loads(path.read_text())
            objects.append((path.name, body))
    return objects


def test_recorded_rbac_lists_as_yaml_are_read() -> None:
    lists = [(name, body) for name, body in _recorded_objects() if name.startswith("list-")]
    assert len(lists) >= 5
    for name, body in lists:
        for dump in (yaml.safe_dump, lambda d: yaml.dump(d, Dumper=_Literal)):
            text = dump(body)
            assert check(text), name
            assert check(yaml.safe_dump_all(body["items"], indent=4)), name


def test_every_recorded_object_as_yaml_loads_the_same() -> None:
    objects = _recorded_objects()
    assert len(objects) > 20
    for _, body in objects:
        for options in ({}, {"width": 40}, {"indent": 3}, {"allow_unicode": True}):
            check(yaml.safe_dump(body, **options))
        check(yaml.dump(body, Dumper=_Literal))


def test_the_scale_files_are_read(tmp_path: Path) -> None:
    write_dir(tmp_path, 600, per_file=20)
    for path in sorted(tmp_path.glob("*.yaml")):
        assert check(path.read_text())


def test_the_repositorys_yaml_loads_the_same() -> None:
    # A chart's templates are Go templates that render YAML, not YAML.
    files = sorted(
        p
        for p in ROOT.rglob("*.y*ml")
        if not {".venv", ".cache", "templates"} & set(p.relative_to(ROOT).parts)
    )
    assert len(files) > 10
    assert sum(check(path.read_text()) for path in files) > len(files) // 2


KUBECTL = """\
apiVersion: v1
items:
- apiVersion: rbac.authorization.k8s.io/v1
  kind: ClusterRole
  metadata:
    annotations:
      kubectl.kubernetes.io/last-applied-configuration: |
        {"apiVersion":"rbac.authorization.k8s.io/v1","kind":"ClusterRole","metadata":{"annotations":{},"name":"x"}}
      labelrbac.io/permissions: '{"configmaps": {"team": ["a"]}}'
    creationTimestamp: "2026-11-22T06:09:26Z"
    labels:
      app.kubernetes.io/managed-by: Helm
    name: x
    resourceVersion: "1234"
    uid: 26738e94-505c-4126-8fc1-0c7943bc9974
  rules:
  - apiGroups:
    - ""
    resources:
    - configmaps
    verbs:
    - '*'
kind: List
metadata:
  resourceVersion: ""
"""


def test_kubectl_output_is_read() -> None:
    assert check(KUBECTL)
    assert check(KUBECTL.replace("\n  ", "\n    ").replace("\n- ", "\n  - "))


# Text made line by line from pieces YAML gives meaning to: mostly malformed or odd.
PIECES = st.sampled_from(
    [
        "a", "b", "yes", "0755", "1:20", "~", "", "'q'", "'q''r'", '"d"', '"e\\n"', "'x", "y'",
        "[]", "{}", "[a]", "|", "|-", "|+", ">", "&a", "*a", "!t", "<<", "=", "#", " #c", "-",
        "- ", ":", ": ", "?", "---", "...", "2001-12-14", "1e3", "%", "@", "x:y", "a b", ",",
    ]
)  # fmt: skip
LINES = st.lists(
    st.tuples(st.integers(0, 5), st.lists(PIECES, max_size=5)).map(
        lambda line: " " * line[0] + "".join(line[1])
    ),
    max_size=12,
)


# Lines of block style with random indentation: keys, items, scalars, comments, continuations.
WORDS = ["a", "b", "'q'", '"d e"', "'it''s'", "f:x", "yes", "1", "x y", "a#b", "-1", "~"]
VALUES = [
    *WORDS, "0755", "1:20", "2001-12-14", "1.5", ".inf", "''", "'x", "y'", '"p', 'q"', "|", "|-",
    "|+", "[]", "{}", "[a, 'b', \"c\", 1]", "[a b]", "x: y", "-", "'a' b", "'a' # c", "'#'",
]  # fmt: skip
BLOCK_LINES = st.lists(
    st.tuples(
        st.sampled_from([0, 0, 1, 2, 2, 3, 4, 4, 6]),
        st.sampled_from(["", "", "- ", "-   ", "-"]),
        st.sampled_from(["key", "key", "empty", "value", "comment", "blank", "---"]),
        st.sampled_from(WORDS),
        st.sampled_from(VALUES),
        st.sampled_from(["", "", " # c", "  #: d", "   "]),
    ).map(
        lambda p: {
            "key": f"{' ' * p[0]}{p[1]}{p[3]}: {p[4]}{p[5]}",
            "empty": f"{' ' * p[0]}{p[1]}{p[3]}:{p[5]}",
            "value": f"{' ' * p[0]}{p[1]}{p[4]}{p[5]}",
            "comment": f"{' ' * p[0]}# {p[4]}",
            "blank": " " * p[0],
            "---": "---",
        }[p[2]]
    ),
    max_size=14,
)


@settings(max_examples=1500, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.one_of(LINES, BLOCK_LINES))
def test_text_made_of_pieces_is_read_as_pyyaml_reads_it(lines: list[str]) -> None:
    check("".join(line + "\n" for line in lines))


# Text as manifests hold it: printable, with the characters YAML reads specially.
CHARACTERS = st.sampled_from("ab yZ09-_./:#'\"*&!|>{}[],?%@`~=<\u00e9\u4e2d")
TEXT = st.text(CHARACTERS, max_size=12)
NAMES = st.text(CHARACTERS, min_size=1, max_size=12)  # PyYAML writes '' keys as complex keys
KEYS = st.one_of(
    TEXT,
    st.text(max_size=8),
    st.sampled_from(["yes", "no", "null", "~", "1", "1:20", "<<", "=", "a b", "a#b", "f:x", "."]),
    st.integers(),
)
SCALARS = st.one_of(
    KEYS,
    st.none(),
    st.booleans(),
    st.floats(allow_nan=False),
    st.dates(),
    st.datetimes(timezones=st.just(datetime.UTC)),
    st.text(st.characters(codec="utf-8"), max_size=30),
    TEXT,
    TEXT.map(lambda s: s.replace("Z", "\n")),
    st.sampled_from(["", " x", "x ", "a\nb", "a\n\nb\n", "'", '"', "#", "a: b", "- a", "0755"]),
)
DATA = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(KEYS, inner, max_size=4)),
    max_leaves=20,
)
# Documents shaped like manifests: mappings of string keys down to strings, numbers, booleans.
MANIFESTS = st.dictionaries(
    NAMES,
    st.recursive(
        st.one_of(TEXT, st.integers(), st.booleans(), st.none(), st.sampled_from(["yes", "0755"])),
        lambda inner: st.one_of(
            st.lists(inner, max_size=4), st.dictionaries(NAMES, inner, max_size=4)
        ),
        max_leaves=20,
    ),
    min_size=1,
    max_size=5,
)
Edit = Callable[[list[str]], list[str]]
EDITS: list[Edit] = [
    lambda lines: lines,
    lambda lines: [line + "  # c" if line.strip() else line for line in lines],
    lambda lines: [f"{' ' * (len(line) - len(line.lstrip()))}# c\n{line}" for line in lines],
    lambda lines: [line.replace(" ", "  ", 1) for line in lines],
    lambda lines: [*lines[:1], "", *lines[1:]],
]


@settings(max_examples=600, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    st.lists(st.one_of(DATA, MANIFESTS, MANIFESTS), min_size=1, max_size=3),
    st.fixed_dictionaries(
        {
            "default_flow_style": st.sampled_from([False, None]),
            "indent": st.integers(2, 5),
            "width": st.sampled_from([20, 80, 10_000]),
            "allow_unicode": st.booleans(),
            "explicit_start": st.booleans(),
            "sort_keys": st.booleans(),
        }
    ),
    st.booleans(),
    st.sampled_from(range(len(EDITS))),
    st.one_of(st.none(), st.tuples(st.integers(0, 10_000), st.sampled_from("&*!:-[]{}?#|>'\" \n"))),
)
def test_dumped_documents_are_read_as_pyyaml_reads_them(
    documents: list[Any],
    options: dict[str, Any],
    literal: bool,
    edit: int,
    change: tuple[int, str] | None,
) -> None:
    text = yaml.dump_all(documents, Dumper=_Literal if literal else yaml.SafeDumper, **options)
    text = "\n".join(EDITS[edit](text.split("\n")))
    if change is not None:  # one character replaced: often no longer valid YAML
        at = change[0] % len(text)
        text = text[:at] + change[1] + text[at + 1 :]
    check(text)


def test_long_lines_are_read_as_pyyaml_reads_them() -> None:
    for text in ("a: " + "x " * 200_000 + "\n", "- '" + "''" * 200_000 + "'\n",
                 "a: 'x\n" + "  y\n" * 50_000 + "  '\n", "a:" * 100_000 + "\n"):  # fmt: skip
        check(text)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("kind: Role\n---\nkind: Role\nrules:\n- verbs: [get\n", id="unclosed-flow"),
        pytest.param("kind: Role\n---\nkind: Role\n  name: x\n", id="bad-indentation"),
        pytest.param("kind: Role\nrules:\n- verbs:\n  - get\n  x: 'y\n", id="unclosed-quote"),
    ],
)
def test_a_malformed_file_fails_with_pyyamls_message(tmp_path: Path, text: str) -> None:
    path = tmp_path / "rbac.yaml"
    path.write_text(text)
    with pytest.raises(yaml.YAMLError) as expected:
        list(yaml.load_all(text, Loader=LOADER))
    with pytest.raises(ManifestError) as got:
        read_manifests(tmp_path)
    # The same error (problem, context and their marks), told on one line.
    assert str(got.value) == f"{path}: {describe_error(expected.value)}"
