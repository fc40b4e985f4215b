"""``test``: policy tests for CI. A suite is a ``label-rbac-test.yaml`` file naming RBAC manifests
and cases (a request, or objects, and the expected verdict, optionally with message fragments);
each case is answered offline exactly as ``check`` answers it, and compared.

Output is a table, JSON or JUnit XML (``-o``); exit 1 when any case does not match, 2 when a
suite cannot be read. A suite that cannot be read is in the output too, as an errored case (a
JUnit ``error``), so a CI publisher shows it rather than "no results", and the others still run.
docs/cli.md#policy-tests describes the format.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import yaml

from app.cli.check import answers
from app.cli.inputs import CliError, Loaded, one_line, policy_settings, served
from app.engine.kinds import snapshot_from_objects
from app.engine.model import Resource
from app.engine.selectors import SelectorError, parse_selector
from app.source.static import ManifestError, read_manifests

SUITE_FILE = "label-rbac-test.yaml"
VERDICTS = ("allowed", "denied", "error")
_CASE_KEYS = frozenset(
    {"name", "as", "groups", "verb", "resource", "namespace", "objectName", "labels",
     "selector", "file", "review", "expect", "message", "reason"}
)  # fmt: skip
_POLICY_KEYS = {
    "annotationKeys": "annotation_keys",
    "placementKeys": "placement_keys",
    "defaultLabelKey": "default_label_key",
    "allowUnlabeled": "allow_unlabeled",
    "unrestrictedReads": "unrestricted_reads",
    "mode": "mode",
}


@dataclass
class Outcome:
    """One case compared: what was expected, what the cluster would answer."""

    suite: str
    name: str
    expected: str
    got: str
    reason: str
    message: str
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0
    error: str = ""  # the suite could not be read: why (then it is the suite's only outcome)

    @property
    def passed(self) -> bool:
        return not self.problems and not self.error

    def as_dict(self) -> dict[str, Any]:
        return {
            "suite": self.suite,
            "name": self.name,
            "expected": self.expected,
            "got": self.got,
            "reason": self.reason,
            "message": self.message,
            "passed": self.passed,
            "problems": self.problems,
            "error": self.error,
            "seconds": round(self.seconds, 6),
        }


def unreadable(path: Path, exc: Exception) -> Outcome:
    """A suite (or a path named) that could not be read, as one errored outcome."""
    return Outcome(str(path), "(suite could not be read)", "", "error", "", "", error=str(exc))


def find_suites(paths: Sequence[Path]) -> list[Path]:
    """The suite files named, or found (recursively, sorted) in the directories named."""
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            found += sorted(path.rglob(SUITE_FILE))
        elif path.is_file():
            found.append(path)
        else:
            raise CliError(f"{path}: no such file or directory")
    if not found:
        raise CliError(f"no {SUITE_FILE} in {', '.join(map(str, paths))}")
    return found


def _load(path: Path) -> Mapping[str, Any]:
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(f"{path}: {exc}") from None
    except yaml.YAMLError as exc:
        raise CliError(f"{path}: not YAML: {exc}") from None
    if not isinstance(document, Mapping) or not isinstance(document.get("cases"), list):
        raise CliError(f"{path}: expected a mapping with a list of cases")
    return document


def _strings(value: object, where: str) -> list[str]:
    if value is None:
        return []
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise CliError(f"{where}: expected a string or a list of strings")
    return values


def _settings_args(base: argparse.Namespace, policy: object, where: str) -> argparse.Namespace:
    """The command's policy flags, overridden by the suite's ``policy`` mapping."""
    merged = argparse.Namespace(**vars(base))
    if policy is None:
        return merged
    if not isinstance(policy, Mapping) or set(policy) - set(_POLICY_KEYS):
        raise CliError(f"{where}: policy takes only {', '.join(_POLICY_KEYS)}")
    for key, value in policy.items():
        setattr(merged, _POLICY_KEYS[key], value)
    return merged


def _loaded(path: Path, document: Mapping[str, Any], settings: Any) -> Loaded:
    """The suite's RBAC (``rbac``: files or directories relative to it; default its own)."""
    paths = [path.parent / p for p in _strings(document.get("rbac"), f"{path}: rbac")]
    paths = paths or [path.parent]
    try:
        objects = [(k, o) for k, o in read_manifests(*paths) if k]
    except (OSError, ManifestError) as exc:
        raise CliError(f"{path}: rbac: {exc}") from None
    return Loaded(snapshot_from_objects(objects, settings.compiler), str(path), objects)


