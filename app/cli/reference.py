"""The command-line reference in docs/cli.md, generated from the argparse parsers of ``app.cli``.

``python -m app.cli.reference`` rewrites the part of docs/cli.md below ``MARKER`` (the prose above
it is kept as written); ``--check`` exits 1 when the file differs from what the parsers generate.
Only the documentation uses this module: nothing on the request path imports it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from app.cli import _parser

PROG = "python -m app"
DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
MARKER = (
    "<!-- Generated from the parsers in app/cli/__init__.py by `python -m app.cli.reference`: "
    "edit the parsers, not the text below. -->"
)
REGENERATE = ".venv/bin/python -m app.cli.reference"


def subcommands(
    parser: argparse.ArgumentParser | None = None,
) -> dict[str, argparse.ArgumentParser]:
    """Each subcommand's parser by name, in the order ``--help`` lists them."""
    parser = parser or _parser(PROG)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def options(parser: argparse.ArgumentParser) -> set[str]:
    """Every option string the parser accepts (``--rbac-dir``, ``-n``, ``--help``, ...)."""
    return set(parser._option_string_actions)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _value(action: argparse.Action) -> str:
    if action.nargs == 0:
        return ""
    if action.choices is not None:
        shown = "|".join(str(c) for c in action.choices)
    else:
        metavar = action.metavar
        shown = metavar if isinstance(metavar, str) else action.dest.upper()
    if action.nargs == "?":
        return f"[{shown}]"
    if action.nargs in ("+", "*"):
        return f"{shown}..."
    return shown


def _default(action: argparse.Action) -> str:
    default = action.default
    if action.nargs == 0 or default in (None, [], "", argparse.SUPPRESS):
        return ""
    return f"`{default}`"


def _notes(action: argparse.Action) -> str:
    text = action.help or ""
    if text == argparse.SUPPRESS:
        return ""
    if action.required and action.option_strings:
        text = f"required. {text}".strip()
    if isinstance(action, argparse._AppendAction) and "repeatable" not in text:
        text = f"{text} (repeatable)".strip()
    return text


def _table(actions: Sequence[argparse.Action]) -> list[str]:
    rows = ["| argument | value | default | what |", "|---|---|---|---|"]
    for action in actions:
        names = ", ".join(f"`{o}`" for o in action.option_strings)
        names = names or f"`{action.metavar or action.dest}`"
        value = _value(action)
        value = f"`{value}`" if value and action.option_strings else ""
        rows.append(
            f"| {names} | {_cell(value)} | {_cell(_default(action))} | {_cell(_notes(action))} |"
        )
    return rows


def _shown(action: argparse.Action) -> bool:
    return action.help != argparse.SUPPRESS and not isinstance(action, argparse._SubParsersAction)


def _section(title: str, parser: argparse.ArgumentParser, summary: str) -> list[str]:
    lines = [f"### {title}", ""]
    if summary:
        lines += [f"{summary}.", ""]
    for group in parser._action_groups:
        actions = [a for a in group._group_actions if _shown(a)]
        if not actions:
            continue
        lines += [f"**{group.title}**", "", *_table(actions), ""]
    return lines


def render(parser: argparse.ArgumentParser | None = None) -> str:
    """The generated reference: the main parser, then each subcommand."""
    parser = parser or _parser(PROG)
    helps = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
    lines = [
        "## Reference",
        "",
        f"`{PROG}` and the installed `label-rbac` take the same arguments.",
        "",
    ]
    lines += _section(PROG, parser, parser.description or "")
    for name, sub in subcommands(parser).items():
        lines += _section(f"{PROG} {name}", sub, helps.get(name, ""))
    return "\n".join(lines).rstrip() + "\n"


def generate(current: str) -> str:
    """``current`` with everything below the marker replaced by the generated reference."""
    head = current.split(MARKER, 1)[0].rstrip()
    return f"{head}\n\n{MARKER}\n\n{render()}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app.cli.reference", description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/cli.md is stale")
    args = parser.parse_args(argv)
    current = DOC.read_text(encoding="utf-8")
    wanted = generate(current)
    if args.check:
        if current != wanted:
            print(f"{DOC} is stale: run {REGENERATE}", file=sys.stderr)
            return 1
        return 0
    if current != wanted:
        DOC.write_text(wanted, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
