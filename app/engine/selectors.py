"""Label selectors as the engine reasons about them: which values a selector confines a key to.

A selector is a conjunction of requirements. For a restricted label key, a selector confines the
objects it can match to a set of values when some ``In`` requirement names that key (several
intersect); ``DoesNotExist`` confines it to "no such label" (``None``). ``NotIn`` and ``Exists``
only exclude, so they confine nothing. The read rule (a list must stay within the user's labels)
and the workload rule (a controller's selector must not reach into another bucket) both ask the
same question through ``confinement``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from app.engine.model import mapping_items

IN, NOT_IN, EXISTS, DOES_NOT_EXIST = "In", "NotIn", "Exists", "DoesNotExist"
OPERATORS = frozenset({IN, NOT_IN, EXISTS, DOES_NOT_EXIST})


class SelectorError(ValueError):
    """A selector that is not shaped like one (unknown operator, wrong types)."""


@dataclass(frozen=True, slots=True)
class Requirement:
    """``key <operator> values``: one term of a selector."""

    key: str
    operator: str
    values: tuple[str, ...] = ()

    def __str__(self) -> str:
        if self.operator == EXISTS:
            return self.key
        if self.operator == DOES_NOT_EXIST:
            return f"!{self.key}"
        if self.operator == IN and len(self.values) == 1:
            return f"{self.key}={self.values[0]}"
        op = "in" if self.operator == IN else "notin"
        return f"{self.key} {op} ({','.join(self.values)})"


Selector = tuple[Requirement, ...]


def confinement(selector: Selector | None, key: str) -> frozenset[str | None] | None:
    """The values objects matched by ``selector`` can carry for ``key``; None: unconfined.

    ``None`` inside the set stands for "the label is absent". An empty set means the selector
    matches no object at all (contradictory requirements), which is trivially confined. As in
    Kubernetes, ``NotIn`` also matches objects without the label, so it confines nothing.
    """
    terms = [req for req in selector or () if req.key == key]
    in_sets = [frozenset(req.values) for req in terms if req.operator == IN]
    absent = any(req.operator == DOES_NOT_EXIST for req in terms)
    if in_sets:
        values: frozenset[str | None] = frozenset.intersection(*in_sets)
        return frozenset() if absent else values
    if absent:
        present = any(req.operator == EXISTS for req in terms)
        return frozenset() if present else frozenset({None})
    return None


def requirement(key: Any, operator: Any, values: Any) -> Requirement:
    """One requirement from wire fields; raises ``SelectorError`` when malformed."""
    if not isinstance(key, str) or not key:
        raise SelectorError("a selector requirement needs a key")
    if operator not in OPERATORS:
        raise SelectorError(f"unknown selector operator {operator!r}")
    if values is None:
        values = []
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise SelectorError(f"values of selector key {key!r} must be a list of strings")
    if operator in (IN, NOT_IN) and not values:
        raise SelectorError(f"operator {operator} on key {key!r} needs values")
    if operator in (EXISTS, DOES_NOT_EXIST) and values:
        raise SelectorError(f"operator {operator} on key {key!r} takes no values")
    return Requirement(key, operator, tuple(values))


def from_label_selector(obj: Any) -> Selector:
    """A ``metav1.LabelSelector`` (``matchLabels`` and ``matchExpressions``) as requirements.

    A plain ``{key: value}`` map (a ReplicationController's ``spec.selector``) is read as
    ``matchLabels``. Raises ``SelectorError`` when the object is not shaped like a selector.
    """
    if obj is None:
        return ()
    if not isinstance(obj, Mapping):
        raise SelectorError("a label selector must be an object")
    if not {"matchLabels", "matchExpressions"} & obj.keys() and obj:
        obj = {"matchLabels": obj}
    labels = obj.get("matchLabels") or {}
    if not isinstance(labels, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
    ):
        raise SelectorError("matchLabels must map label keys to strings")
    found = [Requirement(k, IN, (v,)) for k, v in labels.items()]
    expressions = obj.get("matchExpressions")
    if expressions is not None and not isinstance(expressions, list):
        raise SelectorError("matchExpressions must be a list")
    for expr in mapping_items(expressions):
        found.append(requirement(expr.get("key"), expr.get("operator"), expr.get("values")))
    if expressions and len(found) - len(labels) != len(expressions):
        raise SelectorError("each of matchExpressions must be an object")
    return tuple(found)


# Whitespace as the Kubernetes selector lexer skips it: space, tab, CR and LF only. ``\s`` would
# also take Unicode spaces (NBSP, U+2028, U+0085...), which Kubernetes reads as part of a value.
_BLANKS = " \t\r\n"
_SPACE = f"[{_BLANKS}]"
_WORD = f"[^{_BLANKS}!=(),]"
_SET_TERM = re.compile(rf"{_SPACE}*({_WORD}+){_SPACE}+(in|notin){_SPACE}+\(([^()]*)\){_SPACE}*")
_EQ_TERM = re.compile(rf"{_SPACE}*({_WORD}+){_SPACE}*(==|=|!=){_SPACE}*({_WORD}*){_SPACE}*")
_KEY_TERM = re.compile(rf"{_SPACE}*(!?){_SPACE}*({_WORD}+){_SPACE}*")


def _split_terms(text: str) -> list[str]:
    """Split at commas outside parentheses (``a in (x,y),b=c`` → two terms)."""
    terms, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            terms.append(text[start:i])
            start = i + 1
    terms.append(text[start:])
    return terms


def parse_selector(text: str) -> Selector:
    """A label selector as ``kubectl -l`` spells it: ``k=v``, ``k==v``, ``k!=v``,
    ``k in (a,b)``, ``k notin (a,b)``, ``k``, ``!k``, joined by commas. Raises ``SelectorError``.
    """
    found: list[Requirement] = []
    for term in _split_terms(text):
        if match := _SET_TERM.fullmatch(term):
            key, op, values = match[1], match[2], [v.strip(_BLANKS) for v in match[3].split(",")]
            found.append(requirement(key, IN if op == "in" else NOT_IN, [v for v in values if v]))
        elif match := _EQ_TERM.fullmatch(term):
            found.append(Requirement(match[1], NOT_IN if match[2] == "!=" else IN, (match[3],)))
        elif match := _KEY_TERM.fullmatch(term):
            found.append(Requirement(match[2], DOES_NOT_EXIST if match[1] else EXISTS))
        else:
            raise SelectorError(f"cannot parse label selector term {term.strip(_BLANKS)!r}")
    return tuple(found)
