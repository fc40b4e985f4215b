"""``test``: policy suites run offline as ``check`` answers, compared with their expectations;
the example suite shipped in manifests/policy-tests passes (so CI runs it with the tests)."""

from __future__ import annotations

import json
from pathlib import Path
from xml.etree import ElementTree

import pytest
import yaml

from app.cli import main
from tests.conftest import EXAMPLES
from tests.support import ROOT

SHIPPED = ROOT / "manifests" / "policy-tests"


def test_the_shipped_suite_passes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["test", str(SHIPPED), "-o", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["failed"] == 0 and data["passed"] == len(data["cases"]) >= 10
    assert {c["got"] for c in data["cases"]} == {"allowed", "denied", "error"}


def _suite(tmp_path: Path, *cases: dict[str, object], **more: object) -> Path:
    path = tmp_path / "label-rbac-test.yaml"
    path.write_text(yaml.safe_dump({"rbac": [str(EXAMPLES)], "cases": list(cases), **more}))
    return path


ALICE_A = {"as": "alice", "verb": "create", "resource": "configmaps", "namespace": "t1",
           "labels": {"team": "a"}}  # fmt: skip


@pytest.mark.parametrize(
    ("case", "problem"),
    [
        pytest.param({**ALICE_A, "expect": "denied"}, "expected denied, got allowed",
                     id="wrong-verdict"),
        pytest.param({**ALICE_A, "labels": {"team": "b"}, "expect": "denied",
                      "message": "team=b is fine"}, "message lacks 'team=b is fine'",
                     id="missing-fragment"),
        pytest.param({**ALICE_A, "labels": {"team": "b"}, "expect": "denied",
                      "reason": "NoGrantingRole"},
                     "expected reason NoGrantingRole, got LabelNotPermitted", id="wrong-reason"),
        pytest.param({**ALICE_A, "resource": "cm", "expect": "allowed"},
                     "expected allowed, got error", id="error-unexpected"),
    ],
)  # fmt: skip
def test_a_mismatch_fails_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: dict[str, object], problem: str
) -> None:
    path = _suite(tmp_path, {**ALICE_A, "name": "fine", "expect": "allowed"}, {"name": "x", **case})
    assert main(["test", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert f"FAIL {tmp_path.name}: x: {problem}" in out
    assert "1 passed, 1 failed" in out
    assert main(["test", str(path), "-o", "junit"]) == 1
    root = ElementTree.fromstring(capsys.readouterr().out)
    (suite,) = root.findall("testsuite")
    assert (suite.get("tests"), suite.get("failures")) == ("2", "1")
    failure = root.find(".//testcase[@name='x']/failure")
    assert failure is not None and problem in (failure.get("message") or "")


def test_the_suites_policy_flags_apply(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    case = {**ALICE_A, "labels": {"team": "b"}, "expect": "allowed"}
    _suite(tmp_path, case, policy={"mode": "warn"})
    assert main(["test", str(tmp_path)]) == 0


@pytest.mark.parametrize(
    ("content", "error"),
    [
        pytest.param("cases: nope\n", "expected a mapping with a list of cases", id="no-cases"),
        pytest.param("cases: [{expect: maybe}]\n", "expect must be one of", id="bad-verdict"),
        pytest.param("cases: [{expect: allowed, nmae: x}]\n", "unknown key 'nmae'",
                     id="unknown-key"),
        pytest.param("cases: [[\n", "not YAML", id="not-yaml"),
    ],
)  # fmt: skip
def test_a_bad_suite_is_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, error: str
) -> None:
    (tmp_path / "label-rbac-test.yaml").write_text(content)
    assert main(["test", str(tmp_path)]) == 2
    assert error in capsys.readouterr().err


def test_a_directory_without_suites_is_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["test", str(tmp_path)]) == 2
    assert "no label-rbac-test.yaml" in capsys.readouterr().err
