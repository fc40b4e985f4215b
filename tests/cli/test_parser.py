"""The parsers of ``app.cli``: every argument of every command says what it is for, and a
misspelled command or choice is answered with what was meant."""

from __future__ import annotations

import argparse

import pytest

from app.cli import _parser, main
from app.cli.reference import subcommands


def _arguments() -> list[tuple[str, argparse.Action]]:
    """Every argument of the tree: the top-level parser's and each subcommand's."""
    parser = _parser()
    found = [("", a) for a in parser._actions if not isinstance(a, argparse._SubParsersAction)]
    for name, sub in subcommands(parser).items():
        found += [(name, action) for action in sub._actions]
    return found


def test_the_tree_is_walked_whole() -> None:
    found = _arguments()
    assert {name for name, _ in found} >= {"", "serve", "check", "who-can", "test", "lint"}
    assert len(found) > 100


@pytest.mark.parametrize(
    ("command", "action"),
    [pytest.param(name, a, id=f"{name or 'top'}:{'/'.join(a.option_strings) or a.dest}")
     for name, a in _arguments()],
)  # fmt: skip
def test_every_argument_has_help(command: str, action: argparse.Action) -> None:
    assert action.help and action.help != argparse.SUPPRESS, (command, action.option_strings)
    assert len(action.help.strip()) >= 10


@pytest.mark.parametrize(
    ("args", "error"),
    [
        pytest.param(["chek"], "invalid choice: 'chek'; did you mean check?", id="command"),
        pytest.param(["who-cna", "get", "pods"], "did you mean who-can?", id="command-dash"),
        pytest.param(["lnt", "x.yaml"], "did you mean lint?", id="command-short"),
        pytest.param(["audit", "-o", "jsn"], "did you mean json?", id="output"),
        pytest.param(["check", "--mode", "enforec"], "did you mean enforce?", id="mode"),
        pytest.param(["completion", "bsh"], "did you mean bash", id="shell"),
        pytest.param(["frobnicate"], "invalid choice: 'frobnicate' (choose from", id="no-close"),
    ],
)
def test_a_typo_is_answered_with_what_was_meant(
    args: list[str], error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(args) == 2
    err = capsys.readouterr().err
    assert error in err
    assert len(err.splitlines()) == 1
    if "no-close" in error:
        assert "did you mean" not in err


def test_an_unknown_flag_is_still_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """Positional words are taken wherever they stand in check, never an unknown flag."""
    assert main(["check", "get", "pods", "--frobnicate"]) == 2
    assert "unrecognized arguments: --frobnicate" in capsys.readouterr().err
    assert main(["audit", "extra"]) == 2
    assert "unrecognized arguments: extra" in capsys.readouterr().err


@pytest.mark.parametrize("command", [pytest.param(name, id=name) for name in subcommands()])
@pytest.mark.parametrize("columns", ["40", "200"])
def test_every_help_renders(
    command: str, columns: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """argparse wraps usage by the terminal's width; metavars such as KEY=VALUE[,KEY=VALUE]
    must survive the wrapping."""
    monkeypatch.setenv("COLUMNS", columns)
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: python -m app {command}")
    for action in subcommands()[command]._actions:
        assert any(s in out for s in action.option_strings or [action.metavar or action.dest])
