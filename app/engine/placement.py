"""The placement annotation: where the pods a role lets its holders write may run.

A Role or ClusterRole carries, beside its permission annotation or alone, a JSON annotation
(key ``labelrbac.io/placement``, renamable) such as::

    {"nodeLabels": {"node-restriction.kubernetes.io/pool": ["a", "shared-*"]},
     "tolerations": [{"key": "pool", "values": ["a"], "effects": ["NoSchedule"]}]}

``nodeLabels`` maps a node label key to the value globs a pod's node may carry (the permission
annotation's glob language and limits); ``tolerations`` says which tolerations the pods may
carry. This module holds the schema, the compiled ``Placement`` and the pure matching of a pod
spec against it (``PodPlacement``); the rule that applies it is ``app.engine.scheduling``.

Every match is linear in the pod spec: the spec is read once into ``PodPlacement`` (the required
affinity's ``In`` values indexed by term and key), and each value is matched against a bounded
list of globs in time linear in the value (``app.engine.glob``).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jsonschema

from app.engine.glob import Glob
from app.engine.model import mapping_items
from app.engine.policy import (
    LABEL_KEY_PATTERN,
    MAX_VALUES_PER_ROLE,
    VALUE_GLOBS,
    AnnotationError,
    Requirement,
    explain,
)

DEFAULT_PLACEMENT_KEY = "labelrbac.io/placement"

NO_SCHEDULE, PREFER_NO_SCHEDULE, NO_EXECUTE = "NoSchedule", "PreferNoSchedule", "NoExecute"
EFFECTS = (NO_SCHEDULE, PREFER_NO_SCHEDULE, NO_EXECUTE)
# Taints the node lifecycle controller sets for node conditions: the API server's
# DefaultTolerationSeconds adds tolerations of them to every pod, and the DaemonSet controller
# to every daemon pod. Tolerating them lets a pod stay on its node through a condition, never
# onto another pool's node.
ALWAYS_TOLERATED = ("node.kubernetes.io/", "node.cloudprovider.kubernetes.io/")
# Where the node side keeps pool labels: a kubelet may not set labels under this prefix on its
# own Node (the NodeRestriction admission plugin, and label-rbac's node rules), so a
# compromised node cannot move itself into another pool. ``lint`` warns about other keys.
NODE_RESTRICTION_PREFIX = "node-restriction.kubernetes.io/"
# Toleration entries of one annotation: each is a test every judged pod toleration may run.
MAX_TOLERATIONS = 64

SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "minProperties": 1,
    "additionalProperties": False,
    "properties": {
        "nodeLabels": {
            "type": "object",
            "minProperties": 1,
            "propertyNames": {"pattern": LABEL_KEY_PATTERN},
            "additionalProperties": VALUE_GLOBS,
        },
        "tolerations": {
            "type": "array",
            "minItems": 1,
            "maxItems": MAX_TOLERATIONS,
            "items": {
                "type": "object",
                "required": ["key", "values"],
                "additionalProperties": False,
                "properties": {
                    "key": {"type": "string", "pattern": LABEL_KEY_PATTERN},
                    "values": VALUE_GLOBS,
                    "effects": {
                        "type": "array",
                        "minItems": 1,
                        "uniqueItems": True,
                        "items": {"enum": list(EFFECTS)},
                    },
                },
            },
        },
    },
}
_VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)


@dataclass(frozen=True, slots=True)
class TolerationRule:
    """One ``tolerations`` entry: a taint key, the value globs and effects its holders tolerate."""

    key: str
    values: tuple[Glob, ...]
    effects: frozenset[str]

    @property
    def exists(self) -> bool:
        """``*`` among the values: ``operator: Exists`` (any value) is permitted too."""
        return any(glob.text == "*" for glob in self.values)

    def permits(self, operator: str, value: str, effect: str) -> bool:
        """Whether a toleration of this key with ``operator``, ``value`` and ``effect`` (empty:
        every effect) is permitted."""
        if effect:
            if effect not in self.effects:
                return False
        elif len(self.effects) < len(EFFECTS):
            return False  # an empty effect tolerates every effect of the key
        if operator == "Exists":
            return self.exists
        return operator == "Equal" and any(g.matches(value) for g in self.values)

    def describe(self) -> str:
        values = ", ".join(g.text for g in self.values)
        return f"{self.key} in [{values}] ({', '.join(e for e in EFFECTS if e in self.effects)})"

    def covers(self, other: TolerationRule) -> bool:
        return (
            self.key == other.key
            and other.effects <= self.effects
            and all(any(mine.covers(glob) for mine in self.values) for glob in other.values)
        )


@dataclass(frozen=True)
class Placement:
    """A compiled placement annotation."""

    annotation_key: str
    node_labels: tuple[Requirement, ...]
    tolerations: tuple[TolerationRule, ...]

    @functools.cached_property
    def _literals(self) -> frozenset[tuple[str, ...]]:
        """What ``admits`` answers by one set lookup: (node label key, literal value) of each
        requirement, and (taint key, literal value, effect) of each toleration entry (at most
        values x three effects per entry, all bounded by the schema)."""
        return frozenset(
            [(r.key, g.text) for r in self.node_labels for g in r.values if g.is_literal]
            + [
                (rule.key, g.text, effect)
                for rule in self.tolerations
                for g in rule.values
                if g.is_literal
                for effect in rule.effects
            ]
        )

    @functools.cached_property
    def _by_key(self) -> Mapping[str, tuple[TolerationRule, ...]]:
        found: dict[str, list[TolerationRule]] = {}
        for rule in self.tolerations:
            found.setdefault(rule.key, []).append(rule)
        return {key: tuple(rules) for key, rules in found.items()}

    def node_misfit(self, labels: Mapping[str, str]) -> Requirement | None:
        """The first node label requirement a Node with ``labels`` does not meet."""
        for req in self.node_labels:
            value = labels.get(req.key)
            if value is None or not req.allows(value):
                return req
        return None

    def admits(self, spec: Mapping[str, Any]) -> bool:
        """Whether a pod spec (one without ``nodeName``) is pinned to this placement and only
        tolerates what it permits: ``unpinned`` and ``untolerated`` both None, answered in one
        pass over the spec as written (every admission of a placed pod runs it; the two
        explain a refusal)."""
        # ``type(...) is dict`` first: what JSON gives, without an abstract-class check each.
        selector = spec.get("nodeSelector")
        if not (type(selector) is dict or isinstance(selector, Mapping)):
            selector = {}
        literals = self._literals
        for req in self.node_labels:
            value = selector.get(req.key)
            if isinstance(value, str) and ((req.key, value) in literals or req.allows(value)):
                continue
            if not PodPlacement(spec).pins(req):
                return False
        tolerations = spec.get("tolerations")
        if not isinstance(tolerations, list):
            return True
        by_key = self._by_key
        for raw in tolerations:
            if not (type(raw) is dict or isinstance(raw, Mapping)):
                continue
            key = raw.get("key")
            if not isinstance(key, str) or not key:
                return False
            if key.startswith(ALWAYS_TOLERATED):
                continue
            operator, value, effect = raw.get("operator"), raw.get("value"), raw.get("effect")
            if (
                type(value) is str
                and type(effect) is str
                and (operator is None or (type(operator) is str and operator in _EQUAL))
                and (key, value, effect) in literals
            ):
                continue  # a literal value and an effect of an entry: a set lookup
            rules = by_key.get(key)
            if rules is None:
                return False
            operator = operator if isinstance(operator, str) and operator else "Equal"
            value = value if isinstance(value, str) else ""
            effect = effect if isinstance(effect, str) else ""
            for rule in rules:
                if rule.permits(operator, value, effect):
                    break
            else:
                return False
        return True

    def unpinned(self, pod: PodPlacement) -> Requirement | None:
        """The first node label key the pod's nodeSelector or required affinity does not pin
        to this placement's values (``nodeName`` is judged on its own: ``node_misfit``)."""
        for req in self.node_labels:
            if not pod.pins(req):
                return req
        return None

    def untolerated(self, pod: PodPlacement) -> Toleration | None:
        """The first toleration of the pod no entry permits (read as written: a permitted
        toleration costs a few dictionary reads)."""
        by_key = self._by_key
        for raw in pod.raw_tolerations():
            key = raw.get("key")
            if isinstance(key, str) and key:
                if key.startswith(ALWAYS_TOLERATED):
                    continue
                rules = by_key.get(key)
                if rules is not None:
                    operator = _text(raw.get("operator")) or "Equal"
                    value, effect = _text(raw.get("value")), _text(raw.get("effect"))
                    if any(rule.permits(operator, value, effect) for rule in rules):
                        continue
            return Toleration.of(raw)
        return None

    def describe(self) -> str:
        """``node-restriction.kubernetes.io/pool in [a]; tolerations pool in [a] (NoSchedule)``."""
        parts = [r.describe() for r in self.node_labels] or ["any node"]
        tolerated = "; ".join(r.describe() for r in self.tolerations) or "none"
        return f"nodes {' and '.join(parts)}; tolerations {tolerated}"

    def excess(self, other: Placement | None) -> str | None:
        """How ``other`` is broader than this placement, or None when it stays within it: it
        must pin every key pinned here to values covered here, and tolerate nothing not
        tolerated here. No placement is the broadest."""
        if other is None:
            return "without a placement"
        theirs = {req.key: req for req in other.node_labels}
        for req in self.node_labels:
            narrow = theirs.get(req.key)
            if narrow is None:
                return f"without pinning node label {req.key}"
            wide = next(
                (g for g in narrow.values if not any(h.covers(g) for h in req.values)), None
            )
            if wide is not None:
                return f'with node label {req.key}="{wide.text}"'
        for rule in other.tolerations:
            if not any(mine.covers(rule) for mine in self.tolerations):
                return f"tolerating {rule.describe()}"
        return None


