"""Command-line arguments are validated whole: a valid value with whitespace added at either end
(a final newline from ``$(cat file)``, a stray tab) is refused, not trimmed or half-matched.

Through ``main`` as ``python -m app`` runs it: a refused argument is exit 2 and one line.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from app.cli import main
from tests.conftest import EXAMPLES
from tests.support import WHITESPACE

CHECK = ["check", "--as", "bob", "--verb", "create", "--resource", "configmaps", "-n", "t1",
         "--rbac-dir", str(EXAMPLES)]  # fmt: skip
# A serve that got past its arguments would stop here, before serving anything.
NO_SERVE = ["--bind", "nowhere"]

FLAGS = [
    pytest.param([*CHECK, "--annotation-key"], "labelrbac.io/permissions", "invalid key",
                 id="annotation-key"),
    pytest.param([*CHECK, "--default-label-key"], "team", "invalid key", id="default-label-key"),
    pytest.param([*CHECK, "--unrestricted-reads"], "configmaps", "is not a resource pattern",
                 id="unrestricted-reads"),
    pytest.param([*CHECK[:5], *CHECK[7:], "--resource"], "configmaps", "invalid resource",
                 id="resource"),
    pytest.param([*CHECK, "-l"], "team=a", "invalid label", id="label"),
    pytest.param(["who-can", "create", "configmaps", "--rbac-dir", str(EXAMPLES), "-l"],
                 "team=a", "invalid label", id="who-can-label"),
    pytest.param(["gen-certs", "--out", "{tmp}/c", "--dns", "a", "--days"], "30",
                 "invalid --days", id="days"),
    pytest.param(["serve", *NO_SERVE, "--workers"], "2", "invalid number", id="workers"),
    pytest.param(["serve", *NO_SERVE, "--threads"], "4", "invalid number", id="threads"),
    pytest.param(["serve", *NO_SERVE, "--max-body-bytes"], "1048576", "invalid number",
                 id="max-body-bytes"),
    pytest.param(["serve", *NO_SERVE, "--max-staleness"], "30", "invalid duration",
                 id="max-staleness"),
    pytest.param(["serve", *NO_SERVE, "--drain-seconds"], "2.5", "invalid duration",
                 id="drain-seconds"),
    pytest.param(["serve", *NO_SERVE, "--watch-labels"], "services", "invalid resource",
                 id="watch-labels"),
]  # fmt: skip


@pytest.mark.parametrize("space", WHITESPACE, ids=lambda s: s.encode("unicode_escape").decode())
@pytest.mark.parametrize(("argv", "valid", "error"), FLAGS)
def test_an_argument_with_whitespace_at_either_end_is_refused(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    valid: str,
    error: str,
    space: str,
) -> None:
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    for value in (valid + space, space + valid):
        assert main([*argv, value]) == 2
        err = capsys.readouterr().err
        assert error in err and err.count("\n") == 1, err


@pytest.mark.parametrize(
    ("flag", "value", "error"),
    [
        pytest.param("--max-staleness", "nan", "invalid duration", id="nan-staleness"),
        pytest.param("--max-staleness", "inf", "invalid duration", id="inf-staleness"),
        pytest.param("--workers", "\u0663", "invalid number", id="arabic-indic-digit"),
        pytest.param("--workers", "1_0", "invalid number", id="underscore"),
        pytest.param("--threads", "\u00b2", "invalid number", id="superscript-two"),
    ],
)
def test_numbers_are_ascii_decimals(
    capsys: pytest.CaptureFixture[str], flag: str, value: str, error: str
) -> None:
    assert main(["serve", *NO_SERVE, flag, value]) == 2
    assert error in capsys.readouterr().err


def test_the_valid_values_pass(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [*CHECK, "--annotation-key", "labelrbac.io/permissions", "--default-label-key", "team",
            "--unrestricted-reads", "configmaps", "-l", "team=a"]  # fmt: skip
    assert main(argv) in (0, 1)  # decided: allowed or denied, not a usage error
    assert "invalid" not in capsys.readouterr().err
    out = tmp_path / "certs"
    assert main(["gen-certs", "--out", str(out), "--dns", "a", "--days", "30"]) == 0
    assert (out / "tls.crt").exists()


READ = ["check", "--as", "bob", "--verb", "list", "--resource", "configmaps", "-n", "t1",
        "--rbac-dir", str(EXAMPLES), "--selector"]  # fmt: skip
# What the Kubernetes selector lexer skips between and around terms; everything else is text.
SELECTOR_BLANKS = {" ", "\t", "\r", "\n", "\r\n"}


@pytest.mark.parametrize("space", WHITESPACE, ids=lambda s: s.encode("unicode_escape").decode())
def test_a_selector_skips_the_blanks_kubernetes_skips_and_refuses_other_whitespace(
    capsys: pytest.CaptureFixture[str], space: str
) -> None:
    assert main([*READ, "team=a,env in (dev)"]) in (0, 1)
    expected = capsys.readouterr()
    for value in (f"team=a{space},env in (dev)", f"team=a,env in (dev{space})", f"{space}team=a"):
        code = main([*READ, value])
        decided = capsys.readouterr()
        if space in SELECTOR_BLANKS:
            assert code in (0, 1) and decided.err == expected.err, decided.err
            if value.endswith("(dev)") or value.endswith(f"{space})"):
                assert decided.out == expected.out
        else:
            assert code == 2 and "invalid label selector" in decided.err, (value, decided)