def _case_args(case: Mapping[str, Any], base: Path, where: str) -> argparse.Namespace:
    """The ``check`` arguments a case stands for."""
    unknown = set(case) - _CASE_KEYS
    if unknown:
        raise CliError(f"{where}: unknown key {sorted(unknown)[0]!r}")
    resource = case.get("resource")
    selector = case.get("selector")
    labels = case.get("labels") or {}
    if not isinstance(labels, Mapping):
        raise CliError(f"{where}: labels: expected a mapping")
    try:
        parsed_selector = parse_selector(str(selector)) if selector is not None else None
        parsed_resource = Resource.parse(str(resource)) if resource is not None else None
    except (SelectorError, ValueError) as exc:
        raise CliError(f"{where}: {exc}") from None
    return argparse.Namespace(
        review=base / case["review"] if case.get("review") else None,
        filename=str(base / case["file"]) if case.get("file") else None,
        user=case.get("as"),
        group=_strings(case.get("groups"), f"{where}: groups"),
        verb=case.get("verb"),
        selector=parsed_selector,
        resource=parsed_resource,
        namespace=str(case.get("namespace") or ""),
        name=str(case.get("objectName") or ""),
        label=[(str(k), str(v)) for k, v in labels.items()],
        request=[],
        subresource=None,
        all_namespaces=False,
        list=False,
        quiet=False,
        node_authorizer=False,
        kubeconfig=None,
        context=None,
    )


def _judge(
    suite: str, index: int, case: object, base: Path, loaded: Loaded, args: argparse.Namespace
) -> Outcome:
    where = f"{suite}: case {index + 1}"
    if not isinstance(case, Mapping):
        raise CliError(f"{where}: expected a mapping")
    name = str(case.get("name") or f"case {index + 1}")
    expected = case.get("expect")
    if expected not in VERDICTS:
        raise CliError(f"{where} ({name}): expect must be one of {', '.join(VERDICTS)}")
    fragments = _strings(case.get("message"), f"{where}: message")
    settings = policy_settings(args)
    asked = _case_args(case, base, where)  # a malformed case is the suite's error, not a result
    try:
        found = answers(asked, settings, loaded, served(loaded))
    except (CliError, ManifestError) as exc:
        got, reason, text = "error", "", str(exc)
    else:
        denied = [a for a in found if not a["allowed"]]
        got = "denied" if denied else "allowed"
        reason = ",".join(dict.fromkeys(a["reason"] for a in denied or found))
        text = "; ".join(
            dict.fromkeys(m for a in found for m in [a["message"], *a["violations"]] if m)
        )
    outcome = Outcome(suite, name, str(expected), got, reason, text)
    if got != expected:
        outcome.problems.append(f"expected {expected}, got {got}")
    outcome.problems += [f"message lacks {f!r}" for f in fragments if f not in text]
    if case.get("reason") is not None and case["reason"] not in reason.split(","):
        outcome.problems.append(f"expected reason {case['reason']}, got {reason or 'none'}")
    return outcome


def run_suite(path: Path, args: argparse.Namespace) -> list[Outcome]:
    document = _load(path)
    suite_args = _settings_args(args, document.get("policy"), str(path))
    loaded = _loaded(path, document, policy_settings(suite_args))
    suite = str(document.get("name") or path.parent.name)
    outcomes = []
    for i, case in enumerate(document["cases"]):
        start = time.perf_counter()
        outcome = _judge(suite, i, case, path.parent, loaded, suite_args)
        outcome.seconds = time.perf_counter() - start
        outcomes.append(outcome)
    return outcomes