@dataclass(frozen=True, slots=True)
class Toleration:
    """One toleration of a pod spec, as written (an absent operator is ``Equal``)."""

    key: str
    operator: str
    value: str
    effect: str

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> Toleration:
        return cls(
            _text(raw.get("key")),
            _text(raw.get("operator")) or "Equal",
            _text(raw.get("value")),
            _text(raw.get("effect")),
        )

    def describe(self) -> str:
        if not self.key:
            return "every taint (a toleration with an empty key)"
        what = (
            f"{self.key} (any value)" if self.operator == "Exists" else f'{self.key}="{self.value}"'
        )
        if self.operator not in ("Exists", "Equal"):
            what = f"{self.key} with operator {self.operator!r}"
        return f"{what}, {self.effect or 'every effect'}"


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


# An affinity term pins key K to these value lists: each ``In`` expression on K (they AND, so
# one whose values all fit pins the term).
Term = Mapping[str, tuple[tuple[str, ...], ...]]


_UNREAD: Any = object()
# The operators of a toleration that compare values: Equal, also when written as omitted.
_EQUAL = frozenset({"Equal", ""})


class PodPlacement:
    """What of a pod spec decides where it runs. Each part is read when a rule first asks for
    it (a nodeSelector that pins leaves the affinity unread) and then kept: every part is read
    at most once, in time linear in it."""

    __slots__ = ("_spec", "_terms", "_tolerations")

    def __init__(self, spec: Any) -> None:
        mapping = type(spec) is dict or isinstance(spec, Mapping)
        self._spec: Mapping[str, Any] = spec if mapping else {}
        self._terms: tuple[Term, ...] | None = _UNREAD
        self._tolerations: tuple[Toleration, ...] | None = None

    @classmethod
    def of(cls, spec: Any) -> PodPlacement:
        return cls(spec)

    @property
    def spec(self) -> Mapping[str, Any]:
        """The pod spec as written ({} when it is not a mapping)."""
        return self._spec

    @property
    def node_name(self) -> str:
        return _text(self._spec.get("nodeName"))

    @property
    def node_selector(self) -> Mapping[str, Any]:
        selector = self._spec.get("nodeSelector")
        return selector if isinstance(selector, Mapping) else {}

    @property
    def terms(self) -> tuple[Term, ...] | None:
        """The required node affinity's terms, indexed by key; None: no required affinity."""
        if self._terms is _UNREAD:
            self._terms = _required_terms(self._spec.get("affinity"))
        return self._terms

    def raw_tolerations(self) -> Iterable[Mapping[str, Any]]:
        """The tolerations as written (malformed items left out)."""
        return mapping_items(self._spec.get("tolerations"))

    @property
    def tolerations(self) -> tuple[Toleration, ...]:
        if self._tolerations is None:
            self._tolerations = tuple(map(Toleration.of, self.raw_tolerations()))
        return self._tolerations

    def pins(self, req: Requirement) -> bool:
        """Whether the scheduler can place the pod only on nodes whose ``req.key`` label is one
        ``req`` permits: by the nodeSelector, or by an ``In`` of permitted values in every term
        of the required node affinity (terms are ORed: one unconstrained term escapes)."""
        value = self.node_selector.get(req.key)
        if isinstance(value, str) and req.allows(value):
            return True
        terms = self.terms
        if not terms:
            return False
        for term in terms:
            if not any(
                values and all(req.allows(v) for v in values) for values in term.get(req.key, ())
            ):
                return False
        return True

    def scheduling(self) -> tuple[object, ...]:
        """What an update may change of where the pod runs (compared before and after)."""
        return (self.node_name, dict(self.node_selector), self.terms, self.tolerations)


