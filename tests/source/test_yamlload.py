"""The faster YAML loader builds what PyYAML's safe loader builds, and fails where it fails.

Every text is loaded both ways and compared: the same documents (equal, in order), or the same
error (type and message). Texts are the repository's manifests, the scale benchmark's generated
files, a table of YAML's corners, and generated documents dumped in several styles, some with a
character changed so that they no longer parse or build.
"""

from __future__ import annotations

import datetime
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.source.yamlload import LOADER, load_all
from bench.core.layout import write_dir
from tests.support import ROOT


def outcome(load: Any, text: str) -> tuple[str, Any]:
    """("ok", documents) or ("error", (type, message))."""
    try:
        return "ok", list(load(text))
    except Exception as exc:  # PyYAML raises ValueError too (e.g. for !!int x)
        return "error", (type(exc).__name__, str(exc))


def pyyaml(text: str) -> Any:
    return yaml.load_all(text, Loader=LOADER)


def assert_same(text: str) -> None:
    expected, got = outcome(pyyaml, text), outcome(load_all, text)
    try:  # repr tells apart what == does not (order, -0.0) and copes with recursive aliases
        assert repr(got) == repr(expected), text[:300]
    except RecursionError:  # nested deeper than repr goes: compared with room to recurse
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(20_000)
        try:
            assert got == expected, text[:300]
        finally:
            sys.setrecursionlimit(limit)


def test_the_repositorys_yaml_loads_the_same() -> None:
    files = sorted(p for p in (ROOT / "manifests").rglob("*") if p.suffix in (".yaml", ".yml"))
    files += sorted(p for p in (ROOT / "tests").rglob("*") if p.suffix in (".yaml", ".yml"))
    assert len(files) > 10
    for path in files:
        assert_same(path.read_text())


def test_the_generated_scale_files_load_the_same(tmp_path: Path) -> None:
    write_dir(tmp_path, 600, per_file=20)
    for path in sorted(tmp_path.glob("*.yaml")):
        assert_same(path.read_text())


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("a: 1\nb: 0x1f\nc: 0o17\nd: 017\ne: 1_000\nf: 1:20\n", id="ints"),
        pytest.param("a: 1.5\nb: .inf\nc: -.Inf\nd: 1e3\ne: 6.8523015e+5\n", id="floats"),
        pytest.param("a: yes\nb: No\nc: on\nd: OFF\ne: true\nf: 'yes'\n", id="booleans"),
        pytest.param("a: ~\nb: null\nc:\nd: Null\n", id="nulls"),
        pytest.param("a: 2001-12-14\nb: 2001-12-14t21:59:43.10-05:00\n", id="timestamps"),
        pytest.param("base: &b {x: 1}\nderived:\n  <<: *b\n  y: 2\n", id="merge-with-anchor"),
        pytest.param("a:\n  <<: {x: 1}\n  y: 2\n", id="merge-inline"),
        pytest.param("a:\n  <<: [{x: 1}, {z: 3}]\n", id="merge-list"),
        pytest.param("a: &x [1, 2]\nb: *x\n", id="alias"),
        pytest.param("a: *nowhere\n", id="undefined-alias"),
        pytest.param("a: &x [*x]\n", id="recursive-alias"),
        pytest.param("=: a\nb: c\n", id="value-key"),
        pytest.param("a: =\n", id="value-scalar"),
        pytest.param("1: a\n2.5: b\nnull: c\ntrue: d\n", id="non-string-keys"),
        pytest.param("? [a, b]\n: c\n", id="sequence-key"),
        pytest.param("? {a: b}\n: c\n", id="mapping-key"),
        pytest.param("a: 1\na: 2\n", id="duplicate-key"),
        pytest.param("a: !!str 1\nb: !!int '7'\nc: !!float '1'\n", id="explicit-scalar-tags"),
        pytest.param("a: !!binary aGVsbG8=\n", id="binary"),
        pytest.param("a: !!set {x, y}\nb: !!omap [x: 1]\nc: !!pairs [x: 1]\n", id="set-omap"),
        pytest.param("a: !!map {x: 1}\nb: !!seq [1]\n", id="explicit-collection-tags"),
        pytest.param("a: ! 12\nb: ! [1]\n", id="non-specific-tag"),
        pytest.param("a: !custom x\n", id="unknown-tag"),
        pytest.param("- !!python/object:os.system ls\n", id="python-tag"),
        pytest.param("a: !!int x\n", id="bad-int"),
        pytest.param("a: !!map [1]\n", id="map-tag-on-sequence"),
        pytest.param("%YAML 1.1\n%TAG !e! tag:example.com,2000:\n---\na: !e!x b\n", id="dirs"),
        pytest.param("", id="empty"),
        pytest.param("---\n---\na: b\n...\n---\n", id="empty-documents"),
        pytest.param("- a\n- [b, {c: d}]\n- {e: [f]}\n", id="nested-flow"),
        pytest.param("a: |\n  line\n  two\nb: >\n  folded\n  text\n", id="block-scalars"),
        pytest.param("a: 'quoted ''x'''\nb: \"\\u00e9\\n\"\n", id="quoted"),
        pytest.param("kind: Role\nmetadata: {name: [\n", id="unclosed-flow"),
        pytest.param("a: b\n  c: d\n", id="bad-indentation"),
        pytest.param("a: 1\n- b\n", id="mapping-then-sequence"),
        pytest.param("a: b\n\tc: d\n", id="tab"),
        pytest.param("a: 1\n---\nb: [\n", id="error-in-second-document"),
        pytest.param("[" * 3000 + "]" * 3000, id="deep-sequence"),
        pytest.param("{a: " * 3000 + "b" + "}" * 3000, id="deep-mapping"),
    ],
)
def test_yaml_corners_load_the_same(text: str) -> None:
    assert_same(text)


def test_an_error_after_good_documents_comes_after_them() -> None:
    documents = load_all("a: 1\n---\nb: 2\n---\nc: [\n")
    assert next(documents) == {"a": 1}
    assert next(documents) == {"b": 2}
    with pytest.raises(yaml.YAMLError):
        next(documents)


KEYS = st.one_of(
    st.text(max_size=8),
    st.sampled_from(["yes", "no", "on", "null", "~", "1", "0x10", "1:20", "<<", "=", "2001-01-01"]),
    st.integers(),
    st.booleans(),
)
SCALARS = st.one_of(
    KEYS,
    st.none(),
    st.floats(allow_nan=False),
    st.dates(),
    st.datetimes(timezones=st.just(datetime.UTC)),
    st.binary(max_size=8),
)
# Characters YAML gives a meaning to.
CHANGES = "&*!<=:-[]{}?#|>'\"\t\n "
DATA = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(KEYS, inner, max_size=4)),
    max_leaves=16,
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(DATA, min_size=1, max_size=3),
    st.sampled_from([None, True, False]),
    st.booleans(),
    st.one_of(st.none(), st.tuples(st.integers(0, 10_000), st.sampled_from(CHANGES))),
)
def test_generated_documents_load_the_same(
    documents: list[Any], flow: bool | None, canonical: bool, change: tuple[int, str] | None
) -> None:
    text = yaml.safe_dump_all(documents, default_flow_style=flow, canonical=canonical)
    if change is not None:  # one character replaced: often no longer valid YAML
        at = change[0] % len(text)
        text = text[:at] + change[1] + text[at + 1 :]
    assert_same(text)