def run_paths(paths: Sequence[Path], args: argparse.Namespace) -> list[Outcome]:
    """Every suite of ``paths`` run; one that cannot be read is an errored outcome."""
    outcomes: list[Outcome] = []
    for named in paths:
        try:
            suites = find_suites([named])
        except CliError as exc:
            outcomes.append(unreadable(named, exc))
            continue
        for path in suites:
            try:
                outcomes += run_suite(path, args)
            except (CliError, ManifestError) as exc:
                outcomes.append(unreadable(path, exc))
    return outcomes


def _table(outcomes: Sequence[Outcome]) -> str:
    from app.cli.audit import table

    rows = [[o.suite, o.name, o.expected or "-", o.got, _result(o)] for o in outcomes]
    text = table(["SUITE", "CASE", "EXPECTED", "GOT", "RESULT"], rows)
    for o in outcomes:
        if o.error:
            text += f"\nERROR {o.suite}: {one_line(o.error)}\n"
        elif not o.passed:
            text += f"\nFAIL {o.suite}: {o.name}: {'; '.join(o.problems)}\n  answer: {o.message}\n"
    failed, errors = _counts(outcomes)
    summary = f"\n{len(outcomes) - failed - errors} passed, {failed} failed"
    return text + summary + (f", {errors} could not be read\n" if errors else "\n")


def _result(outcome: Outcome) -> str:
    return "ERROR" if outcome.error else "pass" if outcome.passed else "FAIL"


def _counts(outcomes: Sequence[Outcome]) -> tuple[int, int]:
    """(failed, errored) outcomes."""
    errors = sum(bool(o.error) for o in outcomes)
    return sum(not o.passed for o in outcomes) - errors, errors


def junit(outcomes: Sequence[Outcome]) -> str:
    """JUnit XML as CI systems read it: one testsuite per suite, one testcase per case (an
    ``error`` for a suite that could not be read, a ``failure`` per mismatch), with counts and
    times (seconds) on every suite and on the whole."""
    root = ElementTree.Element("testsuites", name="label-rbac")
    suites: dict[str, ElementTree.Element] = {}
    for o in outcomes:
        suite = suites.get(o.suite)
        if suite is None:
            suite = suites[o.suite] = ElementTree.SubElement(root, "testsuite", name=o.suite)
        case = ElementTree.SubElement(
            suite, "testcase", classname=o.suite, name=o.name, time=f"{o.seconds:.3f}"
        )
        if o.error:
            error = ElementTree.SubElement(
                case, "error", message=one_line(o.error), type="SuiteNotReadable"
            )
            error.text = o.error
        elif not o.passed:
            failure = ElementTree.SubElement(case, "failure", message="; ".join(o.problems))
            failure.text = f"expected {o.expected}, got {o.got} ({o.reason}): {o.message}"
    for element in (root, *suites.values()):
        counted = list(element.iter("testcase"))
        element.set("tests", str(len(counted)))
        element.set("failures", str(sum(c.find("failure") is not None for c in counted)))
        element.set("errors", str(sum(c.find("error") is not None for c in counted)))
        element.set("skipped", "0")
        element.set("time", f"{sum(float(c.get('time') or 0) for c in counted):.3f}")
    ElementTree.indent(root)
    return ElementTree.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def cmd_test(args: argparse.Namespace) -> int:
    outcomes = run_paths(args.paths, args)
    failed, errors = _counts(outcomes)
    if args.output == "json":
        data = {
            "passed": len(outcomes) - failed - errors,
            "failed": failed,
            "errors": errors,
            "cases": [o.as_dict() for o in outcomes],
        }
        print(json.dumps(data, indent=2))
    elif args.output == "junit":
        print(junit(outcomes), end="")
    else:
        print(_table(outcomes), end="")
    for o in outcomes:
        if o.error:
            print(f"test: {one_line(o.error)}", file=sys.stderr)
    return 2 if errors else 1 if failed else 0