def _required_terms(affinity: Any) -> tuple[Term, ...] | None:
    node = affinity.get("nodeAffinity") if isinstance(affinity, Mapping) else None
    required = (
        node.get("requiredDuringSchedulingIgnoredDuringExecution")
        if isinstance(node, Mapping)
        else None
    )
    if not isinstance(required, Mapping):
        return None
    raw = required.get("nodeSelectorTerms")
    if not isinstance(raw, list):
        return None
    terms: list[Term] = []
    for term in raw:
        found: dict[str, list[tuple[str, ...]]] = {}
        expressions = term.get("matchExpressions") if isinstance(term, Mapping) else None
        for expr in mapping_items(expressions):
            values = expr.get("values")
            if expr.get("operator") != "In" or not isinstance(values, list):
                continue  # NotIn, Exists, DoesNotExist, Gt, Lt: they pin nothing
            if not all(isinstance(v, str) for v in values):
                continue
            found.setdefault(_text(expr.get("key")), []).append(tuple(values))
        terms.append({key: tuple(lists) for key, lists in found.items()})
    return tuple(terms)


def _compile(document: Mapping[str, Any], key: str) -> Placement:
    node_labels = tuple(
        Requirement(label, tuple(Glob.compile(v) for v in globs))
        for label, globs in document.get("nodeLabels", {}).items()
    )
    tolerations = tuple(
        TolerationRule(
            entry["key"],
            tuple(Glob.compile(v) for v in entry["values"]),
            frozenset(entry.get("effects", EFFECTS)),
        )
        for entry in document.get("tolerations", ())
    )
    return Placement(key, node_labels, tolerations)


