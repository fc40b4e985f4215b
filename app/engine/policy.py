"""The label-permission annotation: schema, parsing and compiled, matchable entries.

A Role or ClusterRole carries a JSON annotation such as::

    {"configmaps": {"team": ["a"]}, "mwan3*": ["app-intent", "k8s-service"]}

Top-level keys are resource patterns (``res[.group][/sub]`` with ``*``/``?`` globs); values are
either ``{label key: [value globs]}`` or, shorthand, a list of value globs for the configured
default label key. Everything is compiled once, when the role is loaded.
"""

from __future__ import annotations

import functools
import json
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jsonschema

from app.engine.glob import Glob
from app.engine.model import Resource

DEFAULT_ANNOTATION_KEY = "labelrbac.io/permissions"

# Every pattern below is matched by jsonschema with Python's backtracking ``re`` against text a
# namespace admin writes, of any length (annotations may total 256 KiB). So each is anchored at
# the start (searched from there only) and every repetition in it is bounded: whatever the text,
# a match succeeds or gives up within a few hundred steps.


def whole(body: str) -> str:
    r"""A pattern that matches only a whole text, for searching matchers (jsonschema uses
    ``re.search``): ``^`` and ``\Z``. Never ``$``: it also matches before a final newline, so
    ``configmaps\n`` would pass for ``configmaps`` and then name no resource at all."""
    return rf"^(?:{body})\Z"


# A label key: an optional DNS-subdomain prefix (at most 253 characters) and a name of at most 63.
_LABEL_KEY = whole(
    r"([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
)
# A label value: at most 63 characters, alphanumeric at both ends (objects' labels, not globs).
_LABEL_VALUE = whole(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")
# A label value is at most 63 characters, so a longer value glob could only match by its stars.
_VALUE_GLOB = whole(r"[-A-Za-z0-9_.*?]{0,63}")
# res[.group][/sub]: resource names are DNS labels (at most 63 characters), groups DNS subdomains
# (at most 253) and subresources path segments as short as resource names.
_RESOURCE_PATTERN = whole(
    r"[-a-zA-Z0-9*?]{1,63}(\.[-a-zA-Z0-9.*?]{1,253})?(/[-a-zA-Z0-9*?]{1,63})?"
)
# Globs match in linear time whatever their wildcards (app/engine/glob.py); the bound keeps the
# coverage comparison of the escalation check (|pattern|·|pattern|) and denial messages small.
# Real patterns ("staging-*", "*-dev-*", "v?.?") need a few.
MAX_WILDCARDS = 16
# Value globs per label key of an entry, and in a whole annotation (one role). Each glob is a test
# the webhook and the compiled policy run on every write carrying that label, whoever writes it,
# so a role bound to other subjects must not make their writes cost without bound. Real
# annotations list a handful (a team, a few environments); a longer list is better one glob.
MAX_VALUES_PER_KEY = 64
MAX_VALUES_PER_ROLE = 256
_MAX_VALUE_GLOB = 63
_MAX_RESOURCE_PATTERN = 63 + 1 + 253 + 1 + 63


def _few_wildcards(longest: int) -> str:
    # Each run between wildcards is bounded too, so a text far too long fails within a few
    # hundred steps instead of being scanned (the length itself is reported by the other pattern).
    run = f"[^*?]{{0,{longest}}}"
    return whole(f"{run}([*?]{run}){{0,{MAX_WILDCARDS}}}")


def is_label_key(text: str) -> bool:
    """A label (or annotation) key as Kubernetes accepts it: ``[prefix/]name``, nothing more."""
    return re.search(_LABEL_KEY, text) is not None


def is_label_value(text: str) -> bool:
    """A label value as Kubernetes accepts it (empty included), nothing more."""
    return re.search(_LABEL_VALUE, text) is not None


_FEW_WILDCARDS_VALUE = _few_wildcards(_MAX_VALUE_GLOB)
_FEW_WILDCARDS_RESOURCE = _few_wildcards(_MAX_RESOURCE_PATTERN)

_VALUES = {
    "type": "array",
    "minItems": 1,
    "maxItems": MAX_VALUES_PER_KEY,
    "items": {
        "type": "string",
        # The first failing pattern is the one reported: say what the text is before counting.
        "allOf": [{"pattern": _VALUE_GLOB}, {"pattern": _FEW_WILDCARDS_VALUE}],
    },
}

# What the placement annotation's schema shares (``app.engine.placement``): label keys, and a
# list of value globs with the same limits.
LABEL_KEY_PATTERN = _LABEL_KEY
VALUE_GLOBS = _VALUES

SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "minProperties": 1,
    "propertyNames": {
        "allOf": [{"pattern": _RESOURCE_PATTERN}, {"pattern": _FEW_WILDCARDS_RESOURCE}]
    },
    # if/then/else rather than oneOf, so a violation is reported where it is, not as "matches
    # none of the alternatives".
    "additionalProperties": {
        "type": ["array", "object"],
        "if": {"type": "array"},
        "then": _VALUES,
        "else": {
            "minProperties": 1,
            "propertyNames": {"pattern": _LABEL_KEY},
            "additionalProperties": _VALUES,
        },
    },
}
_VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
_PATTERN_VALIDATOR = jsonschema.Draft202012Validator(SCHEMA["propertyNames"])

