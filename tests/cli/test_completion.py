"""``completion bash|zsh|fish``: scripts generated from the parsers, valid in each shell, naming
every subcommand and flag, and completing as the parser accepts (bash through its own
``complete`` machinery, fish through ``complete -C``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from app.cli import main, plugin_complete
from app.cli.reference import options, subcommands
from tests.support import ROOT

SHELLS = ("bash", "zsh", "fish")


def script(shell: str, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["completion", shell]) == 0
    return capsys.readouterr().out


def run(shell: str, code: str) -> str:
    if shutil.which(shell) is None:
        if os.environ.get("CI") == "true":  # .ci/run installs them: a missing one is a failure
            pytest.fail(f"{shell} is not installed")
        pytest.skip(f"{shell} is not installed")
    done = subprocess.run([shell, "-c", code], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("shell", SHELLS)
def test_the_script_is_valid_and_names_every_command_and_flag(
    shell: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = script(shell, capsys)
    for name, parser in subcommands().items():
        assert name in text
        for flag in options(parser):
            spelled = flag.lstrip("-") if shell == "fish" else flag
            assert spelled in text, (name, flag)
    path = tmp_path / f"label-rbac.{shell}"
    path.write_text(text)
    run(shell, f"{shell} -n {path}")  # parsed, not run: a syntax error fails here


def _bash_complete(path: Path, *words: str) -> list[str]:
    code = (
        f"source {path}; COMP_WORDS=({' '.join(repr(w) for w in words)}); "
        f"COMP_CWORD={len(words) - 1}; _label_rbac; printf '%s\\n' \"${{COMPREPLY[@]}}\""
    )
    return [line for line in run("bash", code).splitlines() if line]


@pytest.mark.parametrize(
    ("words", "expected"),
    [
        pytest.param(("label-rbac", "ch"), ["check"], id="subcommand"),
        pytest.param(("label-rbac", "check", "--verb", "cr"), ["create"], id="verb-choices"),
        pytest.param(("label-rbac", "who-can", "fro"), [], id="no-unknown-verb"),
        pytest.param(("label-rbac", "who-can", "ap"), ["approve"], id="positional-choices"),
        pytest.param(("label-rbac", "audit", "-o", ""), ["table", "json", "yaml"], id="output"),
        pytest.param(("label-rbac", "test", "--"), None, id="flags"),
        pytest.param(("label-rbac", "completion", "z"), ["zsh"], id="completion-shells"),
    ],
)
def test_bash_completes_as_the_parser_accepts(
    words: tuple[str, ...],
    expected: list[str] | None,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "label-rbac.bash"
    path.write_text(script("bash", capsys))
    found = _bash_complete(path, *words)
    if expected is None:
        assert {"--output", "--mode", "--help"} <= set(found)
    else:
        assert found == expected


def test_bash_completes_paths_after_a_file_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "label-rbac.bash"
    path.write_text(script("bash", capsys))
    (tmp_path / "rbac-manifests").mkdir()
    found = _bash_complete(path, "label-rbac", "check", "--rbac-dir", str(tmp_path / "rbac-m"))
    assert found == [str(tmp_path / "rbac-manifests")]


def test_fish_completes_as_the_parser_accepts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "label-rbac.fish"
    path.write_text(script("fish", capsys))
    out = run("fish", f"source {path}; complete -C 'label-rbac check --verb cr'; "
                      "complete -C 'label-rbac aud'")  # fmt: skip
    assert [line.split("\t")[0] for line in out.splitlines()] == ["create", "audit"]


def test_zsh_loads_the_script(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "_label-rbac"
    path.write_text(script("zsh", capsys))
    out = run("zsh", f"autoload -U compinit; compinit -u -d {tmp_path}/dump; source {path}; "
                     "whence -w _label_rbac; print $_comps[label-rbac]")  # fmt: skip
    assert out.split() == ["_label_rbac:", "function", "_label_rbac"]


def test_an_unknown_shell_is_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["completion", "tcsh"]) == 2
    assert "invalid choice: 'tcsh'" in capsys.readouterr().err


# -- kubectl's plugin completion: ``kubectl label-rbac <TAB>`` -------------------------------------


def _cobra(words: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[list[str], str]:
    assert plugin_complete(words) == 0
    *lines, directive = capsys.readouterr().out.splitlines()
    return [line.split("\t")[0] for line in lines], directive


@pytest.mark.parametrize(
    ("words", "expected", "directive"),
    [
        pytest.param([""], [n for n in subcommands()], ":4", id="commands"),
        pytest.param(["ch"], ["check"], ":4", id="command-prefix"),
        pytest.param(["--v"], ["--version"], ":4", id="top-flag"),
        pytest.param(["check", "cr"], ["create"], ":4", id="verb"),
        pytest.param(["check", "b"], ["bind"], ":4", id="rbac-only-verb"),
        pytest.param(["check", "create", "configm"], ["configmaps"], ":4", id="resource"),
        pytest.param(["check", "--as", "alice", "-n", "t1", "get", "deployments"],
                     ["deployments.apps"], ":4", id="resource-after-flags"),
        pytest.param(["check", "create", "configmaps", ""], [], ":4", id="name-is-free"),
        pytest.param(["check", "--verb", "imp"],
                     ["impersonate", "impersonate:arbitrary-node", "impersonate:associated-node",
                      "impersonate:serviceaccount", "impersonate:user-info"], ":4",
                     id="verb-flag"),
        pytest.param(["check", "-o", ""], ["text", "json", "yaml"], ":4", id="output"),
        pytest.param(["check", "--output=j"], ["--output=json"], ":4", id="output-equals"),
        pytest.param(["check", "--rbac-dir", ""], [], ":0", id="directory-by-the-shell"),
        pytest.param(["check", "--as", ""], [], ":4", id="free-value"),
        pytest.param(["check", "--li"], ["--list"], ":4", id="flag"),
        pytest.param(["who-can", "get", "secr"], ["secrets"], ":4", id="who-can-resource"),
        pytest.param(["lint", ""], [], ":0", id="files-by-the-shell"),
        pytest.param(["test", "-o", "ju"], ["junit"], ":4", id="test-output"),
        pytest.param(["completion", "f"], ["fish"], ":4", id="shell"),
        pytest.param(["nope", ""], [], ":4", id="unknown-command"),
    ],
)  # fmt: skip
def test_plugin_completion_answers_as_cobra(
    words: list[str], expected: list[str], directive: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _cobra(words, capsys) == (expected, directive)


def test_plugin_completion_describes_commands_and_flags(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert plugin_complete(["check", "-q"]) == 0
    assert capsys.readouterr().out == "-q\tprint nothing the exit status is the answer\n:4\n"


PLUGIN = """#!{python}
import sys
from app.cli import {function}
sys.exit({function}())
"""


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
@pytest.mark.parametrize(
    ("words", "expected"),
    [
        pytest.param(["ch"], ["check"], id="command"),
        pytest.param(["check", "--as", "bob", "cr"], ["create"], id="verb"),
        pytest.param(["check", "create", "cm", "-o", ""], ["text", "json", "yaml"], id="output"),
    ],
)
def test_kubectl_completes_the_plugin(
    words: list[str], expected: list[str], tmp_path: Path
) -> None:
    """kubectl finds ``kubectl_complete-label_rbac`` beside the plugin and prints its answer."""
    for name, function in (("kubectl-label_rbac", "plugin_main"),
                           ("kubectl_complete-label_rbac", "plugin_complete")):  # fmt: skip
        path = tmp_path / name
        path.write_text(PLUGIN.format(python=sys.executable, function=function))
        path.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": str(ROOT), "KUBECONFIG": str(tmp_path / "none")}  # fmt: skip
    done = subprocess.run(
        ["kubectl", "__complete", "label-rbac", *words],
        capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    *lines, directive = done.stdout.splitlines()
    assert [line.split("\t")[0] for line in lines] == expected
    assert directive == ":4"
    assert "kubectl_complete-label_rbac" in done.stderr  # kubectl says whom it asked
