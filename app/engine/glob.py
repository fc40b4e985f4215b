"""Wildcard globs (``*`` any run of characters, ``?`` any one) matched in linear time.

Globs come from permission annotations, which namespace admins may write, and are matched against
label values and resource names on every request and inside the escalation check. A backtracking
regular expression (``*`` turned into ``.*``) takes time exponential in the number of stars on a
near miss: ``*a*a*a*a*a*a*a*b`` against 63 ``a`` runs for over 20 s while holding the GIL. So no
glob ever meets ``re``:

* a glob without ``?`` is matched by its ``*``-separated segments: the first must be a prefix,
  the last a suffix, and each middle one is found leftmost after the previous (taking the
  leftmost occurrence never loses a match). That is one ``str.find`` per segment, so
  O(|pattern|·|input|) at worst and about linear in practice;
* a glob with ``?`` runs as a bit-parallel automaton: one integer holds every pattern position
  reached so far, and each input character costs a handful of integer operations. Time is
  O(|input|·⌈|pattern|/64⌉) whatever the pattern, and the schema bounds the pattern.

``covers`` decides whether one glob matches every string another matches, soundly and in
O(|a|·|b|): it refuses what it cannot prove (see ``Glob.covers``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial

STAR = "*"
ANY = "?"
WILDCARDS = frozenset(STAR + ANY)


def normalize(text: str) -> str:
    """The same glob, canonical: each run of wildcards becomes its ``?``s followed by one ``*``.

    A run of wildcards with k ``?`` and at least one ``*`` matches any k or more characters, in
    whatever order it is written, so ``*?*`` and ``?*`` are the same glob. Canonical runs keep
    the automaton free of chains of stars and let ``covers`` compare ``*?`` with ``?*``.
    """
    out: list[str] = []
    run = ""
    for ch in text + "\0":  # a sentinel that is never a wildcard flushes the last run
        if ch in WILDCARDS:
            run += ch
            continue
        if run:
            out.append(ANY * run.count(ANY) + (STAR if STAR in run else ""))
            run = ""
        out.append(ch)
    return "".join(out[:-1])


@dataclass(frozen=True, slots=True)
class _Automaton:
    """The glob's positions as bits: bit j set means "the first j tokens are matched".

    A literal or ``?`` token j moves bit j to bit j+1 on a character it accepts; a ``*`` token j
    keeps bit j on any character (its loop) and also sets bit j+1 at once (it may match nothing).
    Canonical globs have no two stars in a row, so one closure step after each move suffices.
    """

    stars: int  # bit j: token j is "*"
    # bit j: token j is a "*" or a "?" of a run that ends in "*" (the run matches k or more
    # characters, so within it a star of the other glob costs nothing)
    elastic: int
    any_char: int  # bit j+1: token j is "?"
    literal: Mapping[str, int]  # char c → bit j+1 for every token j equal to c, plus any_char
    start: int
    accept: int

    @classmethod
    def build(cls, tokens: str) -> _Automaton:
        stars = elastic = any_char = 0
        literal: dict[str, int] = {}
        for j, token in enumerate(tokens):
            if token == STAR:
                stars |= 1 << j
                elastic |= 1 << j
                k = j - 1
                while k >= 0 and tokens[k] == ANY:
                    elastic |= 1 << k
                    k -= 1
            elif token == ANY:
                any_char |= 1 << (j + 1)
            else:
                literal[token] = literal.get(token, 0) | 1 << (j + 1)
        literal = {ch: bits | any_char for ch, bits in literal.items()}
        start = 1 | ((1 & stars) << 1)
        return cls(stars, elastic, any_char, literal, start, 1 << len(tokens))

    def accepts(self, value: str) -> bool:
        stars, any_char, literal = self.stars, self.any_char, self.literal
        states = self.start
        for ch in value:
            states = ((states << 1) & literal.get(ch, any_char)) | (states & stars)
            states |= (states & stars) << 1
            if not states:
                return False
        return bool(states & self.accept)

    def accepts_glob(self, tokens: str) -> bool:
        """Whether this glob matches ``tokens`` read as a glob, symbol by symbol.

        A literal token must meet the same character, a ``?`` token a literal or a ``?``; a run
        of k ``?`` ending in ``*`` (k or more characters) absorbs any run of symbols holding at
        least k that are not stars. When that succeeds, every string the other glob matches is
        matched too: substitute the string's characters for the other glob's symbols, and the
        same alignment matches it (an absorbed star's text only lengthens a run that has no
        upper bound).
        """
        stars, any_char, literal = self.stars, self.any_char, self.literal
        states = self.start
        for token in tokens:
            if token == STAR:
                states &= self.elastic  # only a run ending in a star of ours can absorb it
            elif token == ANY:
                states = ((states << 1) & any_char) | (states & stars)
            else:
                states = ((states << 1) & literal.get(token, any_char)) | (states & stars)
            states |= (states & stars) << 1
            if not states:
                return False
        return bool(states & self.accept)


@dataclass(frozen=True, slots=True)
class Glob:
    """A ``*``/``?`` wildcard pattern; literals compare by equality (the common, fast case).

    Two globs are equal when their text is; the compiled forms do not take part.
    """

    text: str
    canonical: str = field(default="", compare=False, repr=False)
    _automaton: _Automaton | None = field(default=None, compare=False, repr=False)
    # The cheapest test for this glob's shape, chosen once (see _matcher).
    _match: Callable[[str], bool] | None = field(default=None, compare=False, repr=False)

    @classmethod
    def compile(cls, text: str) -> Glob:
        if not WILDCARDS.intersection(text):
            return cls(text, text)
        canonical = normalize(text)
        automaton = _Automaton.build(canonical)
        return cls(text, canonical, automaton, _matcher(canonical, automaton))

    @property
    def is_literal(self) -> bool:
        return self._automaton is None

    @property
    def is_universal(self) -> bool:
        """True when the glob matches every string (``*``, or ``**``)."""
        return self.canonical == STAR

    def matches(self, value: str) -> bool:
        match = self._match
        if match is None:
            return value == self.text
        return match(value)

    def covers(self, other: Glob) -> bool:
        """True only when every string ``other`` matches is matched by this glob too.

        Exact when ``other`` is a literal, when this glob is ``*``, and when this glob is a
        literal (a glob with a wildcard matches more than one string). Between two wildcard
        globs it accepts when this glob matches ``other`` symbol by symbol (``accepts_glob``):
        sound, O(|self|·|other|), and it proves the usual inclusions (``team-*`` covers
        ``team-a*``, ``team-??`` and ``team-?*``; ``?*`` covers ``*a``). Whatever it cannot
        prove is refused, the safe direction for every caller.
        """
        if self.is_universal or self.text == other.text:
            return True
        if other._automaton is None:
            return self.matches(other.text)
        if self._automaton is None:
            return False
        return self._automaton.accepts_glob(other.canonical)


def _matcher(canonical: str, automaton: _Automaton) -> Callable[[str], bool]:
    """The test for a wildcard glob: string methods for the usual star-only shapes."""
    if ANY in canonical:
        return automaton.accepts
    segments = canonical.split(STAR)
    if len(segments) == 2:  # "prefix*suffix", "prefix*", "*suffix", "*"
        prefix, suffix = segments
        shortest = len(prefix) + len(suffix)
        return lambda value: (
            len(value) >= shortest and value.startswith(prefix) and value.endswith(suffix)
        )
    if len(segments) == 3 and not segments[0] and not segments[2]:  # "*infix*"
        infix = segments[1]
        return lambda value: infix in value
    return partial(_matches_segments, tuple(segments))


def _matches_segments(segments: tuple[str, ...], value: str) -> bool:
    """Match a star-only glob given as its ``*``-separated segments (at least three)."""
    first, last = segments[0], segments[-1]
    end = len(value) - len(last)
    if end < len(first) or not value.startswith(first) or not value.endswith(last):
        return False
    pos = len(first)
    for segment in segments[1:-1]:
        # Leftmost is safe: any later match of this segment leaves less room for the rest.
        found = value.find(segment, pos, end)
        if found < 0:
            return False
        pos = found + len(segment)
    return True
