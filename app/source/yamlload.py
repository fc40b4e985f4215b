"""YAML documents exactly as PyYAML's safe loader builds them, up to ten times faster.

Loading a large RBAC directory is mostly YAML. Block-style text (what kubectl, helm and PyYAML
write) is read line by line (``blockyaml``, about four times faster than what follows). Any other
text goes through libyaml, from its start; documents the line reader gave before it met something
of another shape are not given twice.

libyaml parses quickly, but PyYAML then builds every value through its generic constructor (a
generator per collection, a constructor lookup and an identity cache per node) and asks its
resolver about every node through a general path. For
the documents manifests are made of — mappings with string keys, sequences, strings, numbers,
booleans and nulls, no anchors — the same values come out of a direct walk of the composed nodes:

- the resolver is PyYAML's own table of implicit resolvers (``SafeLoader``), read without the
  path resolvers and wildcard resolvers the safe loader does not have (checked at import: the
  general resolver is kept if it ever has them), so every node gets the tag it gets today;
- a string node is its text, a mapping a dict in document order (a repeated key keeps its last
  value), a sequence a list, null/bool/int/float nodes go through the safe constructor's own
  functions for their tag;
- anything else (another tag, a key that is not a string, merge keys, a document nested deeper
  than the walk recurses) builds that document with PyYAML's constructor from the same nodes,
  and a text with anchors (whose aliases share one object) is loaded by PyYAML whole.

Parse errors come from the same parser, construction errors from the same constructor, so a
malformed file fails with the message it failed with before (tests/source/test_yamlload.py).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from app.source import blockyaml
from app.source.blockyaml import LOADER, SIMPLE_RESOLVER, TAG, implicit_tag

STR, MAP, SEQ = TAG + "str", TAG + "map", TAG + "seq"
# Scalar tags built by the safe constructor's function for that tag (each reads only the node).
_SCALARS = tuple(TAG + t for t in ("null", "bool", "int", "float"))


class _Unusual(Exception):
    """A node the direct walk does not build: PyYAML's constructor builds the document."""


class _Loader(LOADER):  # type: ignore[valid-type,misc]
    """``LOADER`` with the resolver of the safe loader's tables, read directly."""

    if SIMPLE_RESOLVER:  # else the general resolver

        def resolve(self, kind: type[Node], value: Any, implicit: tuple[bool, bool]) -> str:
            # BaseResolver.resolve with no path resolvers and no wildcard implicit resolvers.
            if kind is ScalarNode:
                return (implicit[0] and implicit_tag(value)) or STR
            return SEQ if kind is SequenceNode else MAP

        def descend_resolver(self, current_node: Any, current_index: Any) -> None:
            pass  # only path resolvers need the path

        def ascend_resolver(self) -> None:
            pass


def _builder(loader: yaml.SafeLoader) -> Callable[[Node], Any]:
    scalars: dict[str, Callable[[Any, Node], Any]] = {
        tag: loader.yaml_constructors[tag] for tag in _SCALARS
    }

    def build(node: Node) -> Any:
        tag = node.tag
        if tag == STR and type(node) is ScalarNode:
            return node.value
        if tag == MAP and type(node) is MappingNode:
            mapping: dict[str, Any] = {}
            for key, value in node.value:
                if key.tag != STR or type(key) is not ScalarNode:
                    raise _Unusual  # merge keys, non-string keys: PyYAML's rules
                mapping[key.value] = build(value)
            return mapping
        if tag == SEQ and type(node) is SequenceNode:
            return [build(item) for item in node.value]
        if tag in scalars and type(node) is ScalarNode:
            return scalars[tag](loader, node)
        raise _Unusual

    return build


def load_all(text: str) -> Iterator[Any]:
    """The documents of ``text``: ``yaml.load_all(text, Loader=LOADER)``, faster.

    Block-style text is read line by line (``blockyaml``); where it turns out to be of another
    shape, PyYAML reads the text and the documents already given are not given again."""
    given = 0
    try:
        for document in blockyaml.documents(text):
            yield document
            given += 1
        return
    except blockyaml.Unread:
        pass
    yield from itertools.islice(_composed(text), given, None)


def _composed(text: str) -> Iterator[Any]:
    """The documents of ``text`` built from libyaml's composed nodes."""
    if "&" in text:  # anchors: aliases must share one object, as PyYAML builds them
        yield from yaml.load_all(text, Loader=LOADER)
        return
    loader = _Loader(text)
    build = _builder(loader)
    try:
        while loader.check_node():
            node = loader.get_node()
            try:
                document = build(node)
            except (_Unusual, RecursionError, yaml.YAMLError, ValueError):
                document = loader.construct_document(node)
            yield document
    finally:
        loader.dispose()


def describe_error(exc: yaml.YAMLError) -> str:
    """A YAML error as one line, ``line L, column C: what (context)``, for an operator.

    PyYAML's own text spans four lines (the context, its mark, the problem, its mark) and
    quotes the file as ``<unicode string>`` when given text; the caller names the file.
    """
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        what = " ".join(str(exc.problem or "invalid YAML").split())
        if exc.context:
            context = " ".join(exc.context.split())
            start = exc.context_mark
            if start is not None and (start.line, start.column) != (mark.line, mark.column):
                context += f" started at line {start.line + 1}, column {start.column + 1}"
            what += f" ({context})"
        return f"line {mark.line + 1}, column {mark.column + 1}: {what}"
    return " ".join(str(exc).split()) or type(exc).__name__