# The schema, compiled to nested predicates that answer only "valid or not". jsonschema walks a
# document about 30 times slower (it builds a validator per subschema and error iterators), which
# dominated loading thousands of distinct annotations. A document the predicates reject is
# validated by jsonschema again for the message; one they accept is valid for jsonschema too
# (tests/engine/test_policy.py checks both ways on generated documents). Only the keywords
# ``SCHEMA`` uses are implemented, with jsonschema's semantics; any other keyword fails at import.
Check = Callable[[Any], bool]
_TYPES: Mapping[str, type] = {"array": list, "object": dict, "string": str}


def _all(checks: Sequence[Check]) -> Check:
    if len(checks) == 1:
        return checks[0]
    return lambda value: all(check(value) for check in checks)


def _keyword(name: str, arg: Any, schema: Mapping[str, Any]) -> Check | None:
    """One keyword of a subschema as a predicate (None: nothing to check on its own)."""
    if name == "type":
        types = tuple(_TYPES[t] for t in ([arg] if isinstance(arg, str) else arg))
        return lambda value: isinstance(value, types)
    if name == "minProperties":
        return lambda value: not isinstance(value, dict) or len(value) >= arg
    if name == "minItems":
        return lambda value: not isinstance(value, list) or len(value) >= arg
    if name == "maxItems":
        return lambda value: not isinstance(value, list) or len(value) <= arg
    if name == "pattern":
        search = re.compile(arg).search  # jsonschema: re.search(pattern, instance)
        return lambda value: not isinstance(value, str) or search(value) is not None
    if name == "allOf":
        return _all([compile_schema(sub) for sub in arg])
    if name == "propertyNames":
        names = compile_schema(arg)
        return lambda value: not isinstance(value, dict) or all(names(k) for k in value)
    if name == "additionalProperties":  # no "properties": every property is additional
        values = compile_schema(arg)
        return lambda value: not isinstance(value, dict) or all(values(v) for v in value.values())
    if name == "items":  # no "prefixItems": the schema applies to every item
        item = compile_schema(arg)
        return lambda value: not isinstance(value, list) or all(item(i) for i in value)
    if name == "if":
        test = compile_schema(arg)
        then = compile_schema(schema.get("then", {}))
        otherwise = compile_schema(schema.get("else", {}))
        return lambda value: then(value) if test(value) else otherwise(value)
    if name in ("then", "else"):
        return None  # part of "if"; alone (no "if") they are ignored, as by jsonschema
    raise ValueError(f"keyword {name!r} is not implemented by compile_schema")


