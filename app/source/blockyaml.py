"""The block-style YAML that kubectl, helm and ``yaml.safe_dump`` write, read line by line.

Most of a large RBAC directory is YAML of one shape: block mappings and sequences, one key or item
a line, plain or quoted scalars, ``---`` between documents, comments. Through libyaml, PyYAML
builds a node and two position marks for every scalar before any value; for this shape the values
can be read straight from the lines, in about a quarter of the time. Such texts also repeat most of
their lines (``kind: Role``, ``- get``), so each distinct line is read once per text, and equal
scalars are one object.

``documents(text)`` gives the documents ``yaml.load_all(text, Loader=CSafeLoader)`` gives, or
raises ``Unread`` at the first thing outside the subset read here (the caller then loads the text
with PyYAML). Only with libyaml's loader, and only this subset:

- the text ends with a line break and holds only characters libyaml reads as printable, less line
  breaks other than ``\\n`` (no tabs, no carriage returns, no byte order mark);
- a document is a block mapping or a block sequence starting at column 0; every line of a
  collection starts at the collection's column, a value nested under a key or item is indented
  further (a sequence may sit at its key's column, as PyYAML and kubectl write it), and an item
  may start a mapping on its own line (``- name: x``);
- keys are plain or quoted scalars on one line that resolve to strings;
- values are plain scalars on one line; single- or double-quoted scalars, folded over lines as
  YAML folds them (double-quoted ones without escapes); literal block scalars (``|``, ``|-``,
  ``|+``); flow sequences of words and quoted scalars on one line (``[get, list, ""]``); ``{}``;
- a plain scalar is typed by the loader's own implicit resolvers (YAML 1.1: ``yes`` is a boolean,
  ``0755`` octal, dates are timestamps) and built by the safe constructor's own function for its
  tag (null, bool, int, float, timestamp); any other tag (``=``, ``<<``) is not read here.

Anchors, aliases, tags, directives, flow mappings, folded block scalars, complex keys, plain
scalars over several lines, a ``...`` marker, anything after ``---`` on its line, and anything
malformed are left to PyYAML, so they mean what they meant and fail as they failed
(tests/source/test_blockyaml.py). Each line is looked at a bounded number of times; the only
patterns are one character class over the text and the resolver's own, which PyYAML runs on every
plain scalar anyway, so the time is linear in the text.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import yaml
from yaml.nodes import ScalarNode

# libyaml's parser when PyYAML was built with it: the same documents and errors, parsed about ten
# times faster than the pure-Python loader. What is read here is what libyaml reads.
LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

TAG = "tag:yaml.org,2002:"
_IMPLICIT = LOADER.yaml_implicit_resolvers
# The resolver is its table of implicit resolvers alone: no path resolvers, and no resolver for
# every first character. Then a plain scalar's tag is ``implicit_tag`` of its text.
SIMPLE_RESOLVER = not LOADER.yaml_path_resolvers and None not in _IMPLICIT
# The safe constructor's functions for the scalar tags the resolver gives plain scalars.
_CONSTRUCTOR = yaml.constructor.SafeConstructor()
_BUILD = {
    TAG + tag: LOADER.yaml_constructors[TAG + tag]
    for tag in ("null", "bool", "int", "float", "timestamp")
}
# Lines are read here only for libyaml, and only while the resolver is the table read here.
_ENABLED = LOADER is not yaml.SafeLoader and SIMPLE_RESOLVER


def implicit_tag(text: str) -> str | None:
    """The tag the resolver gives a plain scalar of this text; None: a string."""
    for tag, regexp in _IMPLICIT.get(text[:1], ()):
        if regexp.match(text):
            return tag
    return None


# Everything libyaml reads as printable, less tabs, carriage returns, NEL, the line and paragraph
# separators (line breaks to YAML 1.1) and the byte order mark.
_OUTSIDE = re.compile(
    "[^\n\x20-\x7e\xa0-\u2027\u202a-\ud7ff\ue000-\ufefe\uff00-\ufffd\U00010000-\U0010ffff]"
)
# Characters that do not start a plain scalar in block context (``-`` is checked on its own).
_NOT_PLAIN = frozenset(",[]{}#&*!|>'\"%@`?:")
# Characters that end or change a plain scalar in a flow sequence, or make a quoted one odd.
_FLOW_STOP = frozenset(",[]{}#:? ")
# libyaml looks for the ``:`` of an implicit key within 1024 characters of where it starts.
_KEY_LIMIT = 1000


class Unread(Exception):
    """Something outside what is read here: PyYAML loads the text."""


_MISSING = object()
_NOKEY = object()  # a line with no key: a sequence item's scalar, or a scalar on its own line
_EMPTY = object()  # nothing after the key or ``-``: the value is on the lines below, or null
_BLANK = object()  # a blank or comment line
_DOCUMENT = object()  # ``---``
# What an open collection is: a mapping, a sequence indented under its key or item, or a
# sequence at its key's column (which the mapping's next key closes).
_MAP, _SEQ, _INDENTLESS = 0, 1, 2
# A line read by itself: (indent, column of the content after ``-`` or -1, key, value).
_Line = tuple[int, int, Any, Any]


class _Later(str):
    """A value's text that is read with the lines after it (a quoted scalar that goes on, a
    literal block scalar) or builds a new object every time (``[]``, ``{}``)."""


def documents(text: str) -> Iterator[Any]:
    """The documents of ``text`` as PyYAML's safe loader builds them, each as soon as it ends;
    ``Unread`` as soon as the text turns out not to be of the shape read here."""
    if not _ENABLED or (text and text[-1] != "\n") or _OUTSIDE.search(text):
        raise Unread
    lines = text.split("\n")
    lines.pop()
    return _read(lines)


def _read(lines: list[str]) -> Iterator[Any]:
    """The documents in ``lines``, top-down, with the open collections on a stack. A text
    repeats most of its lines (``kind: Role``, ``- get``): each distinct line is read once."""
    plain: dict[str, Any] = {}  # a plain scalar's text -> its value
    read: dict[str, Any] = {}  # a line -> what it says by itself (``_Line``, _BLANK, _DOCUMENT)
    stack: list[tuple[int, Any, int]] = []  # (column, collection, kind) of the enclosing ones
    top: Any = None  # the innermost open collection, its column and kind
    col, kind = -1, _MAP
    root: Any = _MISSING  # the document being read
    explicit = False  # the document being read was opened by ``---``
    pending: tuple[Any, Any, int, bool] | None = None  # (collection, key, column, after a key)
    count = len(lines)
    i = 0
    while i < count:
        line = lines[i]
        i += 1
        said = read.get(line)
        if said is None:
            said = read[line] = _line(line, plain)
        if said is _BLANK:
            continue
        if said is _DOCUMENT:
            if root is not _MISSING:
                yield root
            elif explicit:
                yield None
            root, explicit, pending = _MISSING, True, None
            stack.clear()
            col, top, kind = -1, None, _MAP
            continue
        indent, inner, key, value = said
        if pending is not None:  # a key or item whose value is on the lines below it
            holder, slot, parent, after_key = pending
            pending = None
            if indent > parent or (indent == parent and inner >= 0 and after_key):
                if inner >= 0:
                    new: Any = []
                    stack.append((col, top, kind))
                    col, top, kind = indent, new, (_SEQ if indent > parent else _INDENTLESS)
                elif key is not _NOKEY:
                    new = {}
                    stack.append((col, top, kind))
                    col, top, kind = indent, new, _MAP
                else:  # a scalar on a line of its own
                    if type(value) is _Later:
                        value, i = _value(lines, i - 1, value, parent)
                    holder[slot] = value
                    continue
                holder[slot] = new
        if root is _MISSING:  # the first line of a document: its collection
            if indent or (inner < 0 and key is _NOKEY):
                raise Unread  # indented, or a scalar document
            root = [] if inner >= 0 else {}
            col, top, kind = 0, root, (_SEQ if inner >= 0 else _MAP)
        while indent < col:
            col, top, kind = stack.pop()
        if indent != col:
            raise Unread  # deeper than the collection it follows: a scalar over lines
        if inner >= 0:  # an item of the sequence ``top``
            if kind == _MAP:
                raise Unread
            if key is _NOKEY:
                if value is _EMPTY:
                    pending = (top, len(top), col, False)
                    value = None
                elif type(value) is _Later:
                    value, i = _value(lines, i - 1, value, col)
                top.append(value)
                continue
            new = {}  # ``- key: ...`` starts a mapping at the key's column
            top.append(new)
            stack.append((col, top, kind))
            col, top, kind = inner, new, _MAP
        elif kind != _MAP:
            if kind == _SEQ:
                raise Unread  # a key at a sequence's column
            col, top, kind = stack.pop()  # a key after a sequence at its key's column
        if key is _NOKEY:
            raise Unread  # a scalar among a mapping's keys
        if value is _EMPTY:
            pending = (top, key, col, True)
            value = None
        elif type(value) is _Later:
            value, i = _value(lines, i - 1, value, col)
        top[key] = value
    if root is not _MISSING:
        yield root
    elif explicit:
        yield None


def _line(line: str, plain: dict[str, Any]) -> Any:
    """What ``line`` says by itself: a ``_Line``, _BLANK or _DOCUMENT."""
    s = line.lstrip(" ")
    if not s or s[0] == "#":
        return _BLANK
    indent = len(line) - len(s)
    if indent == 0 and s[:3] in ("---", "..."):
        if line == "---":
            return _DOCUMENT
        raise Unread  # content after the marker, or a document end marker
    inner = -1
    if _is_item(s):
        after = s[1:]
        s = after.lstrip(" ")
        if not s or s[0] == "#":
            return indent, indent + 1, _NOKEY, _EMPTY
        if _is_item(s):
            raise Unread  # a sequence in a sequence on one line
        inner = indent + 1 + len(after) - len(s)
    if not _is_key(s):
        return indent, inner, _NOKEY, _scalar(s, plain)
    if s[0] == "'" or s[0] == '"':
        key, after = _quoted_key(s)
    else:
        at = s.find(": ")
        if at < 0:
            at = len(s) - 1  # ends with the ``:``
        key = plain.get(s[:at], _MISSING)
        if type(key) is not str:
            key = _resolve(s[:at], plain)
        if type(key) is not str or at > _KEY_LIMIT:
            raise Unread  # a key PyYAML builds as another type, or too long for libyaml
        after = s[at + 1 :]
    v = after.lstrip(" ")
    if not v or v[0] == "#":
        return indent, inner, key, _EMPTY
    return indent, inner, key, _scalar(v, plain)


def _scalar(v: str, plain: dict[str, Any]) -> Any:
    """The value starting ``v`` (to the end of the line): a plain or quoted scalar that ends on
    this line, else ``_Later``."""
    first = v[0]
    if first == "'" or first == '"':
        text, rest = _quoted_part(first, v, 1)
        if rest is not None:
            tail = rest.lstrip(" ")
            if tail and (tail[0] != "#" or tail == rest):
                raise Unread  # more after the closing quote, or a comment not after a space
            return text
        return _Later(v)
    if first in _NOT_PLAIN or _is_item(v):
        return _Later(v)
    h = v.find(" #")
    if h >= 0:
        v = v[:h]
    v = v.rstrip(" ")
    value = plain.get(v, _MISSING)
    return _resolve(v, plain) if value is _MISSING else value


def _is_key(s: str) -> bool:
    """Whether ``s`` (a line's text from its first non-space) starts with a mapping key."""
    if s[0] == "'" or s[0] == '"':
        rest = _quoted_part(s[0], s, 1)[1]
        return rest is not None and rest[:1] == ":"
    return ": " in s or s.endswith(":")


def _is_item(s: str) -> bool:
    """Whether ``s`` (a line's text from its first non-space) is a block sequence entry."""
    return s[:1] == "-" and (len(s) == 1 or s[1] == " ")


def _resolve(v: str, plain: dict[str, Any]) -> Any:
    """A plain scalar's value, as PyYAML types and builds it; remembered in ``plain``."""
    if (
        not v
        or v[0] in _NOT_PLAIN
        or _is_item(v)
        or ": " in v
        or " #" in v
        or v.endswith((":", " "))
    ):
        raise Unread  # not a plain scalar that ends where the line or a comment does
    value: Any = v
    tag = implicit_tag(v)
    if tag is not None:
        if tag not in _BUILD:
            raise Unread  # ``=``, ``<<``: what PyYAML does with them
        try:
            value = _BUILD[tag](_CONSTRUCTOR, ScalarNode(tag, v))
        except Exception:  # ``0x_``, ``2001-02-30``: PyYAML's error, after its parse errors
            raise Unread from None
    plain[v] = value
    return value


def _value(lines: list[str], i: int, v: str, parent: int) -> tuple[Any, int]:
    """The ``_Later`` value ``v`` on line ``i`` (of a key or item at column ``parent``) and the
    index of the line after it."""
    first = v[0]
    if first == "'" or first == '"':
        return _quoted(lines, i, v, parent)
    if first == "|":
        return _literal(lines, i, v, parent)
    if first == "[":
        return _flow_sequence(v), i + 1
    h = v.find(" #")
    if (v if h < 0 else v[:h]).rstrip(" ") == "{}":
        return {}, i + 1
    raise Unread  # anchors, aliases, tags, flow mappings, folded scalars...


def _flow_sequence(v: str) -> list[Any]:
    """A flow sequence on one line of plain words and quoted scalars: ``[get, list, ""]``."""
    end = v.find("]")
    tail = v[end + 1 :].lstrip(" ")
    if end < 0 or (tail and (tail[0] != "#" or tail == v[end + 1 :])):
        raise Unread
    inner = v[1:end]
    if not inner.strip(" "):
        return []
    items = []
    for part in inner.split(","):
        word = part.strip(" ")
        if not word or _FLOW_STOP.intersection(word[1:] if word[0] in "'\"" else word):
            raise Unread  # empty, nested, or a character flow context reads otherwise
        if word[0] == "'" or word[0] == '"':
            text, rest = _quoted_part(word[0], word, 1)
            if rest != "":
                raise Unread
            items.append(text)
        else:
            items.append(_resolve(word, {}))
    return items


def _quoted_part(quote: str, s: str, at: int) -> tuple[str, str | None]:
    """The text of a quoted scalar in ``s`` from ``at`` to its closing quote or the end of the
    line, and what follows the closing quote (None if the line ended first)."""
    if quote == '"':
        end = s.find('"', at)
        if "\\" in (s[at:] if end < 0 else s[at:end]):
            raise Unread  # escapes
        return (s[at:], None) if end < 0 else (s[at:end], s[end + 1 :])
    parts = []
    while True:
        end = s.find("'", at)
        if end < 0:
            parts.append(s[at:])
            return "".join(parts), None
        if s[end + 1 : end + 2] != "'":
            parts.append(s[at:end])
            return "".join(parts), s[end + 1 :]
        parts.append(s[at : end + 1])  # '' is one quote
        at = end + 2


def _quoted_key(s: str) -> tuple[str, str]:
    """A quoted key at the start of ``s`` and what follows its ``:``."""
    key, rest = _quoted_part(s[0], s, 1)
    if rest is None or rest[:1] != ":" or rest[1:2] not in ("", " "):
        raise Unread
    if len(s) - len(rest) > _KEY_LIMIT:
        raise Unread
    return key, rest[1:]


def _quoted(lines: list[str], i: int, v: str, parent: int) -> tuple[str, int]:
    """A quoted scalar from line ``i``, folded over further lines as YAML folds them: a line
    break is a space, blank lines are line breaks, spaces around breaks go."""
    quote = v[0]
    text, rest = _quoted_part(quote, v, 1)
    if rest is None:
        pieces = [text.rstrip(" ")]
        breaks = 0
        while rest is None:
            i += 1
            if i >= len(lines):
                raise Unread
            line = lines[i]
            s = line.lstrip(" ")
            if not s:
                breaks += 1
                continue
            if len(line) - len(s) <= parent:
                raise Unread  # a continuation at the parent's column or left of it
            text, rest = _quoted_part(quote, s, 0)
            pieces.append("\n" * breaks if breaks else " ")
            pieces.append(text if rest is not None else text.rstrip(" "))
            breaks = 0
        text = "".join(pieces)
    tail = rest.lstrip(" ")
    if tail and (tail[0] != "#" or tail == rest):
        raise Unread  # more after the closing quote, or a comment not after a space
    return text, i + 1


def _literal(lines: list[str], i: int, v: str, parent: int) -> tuple[str, int]:
    """A literal block scalar (``|``, ``|-``, ``|+``) from line ``i``: its lines less the
    indentation of the first, the final line breaks clipped to one, stripped or kept."""
    header = v.rstrip(" ")
    if header not in ("|", "|-", "|+"):
        raise Unread  # an indentation indicator, or a comment on the header line
    count = len(lines)
    i += 1
    if i >= count or not lines[i].strip(" "):
        raise Unread  # empty, or starting with blank lines
    indent = len(lines[i]) - len(lines[i].lstrip(" "))
    if indent <= parent:
        raise Unread
    body = []
    while i < count and not lines[i][:indent].strip(" "):
        body.append(lines[i][indent:])
        i += 1
    if header == "|+":
        return "\n".join(body) + "\n", i
    while not body[-1]:
        body.pop()
    return "\n".join(body) + ("\n" if header == "|" else ""), i
