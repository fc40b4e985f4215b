"""``test``: policy suites run offline as ``check`` answers, compared with their expectations;
the example suite shipped in manifests/policy-tests passes (so CI runs it with the tests)."""

from __future__ import annotations

import json
from pathlib import Path
from xml.etree import ElementTree

import pytest
import yaml
from junitparser import JUnitXml

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


# -- JUnit: what CI publishers read ----------------------------------------------------------------


def _junit(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, JUnitXml, str]:
    code = main(["test", *args, "-o", "junit"])
    captured = capsys.readouterr()
    return code, JUnitXml.fromstring(captured.out), captured.err


def test_junit_carries_counts_and_times(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _suite(tmp_path, {**ALICE_A, "name": "ok", "expect": "allowed"},
           {**ALICE_A, "name": "wrong", "expect": "denied"})  # fmt: skip
    code, report, _ = _junit([str(tmp_path)], capsys)
    assert code == 1
    (suite,) = list(report)
    assert (suite.name, suite.tests, suite.failures, suite.errors) == (tmp_path.name, 2, 1, 0)
    assert (report.tests, report.failures, report.errors) == (2, 1, 0)
    cases = {case.name: case for case in suite}
    assert cases["ok"].is_passed and not cases["wrong"].is_passed
    assert [type(r).__name__ for r in cases["wrong"].result] == ["Failure"]
    assert all(case.time >= 0 for case in suite)
    assert suite.time == pytest.approx(sum(case.time for case in suite), abs=0.002)
    assert report.time == pytest.approx(suite.time, abs=0.002)


@pytest.mark.parametrize(
    ("content", "error"),
    [
        pytest.param("cases: [[\n", "not YAML", id="not-yaml"),
        pytest.param("cases: nope\n", "expected a mapping with a list of cases", id="no-cases"),
        pytest.param("cases: [{expect: maybe}]\n", "expect must be one of", id="bad-verdict"),
        pytest.param(b"cases: [\xff]\n", "can't decode", id="not-utf8"),
        pytest.param("rbac: [missing]\ncases: []\n", "rbac:", id="missing-rbac"),
    ],
)  # fmt: skip
def test_an_unreadable_suite_is_an_errored_case_and_the_others_still_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | bytes, error: str
) -> None:
    good = tmp_path / "good"
    good.mkdir()
    _suite(good, {**ALICE_A, "name": "ok", "expect": "allowed"})
    bad = tmp_path / "bad" / "label-rbac-test.yaml"
    bad.parent.mkdir()
    if isinstance(content, bytes):
        bad.write_bytes(content)
    else:
        bad.write_text(content)
    code, report, err = _junit([str(good), str(bad.parent)], capsys)
    assert code == 2
    assert error in err
    assert (report.tests, report.failures, report.errors) == (2, 0, 1)
    suites = {suite.name: suite for suite in report}
    assert suites["good"].errors == 0 and [c.name for c in suites["good"]] == ["ok"]
    (broken,) = suites[str(bad)]
    (result,) = broken.result
    assert type(result).__name__ == "Error"
    assert error in (result.message or "") and result.type == "SuiteNotReadable"


def test_a_path_without_suites_is_an_errored_case(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, report, err = _junit([str(tmp_path / "absent")], capsys)
    assert code == 2 and "no such file or directory" in err
    assert (report.tests, report.errors) == (1, 1)


@pytest.mark.parametrize("output", ["table", "json"])
def test_the_other_outputs_report_an_unreadable_suite_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], output: str
) -> None:
    (tmp_path / "label-rbac-test.yaml").write_text("cases: [[\n")
    assert main(["test", str(tmp_path), "-o", output]) == 2
    out = capsys.readouterr().out
    if output == "json":
        data = json.loads(out)
        assert (data["passed"], data["failed"], data["errors"]) == (0, 0, 1)
        assert "not YAML" in data["cases"][0]["error"]
    else:
        assert "ERROR" in out and "0 passed, 0 failed, 1 could not be read" in out
