"""What the documentation check reads out of Markdown: links, anchors, runnable commands, flags.

Plain functions over text, so that ``tests/test_docs.py`` can run them on the repository's pages
and on small broken samples alike. Anchors follow GitHub's rules: a heading's text, lowercased,
without punctuation other than ``-`` and ``_``, spaces as ``-``, and ``-1``, ``-2``... for
repeated headings.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path

FENCE = re.compile(r"^\s{0,3}(```|~~~)\s*(\S*)")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
# [text](target) and ![alt](target), with an optional "title"; the text may hold code spans.
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
# A ```sh block whose commands the check runs is preceded by this line.
RUNNABLE = "<!-- runnable -->"
# The exit status a runnable command is expected to end with, when not 0: "# ... (exit 1)".
EXPECTED_EXIT = re.compile(r"\(exit (\d+)\)")
# Where the command line is invoked: python -m app, ./scripts/serve, or the installed script (only
# at the start of a command: "label-rbac" alone is also the product's and the namespace's name).
COMMAND = re.compile(
    r"(?:(?:\S*/)?python3?\s+-m\s+app|^\s*(?:kubectl\s+)?label-rbac|\./scripts/serve)"
    r"(?![\w.-])((?:\s+[^\s|;&<>]+)*)"
)
FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")


@dataclass(frozen=True)
class Link:
    line: int
    target: str


@dataclass(frozen=True)
class Block:
    """A fenced code block: its language, first line number, text, and whether it is runnable."""

    line: int
    lang: str
    text: str
    runnable: bool


def _lines_outside_code(text: str) -> Iterator[tuple[int, str]]:
    """(line number, line) for every line outside fenced code blocks."""
    fence = ""
    for number, line in enumerate(text.splitlines(), 1):
        opened = FENCE.match(line)
        if fence:
            if opened and opened.group(1) == fence and not opened.group(2):
                fence = ""
            continue
        if opened:
            fence = opened.group(1)
            continue
        yield number, line


def blocks(text: str) -> list[Block]:
    """Every fenced code block, marked runnable when ``RUNNABLE`` is the line before it."""
    found: list[Block] = []
    lines = text.splitlines()
    number = 0
    while number < len(lines):
        opened = FENCE.match(lines[number])
        if not opened:
            number += 1
            continue
        fence, lang = opened.groups()
        runnable = number > 0 and lines[number - 1].strip() == RUNNABLE
        end = number + 1
        while end < len(lines) and not (
            (closing := FENCE.match(lines[end])) and closing.group(1) == fence
        ):
            end += 1
        found.append(Block(number + 1, lang, "\n".join(lines[number + 1 : end]), runnable))
        number = end + 1
    return found


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's Markdown text (without the ``#`` marks)."""
    text = CODE_SPAN.sub(lambda m: m.group(2), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link shows its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = re.sub(r"(\*\*|__|\*|~~)", "", text)  # emphasis marks are not text
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every anchor a page defines: its headings' slugs (repeats numbered) and ``<a id>``."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for _, line in _lines_outside_code(text):
        found.update(HTML_ANCHOR.findall(line))
        heading = HEADING.match(line)
        if not heading:
            continue
        base = slug(heading.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(text: str) -> list[Link]:
    """Every inline link and image outside code, with its line number."""
    found = []
    for number, line in _lines_outside_code(text):
        prose = CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)
        found.extend(Link(number, m.group(1)) for m in LINK.finditer(prose))
    return found


def broken_links(page: Path, root: Path) -> list[str]:
    """What is wrong with the page's relative links: a missing file, a missing anchor, or a
    target outside ``root``. External links (with a scheme) are not followed."""
    problems = []
    text = page.read_text(encoding="utf-8")
    for link in links(text):
        target = link.target
        if not target or SCHEME.match(target):
            continue
        path, _, anchor = target.partition("#")
        where = f"{page.relative_to(root)}:{link.line}: {target}"
        resolved = (page.parent / path).resolve() if path else page
        if root.resolve() not in (resolved, *resolved.parents):
            problems.append(f"{where}: points outside the repository")
            continue
        if not resolved.exists():
            problems.append(f"{where}: no such file")
            continue
        markdown = resolved.suffix == ".md" and resolved.is_file()
        if anchor and markdown and anchor not in anchors(resolved.read_text(encoding="utf-8")):
            problems.append(f"{where}: no heading or anchor #{anchor} there")
    return problems


@dataclass(frozen=True)
class Command:
    """One command of a runnable block: its arguments after ``python -m app`` and the exit
    status the page says it ends with."""

    line: int
    text: str
    args: tuple[str, ...]
    exit: int


def logical_lines(text: str, first: int = 1) -> Iterator[tuple[int, str]]:
    """Lines of a shell block with ``\\`` continuations joined, with the first one's number."""
    pending: list[str] = []
    start = first
    for number, line in enumerate(text.splitlines(), first):
        if not pending:
            start = number
        if line.rstrip().endswith("\\"):
            pending.append(line.rstrip()[:-1])
            continue
        pending.append(line)
        yield start, " ".join(part.strip() for part in pending)
        pending = []
    if pending:
        yield start, " ".join(part.strip() for part in pending)


def runnable_commands(block: Block) -> list[Command]:
    """The commands of a runnable block. Each must call the command line (``python -m app``
    or ``label-rbac``) as one simple command: no pipes, redirections or shell expansions."""
    commands = []
    for number, line in logical_lines(block.text, block.line + 1):
        words = shlex.split(line, comments=True)
        if not words:
            continue
        expected = EXPECTED_EXIT.search(line.partition(" #")[2])
        if re.search(r"[|;&<>$`]", " ".join(words)):
            raise ValueError(f"line {number}: a runnable command must be a simple command: {line}")
        if words[0].endswith("python") or words[0].endswith("python3"):
            if words[1:3] != ["-m", "app"]:
                raise ValueError(f"line {number}: runnable commands call python -m app: {line}")
            args = words[3:]
        elif words[0] == "label-rbac":
            args = words[1:]
        elif words[:2] == ["kubectl", "label-rbac"]:
            args = words[2:]
        else:
            raise ValueError(f"line {number}: runnable commands call python -m app: {line}")
        commands.append(
            Command(number, line, tuple(args), int(expected.group(1)) if expected else 0)
        )
    return commands


@dataclass(frozen=True)
class Mention:
    """A command-line invocation named in a page, and the flags given with it."""

    line: int
    subcommand: str  # "" for the top-level parser
    flags: tuple[str, ...]


def _mentions_in(number: int, text: str, known: Collection[str]) -> Iterator[Mention]:
    for match in COMMAND.finditer(text):
        rest = match.group(1).split()
        invoked = match.group(0).split()[0]
        subcommand = "serve" if invoked == "./scripts/serve" else ""
        if not subcommand and rest and not rest[0].startswith("-"):
            subcommand = rest[0]
            if "label-rbac" in match.group(0) and subcommand not in known:
                continue  # the product's name in a message ("label-rbac policy cache ..."): no call
        yield Mention(number, subcommand, tuple(FLAG.findall(match.group(1))))


def mentions(text: str, known: Collection[str]) -> list[Mention]:
    """Every invocation of the command line with its flags: in shell blocks (one per logical
    line, up to a pipe or the next command; in a transcript only the lines after a ``$ ``
    prompt), in code spans, and in table rows whose first cell
    names a command (the flags of the whole row belong to it). ``known`` are the subcommands: a
    ``python -m app`` call of another one is a mention (and an error), a bare ``label-rbac``
    followed by another word is not a call."""
    found: list[Mention] = []
    for block in blocks(text):
        if block.lang not in ("sh", "shell", "bash", "console", ""):
            continue
        lines = list(logical_lines(block.text, block.line + 1))
        # A transcript marks its commands with a "$ " prompt; the rest is their output.
        if any(line.startswith("$ ") for _, line in lines):
            lines = [(number, line[2:]) for number, line in lines if line.startswith("$ ")]
        for number, line in lines:
            found.extend(_mentions_in(number, line.split(" #")[0], known))
    for number, line in _lines_outside_code(text):
        cells = line.split(" | ")
        if line.startswith("|") and len(cells) > 1 and COMMAND.search(cells[0]):
            first = next(_mentions_in(number, CODE_SPAN.sub(lambda m: m.group(2), cells[0]), known))
            row = " ".join(cells[1:])
            found.append(Mention(number, first.subcommand, first.flags + tuple(FLAG.findall(row))))
            continue
        for span in CODE_SPAN.finditer(line):
            found.extend(_mentions_in(number, span.group(2), known))
    return found