def _value_count(document: Mapping[str, Any]) -> int:
    return sum(len(v) for v in document.get("nodeLabels", {}).values()) + sum(
        len(t["values"]) for t in document.get("tolerations", ())
    )


def _say(error: jsonschema.ValidationError) -> str:
    """A schema violation in words (the permission annotation's, but for the toleration list)."""
    if error.validator == "maxItems" and list(error.absolute_path) == ["tolerations"]:
        return (
            f"{len(error.instance)} toleration entries, over the limit of {MAX_TOLERATIONS}; "
            "list several values in one entry or split the role"
        )
    return explain(error)


def _errors(document: Any) -> list[str]:
    return [
        f"schema violation at {'/'.join(str(p) for p in e.absolute_path) or 'the top level'}: "
        f"{_say(e)}"
        for e in sorted(
            _VALIDATOR.iter_errors(document), key=lambda e: [str(p) for p in e.absolute_path]
        )
    ]


def _load(raw: str) -> Any:
    try:
        return json.loads(raw)
    except RecursionError:
        raise AnnotationError("not valid JSON: nested too deeply") from None
    except (TypeError, ValueError) as exc:
        raise AnnotationError(f"not valid JSON: {exc}") from None


def parse_placement(raw: str, *, annotation_key: str = DEFAULT_PLACEMENT_KEY) -> Placement:
    """Parse and validate one placement annotation. Raises ``AnnotationError``."""
    document = _load(raw)
    error = jsonschema.exceptions.best_match(_VALIDATOR.iter_errors(document))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "the top level"
        raise AnnotationError(f"schema violation at {where}: {_say(error)}")
    if (count := _value_count(document)) > MAX_VALUES_PER_ROLE:
        raise AnnotationError(
            f"{count} value globs in all, over the limit of {MAX_VALUES_PER_ROLE} per role; "
            "write one glob for a family of values (pool-*) or split the role"
        )
    return _compile(document, annotation_key)


