"""``completion bash|zsh|fish``: shell completion scripts generated from the argparse parsers, so
every subcommand, flag and fixed choice (``--verb``, ``-o``, ``--mode``...) completes as the
parser accepts it, and flags taking a file or directory complete paths.

Print the script and source it (docs/cli.md#shell-completion); it completes ``label-rbac`` and
``kubectl-label_rbac``. ``cobra`` answers kubectl's plugin completion (``kubectl label-rbac
<TAB>``): kubectl runs ``kubectl_complete-label_rbac`` with the words typed after the plugin's
name and reads the candidates as cobra's hidden ``__complete`` command prints them.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

SHELLS = ("bash", "zsh", "fish")
PROGRAMS = ("label-rbac", "kubectl-label_rbac")


@dataclass(frozen=True)
class Option:
    """One flag as completion needs it: its spellings, what follows it and its help."""

    strings: tuple[str, ...]
    takes_value: bool
    choices: tuple[str, ...]
    path: bool  # its value is a file or directory
    help: str


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    options: tuple[Option, ...]
    positional_choices: tuple[str, ...]  # e.g. who-can's VERB
    positional_paths: bool  # e.g. lint FILE...
    # What each positional word may be, in order (the last repeats): who-can's VERB, RESOURCE.
    positions: tuple[tuple[str, ...], ...] = ()


def _choices(action: argparse.Action) -> tuple[str, ...]:
    """The words an argument takes: its choices, or the ones it suggests (``completions``: any
    RBAC verb is taken, the usual ones suggested)."""
    return tuple(str(c) for c in getattr(action, "completions", None) or action.choices or ())


def _positions(positionals: Sequence[argparse.Action]) -> tuple[tuple[str, ...], ...]:
    found: list[tuple[str, ...]] = []
    for action in positionals:
        found += getattr(action, "positions", None) or [_choices(action)]
    return tuple(found)


def _option(action: argparse.Action) -> Option:
    takes_value = action.nargs != 0
    choices = _choices(action) if takes_value else ()
    path = takes_value and (action.type is Path or action.dest in ("filename",))
    return Option(tuple(action.option_strings), takes_value, choices, path, _help(action.help))


def _help(text: str | None) -> str:
    """Help as one short plain line (no characters the shells' specs treat specially)."""
    line = re.sub(r"[^A-Za-z0-9 ,./()=+-]", "", (text or "").split(";")[0])
    return " ".join(line.split())[:70]


def commands(parser: argparse.ArgumentParser) -> tuple[tuple[Option, ...], list[Command]]:
    """The top-level flags, and every subcommand with its flags and positionals."""
    top = tuple(_option(a) for a in parser._actions if a.option_strings)
    found = []
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        helps = {choice.dest: choice.help for choice in action._choices_actions}
        for name, sub in action.choices.items():
            positionals = [a for a in sub._actions if not a.option_strings]
            found.append(
                Command(
                    name,
                    _help(helps.get(name)),
                    tuple(_option(a) for a in sub._actions if a.option_strings),
                    tuple(c for a in positionals[:1] for c in _choices(a)),
                    any(a.type is Path for a in positionals),
                    _positions(positionals),
                )
            )
    return top, found


def _words(options: Sequence[Option]) -> str:
    return " ".join(s for o in options for s in o.strings)


def bash(top: Sequence[Option], found: Sequence[Command]) -> str:
    names = " ".join(c.name for c in found)
    lines = [
        "# bash completion for label-rbac, generated from its parsers (label-rbac completion bash)",
        "_label_rbac() {",
        '    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}" cmd="" i',
        "    for ((i = 1; i < COMP_CWORD; i++)); do",
        f'        case "${{COMP_WORDS[i]}}" in {names.replace(" ", "|")}) '
        'cmd="${COMP_WORDS[i]}"; break ;; esac',
        "    done",
        '    if [[ -z "$cmd" ]]; then',
        f'        COMPREPLY=($(compgen -W "{names} {_words(top)}" -- "$cur"))',
        "        return",
        "    fi",
        '    case "$cmd" in',
    ]
    for command in found:
        lines.append(f"    {command.name})")
        lines.append('        case "$prev" in')
        for option in command.options:
            spelled = "|".join(option.strings)
            if option.choices:
                reply = f'COMPREPLY=($(compgen -W "{" ".join(option.choices)}" -- "$cur"))'
                lines.append(f"            {spelled}) {reply}; return ;;")
            elif option.path:
                lines.append(
                    f'            {spelled}) COMPREPLY=($(compgen -f -- "$cur")); return ;;'
                )
            elif option.takes_value:
                lines.append(f"            {spelled}) return ;;")
        lines.append("        esac")
        words = _words(command.options)
        if command.positional_choices:
            words += " " + " ".join(command.positional_choices)
        lines.append(f'        COMPREPLY=($(compgen -W "{words}" -- "$cur"))')
        if command.positional_paths:
            lines.append('        [[ "$cur" != -* ]] && COMPREPLY+=($(compgen -f -- "$cur"))')
        lines.append("        ;;")
    lines += ["    esac", "}", *(f"complete -o filenames -F _label_rbac {p}" for p in PROGRAMS)]
    return "\n".join(lines) + "\n"


def _zsh_spec(option: Option) -> list[str]:
    """``_arguments`` specs of one flag: each spelling, its help, and what follows it."""
    follows = ""
    if option.choices:
        follows = f":value:({_zsh_words(option.choices)})"
    elif option.path:
        follows = ":path:_files"
    elif option.takes_value:
        follows = ":value: "
    return [f"'{s}[{option.help}]{follows}'" for s in option.strings]


def _zsh_words(words: Sequence[str]) -> str:
    return " ".join(w.replace(":", "\\:") for w in words)  # a colon ends the spec's part


def zsh(top: Sequence[Option], found: Sequence[Command]) -> str:
    lines = [
        f"#compdef {' '.join(PROGRAMS)}",
        "# zsh completion for label-rbac, generated from its parsers (label-rbac completion zsh)",
        "_label_rbac() {",
        "    local -a commands",
        "    commands=(",
        *(f"        '{c.name}:{c.help}'" for c in found),
        "    )",
        "    if (( CURRENT == 2 )); then",
        "        _describe -t commands 'label-rbac command' commands",
        f"        _arguments {' '.join(s for o in top for s in _zsh_spec(o))}",
        "        return",
        "    fi",
        "    shift words; (( CURRENT-- ))",
        "    case $words[1] in",
    ]
    for command in found:
        specs = [s for o in command.options for s in _zsh_spec(o)]
        if command.positional_choices:
            specs.append(f"'1:value:({_zsh_words(command.positional_choices)})'")
        if command.positional_paths:
            specs.append("'*:path:_files'")
        lines.append(f"        {command.name})")
        lines.append("            _arguments \\")
        lines += [f"                {spec} \\" for spec in specs]
        lines.append("            ;;")
    lines += ["    esac", "}", "", 'if [[ "$funcstack[1]" = "_label_rbac" ]]; then',
              '    _label_rbac "$@"', "else", f"    compdef _label_rbac {' '.join(PROGRAMS)}",
              "fi"]  # fmt: skip
    return "\n".join(lines) + "\n"


def _fish_option(program: str, condition: str, option: Option) -> str:
    parts = [f"complete -c {program} -n '{condition}'"]
    for spelled in option.strings:
        parts.append(f"-l {spelled[2:]}" if spelled.startswith("--") else f"-s {spelled[1:]}")
    if option.choices:
        parts.append(f"-x -a '{' '.join(option.choices)}'")
    elif option.path:
        parts.append("-r -F")
    elif option.takes_value:
        parts.append("-x")
    if option.help:
        parts.append(f"-d '{option.help}'")
    return " ".join(parts)


def fish(top: Sequence[Option], found: Sequence[Command]) -> str:
    names = " ".join(c.name for c in found)
    lines = ["# fish completion for label-rbac, generated from its parsers (label-rbac completion "
             "fish)"]  # fmt: skip
    for program in PROGRAMS:
        lines.append(f"complete -c {program} -f")
        first = f"not __fish_seen_subcommand_from {names}"
        lines += [_fish_option(program, first, o) for o in top]
        lines += [f"complete -c {program} -n '{first}' -a {c.name} -d '{c.help}'" for c in found]
        for command in found:
            seen = f"__fish_seen_subcommand_from {command.name}"
            lines += [_fish_option(program, seen, o) for o in command.options]
            if command.positional_choices:
                lines.append(
                    f"complete -c {program} -n '{seen}' -a '{' '.join(command.positional_choices)}'"
                )
            if command.positional_paths:
                lines.append(f"complete -c {program} -n '{seen}' -F")
    return "\n".join(lines) + "\n"


GENERATORS: dict[str, Callable[[Sequence[Option], Sequence[Command]], str]] = {
    "bash": bash,
    "zsh": zsh,
    "fish": fish,
}


# cobra's ShellCompDirective bits (spf13/cobra, completions.go): 0 lets the shell complete file
# names when no candidate fits; 4 forbids it.
DIRECTIVE_DEFAULT, DIRECTIVE_NO_FILE_COMP = 0, 4


def cobra(parser: argparse.ArgumentParser, words: Sequence[str]) -> str:
    """cobra's ``__complete`` answer for ``words`` (the last one is being completed): the
    candidates, one a line as ``word<TAB>description``, then ``:DIRECTIVE``."""
    candidates, directive = complete(parser, words)
    return "".join(f"{c}\n" for c in candidates) + f":{directive}\n"


def complete(parser: argparse.ArgumentParser, words: Sequence[str]) -> tuple[list[str], int]:
    """The candidates for the last of ``words`` and cobra's directive."""
    *before, current = list(words) or [""]
    top, found = commands(parser)
    by_name = {c.name: c for c in found}
    at = next((i for i, w in enumerate(before) if w in by_name), None)
    if at is None:
        if any(not w.startswith("-") for w in before):  # a word that is no command
            return [], DIRECTIVE_NO_FILE_COMP
        if current.startswith("-"):
            return _matching(top, current), DIRECTIVE_NO_FILE_COMP
        named = [f"{c.name}\t{c.help}" for c in found if c.name.startswith(current)]
        return named, DIRECTIVE_NO_FILE_COMP
    command = by_name[before[at]]
    spelled = {s: o for o in command.options for s in o.strings}
    typed = before[at + 1 :]
    value_of = spelled.get(typed[-1]) if typed else None
    if current.startswith("--") and "=" in current:  # --output=j
        name, _, value = current.partition("=")
        option = spelled.get(name)
        if option is None or not option.takes_value:
            return [], DIRECTIVE_NO_FILE_COMP
        return _values(option, value, f"{name}=")
    if value_of is not None and value_of.takes_value:
        return _values(value_of, current, "")
    if current.startswith("-"):
        return _matching(command.options, current), DIRECTIVE_NO_FILE_COMP
    index = _positional_index(typed, spelled)
    here = command.positions[min(index, len(command.positions) - 1)] if command.positions else ()
    if here:
        return [w for w in here if w.startswith(current)], DIRECTIVE_NO_FILE_COMP
    return [], DIRECTIVE_DEFAULT if command.positional_paths else DIRECTIVE_NO_FILE_COMP


def _values(option: Option, current: str, prefix: str) -> tuple[list[str], int]:
    if option.choices:
        found = [prefix + c for c in option.choices if c.startswith(current)]
        return found, DIRECTIVE_NO_FILE_COMP
    return [], DIRECTIVE_DEFAULT if option.path else DIRECTIVE_NO_FILE_COMP


def _matching(options: Sequence[Option], current: str) -> list[str]:
    return [
        f"{s}\t{o.help}" if o.help else s
        for o in options
        for s in o.strings
        if s.startswith(current)
    ]


def _positional_index(typed: Sequence[str], spelled: dict[str, Option]) -> int:
    """How many positional words precede the one being completed (flags and their values
    skipped)."""
    count, skip = 0, False
    for word in typed:
        if skip:
            skip = False
        elif word.startswith("-"):
            option = spelled.get(word)
            skip = option is not None and option.takes_value and "=" not in word
        else:
            count += 1
    return count


def script(shell: str, parser: argparse.ArgumentParser) -> str:
    """The completion script of ``parser`` (the command line's) for ``shell``."""
    top, found = commands(parser)
    return GENERATORS[shell](top, found)