def compile_schema(schema: Mapping[str, Any]) -> Check:
    """A predicate equal to ``Draft202012Validator(schema).is_valid`` for the keywords above."""
    checks = [c for name, arg in schema.items() if (c := _keyword(name, arg, schema)) is not None]
    return _all(checks) if checks else (lambda value: True)


_VALID = compile_schema(SCHEMA)


class AnnotationError(ValueError):
    """A permission annotation that cannot be used: bad JSON, schema violation, ambiguity."""


@dataclass(frozen=True, slots=True)
class Requirement:
    """One label key and the value globs it may take (OR)."""

    key: str
    values: tuple[Glob, ...]

    def allows(self, value: str) -> bool:
        return any(glob.matches(value) for glob in self.values)

    def describe(self) -> str:
        return f"{self.key} in [{', '.join(g.text for g in self.values)}]"


@dataclass(frozen=True, slots=True)
class Violation:
    """Why one label set fails one entry."""

    key: str
    value: str | None  # None: the label is missing

    def describe(self, existing: bool = False) -> str:
        if self.value is None:
            return f"{'the existing object has no' if existing else 'missing'} label {self.key}"
        if existing:
            return f'the existing object\'s label {self.key}="{self.value}" is not permitted'
        return f'label {self.key}="{self.value}" is not permitted'


@dataclass(frozen=True, slots=True)
class Entry:
    """One top-level annotation key: which resources it covers and what labels it requires."""

    pattern: str
    resource: Glob
    group: Glob | None
    subresource: Glob | None
    requirements: tuple[Requirement, ...]

    def rank(self, res: Resource) -> int:
        """How specifically this entry names ``res``; 0 when it does not apply.

        Most significant first: an entry naming the subresource literally beats one matching it
        by glob, which beats the parent resource's entry; then a literal resource name beats a
        glob; then an explicit group beats "any group".
        """
        if not self.resource.matches(res.resource):
            return 0
        if self.group is not None and not self.group.matches(res.group):
            return 0
        if self.subresource is None:
            level = 1 if res.subresource else 3
        elif res.subresource and self.subresource.matches(res.subresource):
            level = 3 if self.subresource.is_literal else 2
        else:
            return 0
        return level * 4 + self.resource.is_literal * 2 + (self.group is not None)

    def violation(self, labels: Mapping[str, str], allow_unlabeled: bool) -> Violation | None:
        for req in self.requirements:
            value = labels.get(req.key)
            if value is None:
                if allow_unlabeled:
                    continue
                return Violation(req.key, None)
            if not req.allows(value):
                return Violation(req.key, value)
        return None

    def describe(self) -> str:
        return " and ".join(r.describe() for r in self.requirements)

    def requirement(self, key: str) -> Requirement | None:
        for req in self.requirements:
            if req.key == key:
                return req
        return None


# The class of a text that equals no literal of the annotation and meets no partial glob.
_OTHER = ("other",)
# Classes remembered per annotation: a few per entry. Real requests use a handful; more takes an
# annotation written with many literals or partial globs, and then the memo stays within a small
# multiple of the compiled annotation's own size (the oldest class is dropped first).
MEMO_BASE, MEMO_PER_ENTRY = 16, 4


@dataclass(frozen=True, slots=True)
class _Part:
    """How one part of a resource (name, group or subresource) can change ``entries_for``.

    Entries compare a part with a literal glob by equality, with ``*`` not at all, and only with
    the other wildcard globs (``mwan3*``, the partial ones) by matching. So every text that
    equals no literal is in one class with every other, up to which partial globs match it: the
    class of a text is the literal it equals (the annotation's own string) or that tuple of
    answers. A text a request made up, of any length, costs a lookup and is never kept.
    """

    literals: Mapping[str, str]
    partial: tuple[Glob, ...]

    @classmethod
    def of(cls, globs: Sequence[Glob]) -> _Part:
        partial = {g.text: g for g in globs if not g.is_literal and not g.is_universal}
        return cls({g.text: g.text for g in globs if g.is_literal}, tuple(partial.values()))

    def classify(self, text: str) -> object:
        # Literals are never empty (the schema), so ``or`` falls through only on a miss.
        return self.literals.get(text) or (
            tuple(g.matches(text) for g in self.partial) if self.partial else _OTHER
        )