# Texts up to this size are compiled once and shared (tenants' roles repeat one placement per
# pool); at most this many are kept, so the cache holds at most a few MiB of text.
_CACHE_TEXT = 8192


@functools.lru_cache(maxsize=1024)
def _parse_cached(raw: str, key: str) -> Placement | str:
    try:
        return parse_placement(raw, annotation_key=key)
    except AnnotationError as exc:
        return str(exc)


def placement_of(annotations: Mapping[str, str], keys: Sequence[str]) -> Placement | None:
    """The compiled placement a role's annotations carry, or None when it carries none.
    Raises ``AnnotationError`` (with the key) when it is invalid."""
    present = [k for k in keys if k in annotations]
    if not present:
        return None
    if len(present) > 1:
        raise AnnotationError(
            f"the role carries more than one placement annotation ({', '.join(present)}); "
            "keep exactly one"
        )
    key = present[0]
    raw = annotations[key]
    if not isinstance(raw, str):
        raise AnnotationError(f"invalid {key} annotation: not a string")
    found: Placement | str
    if len(raw) > _CACHE_TEXT:
        try:
            found = parse_placement(raw, annotation_key=key)
        except AnnotationError as exc:
            found = str(exc)
    else:
        found = _parse_cached(raw, key)
    if isinstance(found, str):
        raise AnnotationError(f"invalid {key} annotation: {found}")
    return found


def placement_errors(annotations: Mapping[str, str], keys: Sequence[str]) -> list[str]:
    """Every problem of a role's placement annotation, for ``lint``; empty when valid."""
    try:
        placement_of(annotations, keys)
    except AnnotationError as exc:
        first = str(exc)
    else:
        return []
    present = [k for k in keys if k in annotations]
    if len(present) != 1:
        return [first]
    try:
        document = _load(annotations[present[0]])
    except AnnotationError:
        return [first]
    found = [f"invalid {present[0]} annotation: {e}" for e in _errors(document)]
    return list(dict.fromkeys(found)) or [first]


def placement_warnings(placement: Placement) -> list[str]:
    """What ``lint`` warns about a valid placement: node label keys a kubelet may set on its
    own Node, so a compromised node could join the pool and receive the pool's pods."""
    return [
        f"{placement.annotation_key}: node label {req.key} is outside {NODE_RESTRICTION_PREFIX}: "
        "kubelets may set it on their own Node, so a compromised node can move itself into the "
        f"pool; use a key under {NODE_RESTRICTION_PREFIX}"
        for req in placement.node_labels
        if not req.key.startswith(NODE_RESTRICTION_PREFIX)
    ]