@dataclass(frozen=True)
class Permissions:
    """A compiled annotation. ``entries_for`` is memoised per class of resource (``_Part``): the
    classes are the annotation's, so a request's made-up names cannot grow the memo."""

    annotation_key: str
    entries: tuple[Entry, ...]
    _memo: dict[tuple[object, object, object], tuple[Entry, ...]] = field(
        default_factory=dict, compare=False, repr=False
    )
    _lock: threading.Lock = field(default_factory=threading.Lock, compare=False, repr=False)
    _parts: tuple[_Part, _Part, _Part] = field(init=False, compare=False, repr=False)
    _memo_limit: int = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        parts = (
            _Part.of([e.resource for e in self.entries]),
            _Part.of([e.group for e in self.entries if e.group is not None]),
            _Part.of([e.subresource for e in self.entries if e.subresource is not None]),
        )
        object.__setattr__(self, "_parts", parts)
        object.__setattr__(self, "_memo_limit", MEMO_BASE + MEMO_PER_ENTRY * len(self.entries))

    def entries_for(self, res: Resource) -> tuple[Entry, ...]:
        """The entries that decide for ``res``: all of the most specific rank (they AND)."""
        resource, group, sub = self._parts
        key = (
            resource.classify(res.resource),
            group.classify(res.group),
            # No subresource ranks apart from every subresource: "" is a class of its own.
            sub.classify(res.subresource) if res.subresource else "",
        )
        found = self._memo.get(key)  # a dict read is atomic: no lock on the hot path
        if found is None:
            ranked = [(entry.rank(res), entry) for entry in self.entries]
            best = max((r for r, _ in ranked), default=0)
            found = tuple(e for r, e in ranked if best and r == best)
            with self._lock:
                if len(self._memo) >= self._memo_limit:
                    del self._memo[next(iter(self._memo))]  # the oldest class
                self._memo[key] = found
        return found

    def loan_entries(self, res: Resource) -> tuple[Entry, ...]:
        """The requirements an identity loan must meet (``model.lends_identity``).

        Acting as another subject lends that subject's grants on every resource, so a role
        confined to label buckets lends only identities within all of them: the entries deciding
        for ``res`` (a role's own ``serviceaccounts`` entry), or else every entry (they AND).
        """
        return self.entries_for(res) or self._every_entry

    def relabel_entries(self, res: Resource) -> tuple[Entry, ...]:
        """The requirements a change of an object's labels must meet: the entries deciding for
        ``res`` and every entry naming one of its subresources (``pods/exec``), which the
        object's labels decide too. Else a holder allowed to relabel the object under a wider
        entry would move it into a subresource entry's bucket. () when no entry applies."""
        children = tuple(
            entry
            for entry in self.entries
            if entry.subresource is not None
            and entry.resource.matches(res.resource)
            and (entry.group is None or entry.group.matches(res.group))
        )
        own = self.entries_for(res)
        return own + tuple(e for e in children if e not in own)

    def relabel_differs(self, res: Resource) -> bool:
        """Whether a change of labels of ``res`` meets requirements its writes do not (the
        compiled policy does not judge changes of labels by subresource entries)."""
        if not self._has_subresource_entries:
            return False
        requirements = {r for e in self.entries_for(res) for r in e.requirements}
        return any(r not in requirements for e in self.relabel_entries(res) for r in e.requirements)

    @functools.cached_property
    def _has_subresource_entries(self) -> bool:
        return any(entry.subresource is not None for entry in self.entries)

    @functools.cached_property
    def _every_entry(self) -> tuple[Entry, ...]:
        """Every entry, one per distinct set of requirements (a message names each once)."""
        return tuple({entry.requirements: entry for entry in self.entries}.values())


def resource_pattern(pattern: str) -> Entry:
    """A resource pattern alone (``configmaps``, ``*.apps``, ``pods/log``), matched as an
    annotation entry's key is; ``rank(res) > 0`` says it applies. Raises ``AnnotationError``."""
    error = jsonschema.exceptions.best_match(_PATTERN_VALIDATOR.iter_errors(pattern))
    if error is not None:
        raise AnnotationError(_explain(error))
    return _compile_entry(pattern, {}, None)


def _compile_entry(pattern: str, value: Any, default_label_key: str | None) -> Entry:
    base, slash, sub = pattern.partition("/")
    resource, dot, group = base.partition(".")
    if isinstance(value, list):
        if not default_label_key:
            raise AnnotationError(
                f"entry {pattern!r} uses the list shorthand, but no default label key is "
                'configured (--default-label-key); write {"<label key>": [...]} instead'
            )
        value = {default_label_key: value}
    requirements = tuple(
        Requirement(key, tuple(Glob.compile(v) for v in globs)) for key, globs in value.items()
    )
    return Entry(
        pattern=pattern,
        resource=Glob.compile(resource),
        group=Glob.compile(group) if dot else None,
        subresource=Glob.compile(sub) if slash else None,
        requirements=requirements,
    )


# Pattern failures, said in words rather than as the regular expression.
_PATTERN_NAMES = {
    _RESOURCE_PATTERN: (
        "a resource pattern (res[.group][/subresource], with * and ? globs; resource and "
        "subresource at most 63 characters, group at most 253)"
    ),
    _LABEL_KEY: "a label key ([prefix/]name, name at most 63 characters)",
    _VALUE_GLOB: "a label value glob (at most 63 of A-Z a-z 0-9 - _ . * ?)",
    _FEW_WILDCARDS_VALUE: f"a glob with at most {MAX_WILDCARDS} wildcards (* and ? together)",
    _FEW_WILDCARDS_RESOURCE: f"a glob with at most {MAX_WILDCARDS} wildcards (* and ? together)",
}


_FEWER_VALUES = "write one glob for a family of values (team-*) or split the role"


def explain(error: jsonschema.ValidationError) -> str:
    """A schema violation in words (a pattern by what it stands for, a long list by its size)."""
    return _explain(error)


def _explain(error: jsonschema.ValidationError) -> str:
    if error.validator == "pattern" and error.validator_value in _PATTERN_NAMES:
        return f"{error.instance!r} is not {_PATTERN_NAMES[error.validator_value]}"
    if error.validator == "maxItems" and isinstance(error.instance, list):
        # Never the list itself: it is long, and the message would quote all of it.
        return (
            f"{len(error.instance)} value globs, over the limit of {error.validator_value} "
            f"for one label key; {_FEWER_VALUES}"
        )
    return error.message


def _value_count(document: Mapping[str, Any]) -> int:
    """The value globs of a valid annotation, every entry and label key together."""
    return sum(
        len(value) if isinstance(value, list) else sum(len(v) for v in value.values())
        for value in document.values()
    )


def parse_permissions(
    raw: str, *, annotation_key: str = DEFAULT_ANNOTATION_KEY, default_label_key: str | None = None
) -> Permissions:
    """Parse and validate one annotation value. Raises ``AnnotationError`` with a readable cause."""
    try:
        document = json.loads(raw)
    except RecursionError:
        raise AnnotationError("not valid JSON: nested too deeply") from None
    except (TypeError, ValueError) as exc:
        raise AnnotationError(f"not valid JSON: {exc}") from None
    if not _VALID(document):
        error = jsonschema.exceptions.best_match(_VALIDATOR.iter_errors(document))
        if error is None:  # cannot be (tested both ways); refused rather than trusted
            raise AnnotationError("schema violation")
        where = "/".join(str(p) for p in error.absolute_path) or "the top level"
        raise AnnotationError(f"schema violation at {where}: {_explain(error)}")
    if (count := _value_count(document)) > MAX_VALUES_PER_ROLE:
        raise AnnotationError(
            f"{count} value globs in all, over the limit of {MAX_VALUES_PER_ROLE} per role; "
            f"{_FEWER_VALUES}"
        )
    entries = tuple(
        _compile_entry(pattern, value, default_label_key) for pattern, value in document.items()
    )
    return Permissions(annotation_key, entries)


# Compiled annotations by (text, annotation key, default label key). A cluster's roles repeat a
# few annotations thousands of times (one per tenant namespace), and a compiled ``Permissions`` is
# immutable (its memo only ever caches a pure function of it), so identical texts compile and
# validate once and share one object. Entries outlive the roles that carried them, and a role
# rewritten with ever new texts must not pile them up: the cache is bounded in entries, in the
# size of a cached text and in the size of all cached texts together (a compiled annotation
# takes some 20 times its text), oldest first out. Annotations written to be unique cost what
# they did without the cache.
_CACHE_ENTRIES = 4096
_CACHE_TEXT = 8192
_CACHE_TEXTS = 1024 * 1024
_cache: OrderedDict[tuple[str, str, str | None], Permissions | str] = OrderedDict()
_cache_chars = 0  # the length of every cached text, added up
_cache_lock = threading.Lock()  # watch threads compile concurrently


def _parse_cached(raw: str, key: str, default_label_key: str | None) -> Permissions:
    """``parse_permissions``, through the cache; an error is cached as its message."""
    global _cache_chars
    if len(raw) > _CACHE_TEXT:
        return parse_permissions(raw, annotation_key=key, default_label_key=default_label_key)
    cache_key = (raw, key, default_label_key)
    with _cache_lock:
        found = _cache.get(cache_key)
    if found is None:
        try:
            found = parse_permissions(raw, annotation_key=key, default_label_key=default_label_key)
        except AnnotationError as exc:
            found = str(exc)
        with _cache_lock:
            if cache_key not in _cache:
                _cache_chars += len(raw)
            _cache[cache_key] = found
            while len(_cache) > _CACHE_ENTRIES or _cache_chars > _CACHE_TEXTS:
                (oldest, _, _), _ = _cache.popitem(last=False)
                _cache_chars -= len(oldest)
    if isinstance(found, str):
        raise AnnotationError(found)
    return found


def permissions_of(
    annotations: Mapping[str, str], keys: Sequence[str], default_label_key: str | None
) -> Permissions | None:
    """The compiled permissions a role's annotations carry, or None when it carries none."""
    present = [k for k in keys if k in annotations]
    if not present:
        return None
    if len(present) > 1:
        raise AnnotationError(
            f"the role carries more than one permission annotation ({', '.join(present)}); "
            "keep exactly one"
        )
    key = present[0]
    try:
        return _parse_cached(annotations[key], key, default_label_key)
    except AnnotationError as exc:
        raise AnnotationError(f"invalid {key} annotation: {exc}") from None


def annotation_errors(
    annotations: Mapping[str, str], keys: Sequence[str], default_label_key: str | None
) -> list[str]:
    """Every problem of a role's permission annotation, for ``lint`` (the webhook stops at the
    first): each schema violation, then each entry that does not compile. Empty when valid."""
    try:
        permissions_of(annotations, keys, default_label_key)
    except AnnotationError as exc:
        first = str(exc)
    else:
        return []
    present = [k for k in keys if k in annotations]
    if len(present) != 1:
        return [first]
    key = present[0]
    try:
        document = json.loads(annotations[key])
    except (RecursionError, TypeError, ValueError):
        return [first]
    if not _VALID(document):
        found = [
            f"invalid {key} annotation: schema violation at "
            f"{'/'.join(str(p) for p in e.absolute_path) or 'the top level'}: {_explain(e)}"
            for e in sorted(
                _VALIDATOR.iter_errors(document), key=lambda e: [str(p) for p in e.absolute_path]
            )
        ]
        return list(dict.fromkeys(found)) or [first]
    found = []
    for pattern, value in document.items():
        try:
            _compile_entry(pattern, value, default_label_key)
        except AnnotationError as exc:
            found.append(f"invalid {key} annotation: {exc}")
    return found or [first]
