"""Every bad input to the command line: one clear line on stderr, a non-zero exit, no traceback.

Each case runs the real ``python -m app`` process, as an operator would.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES
from tests.support import ROOT

Setup = Callable[[Path], list[str]]

CHECK = ["check", "--as", "bob", "--verb", "create", "--resource", "configmaps", "-n", "t1"]
ROLE_YAML = (
    "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\n"
    "metadata: {name: r, namespace: t1}\nrules: []\n"
)


def write(tmp: Path, name: str, data: str | bytes) -> Path:
    path = tmp / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data)
    return path


def rbac_dir_with(name: str, data: str | bytes) -> Setup:
    def setup(tmp: Path) -> list[str]:
        write(tmp / "rbac", "role.yaml", ROLE_YAML)
        write(tmp / "rbac", name, data)
        return [*CHECK, "--rbac-dir", str(tmp / "rbac")]

    return setup


# PyYAML's four-line message for the unclosed flow sequence above, as the one line we print.
BAD_YAML_AT = (
    "line 3, column 1: did not find expected ',' or ']' (while parsing a flow sequence started "
    "at line 2, column 11)"
)


def serve_with_rbac_dir(name: str, data: str) -> Setup:
    def setup(tmp: Path) -> list[str]:
        write(tmp / "rbac", "role.yaml", ROLE_YAML)
        write(tmp / "rbac", name, data)
        return ["serve", "--dev-tls", str(tmp / "certs"), "--rbac-dir", str(tmp / "rbac")]

    return setup


def serve_with_kubeconfig(data: str) -> Setup:
    def setup(tmp: Path) -> list[str]:
        write(tmp, "kubeconfig", data)
        return ["serve", "--dev-tls", str(tmp / "certs"), "--kubeconfig", str(tmp / "kubeconfig")]

    return setup


def args(*argv: str) -> Setup:
    return lambda tmp: [a.replace("{tmp}", str(tmp)) for a in argv]


def with_file(name: str, data: str | bytes, *argv: str) -> Setup:
    def setup(tmp: Path) -> list[str]:
        write(tmp, name, data)
        return [a.replace("{tmp}", str(tmp)) for a in argv]

    return setup


def empty_dir(command: str) -> Setup:
    def setup(tmp: Path) -> list[str]:
        (tmp / "empty").mkdir()
        write(tmp / "empty", "ns.yaml", "apiVersion: v1\nkind: Namespace\nmetadata: {name: x}\n")
        extra = CHECK[1:] if command == "check" else ["create", "configmaps"]
        extra = [] if command == "audit" else extra
        return [command, *extra, "--rbac-dir", str(tmp / "empty")]

    return setup


CASES = [
    pytest.param(rbac_dir_with("bad.yaml", "kind: Role\nmetadata: [unclosed\n"),
                 "check: {tmp}/rbac/bad.yaml: " + BAD_YAML_AT, id="bad-yaml"),
    pytest.param(serve_with_rbac_dir("bad.yaml", "kind: Role\nmetadata: [unclosed\n"),
                 "serve: --rbac-dir {tmp}/rbac: {tmp}/rbac/bad.yaml: " + BAD_YAML_AT,
                 id="serve-bad-yaml-in-rbac-dir"),
    pytest.param(serve_with_rbac_dir("bad.json", '{"kind": "Role",\n  "metadata": }\n'),
                 "serve: --rbac-dir {tmp}/rbac: {tmp}/rbac/bad.json: line 2, column 15: "
                 "Expecting value", id="serve-bad-json-in-rbac-dir"),
    pytest.param(with_file("bad.yaml", "kind: Role\nmetadata: [unclosed\n", "lint",
                           "{tmp}/bad.yaml"),
                 "lint: {tmp}/bad.yaml: " + BAD_YAML_AT, id="lint-bad-yaml"),
    pytest.param(with_file("bad.yaml", "kind: ConfigMap\nmetadata: [unclosed\n", "check",
                           "--as", "bob", "-f", "{tmp}/bad.yaml", "--rbac-dir", str(EXAMPLES)),
                 "check: -f {tmp}/bad.yaml: " + BAD_YAML_AT, id="check-f-bad-yaml"),
    pytest.param(serve_with_kubeconfig("apiVersion: v1\nclusters: [\n"),
                 "serve: kubeconfig {tmp}/kubeconfig: cannot load cluster connection settings: "
                 "line 3, column 1: expected the node content, but found '<stream end>' (while "
                 "parsing a flow node)",
                 id="serve-malformed-kubeconfig"),
    pytest.param(serve_with_kubeconfig("just text\n"),
                 "serve: kubeconfig {tmp}/kubeconfig: cannot load cluster connection settings: "
                 "not a kubeconfig (expected a mapping with clusters, users and contexts)",
                 id="serve-kubeconfig-not-a-mapping"),
    pytest.param(serve_with_kubeconfig("apiVersion: v1\nclusters: oops\ncontexts: 7\n"
                                       "current-context: c\n"),
                 "serve: kubeconfig {tmp}/kubeconfig: cannot load cluster connection settings: ",
                 id="serve-kubeconfig-wrong-shapes"),
    pytest.param(serve_with_kubeconfig("clusters: " + "[" * 5000 + "]" * 5000 + "\n"),
                 "serve: kubeconfig {tmp}/kubeconfig: cannot load cluster connection settings: "
                 "nested too deeply to be a kubeconfig", id="serve-kubeconfig-nested-deep"),
    pytest.param(with_file("kubeconfig", "apiVersion: v1\nclusters: [\n", "who-can", "get",
                           "pods", "--kubeconfig", "{tmp}/kubeconfig"),
                 "who-can: {tmp}/kubeconfig: cannot load cluster connection settings: line 3, "
                 "column 1: expected the node content", id="who-can-malformed-kubeconfig"),
    pytest.param(with_file("kubeconfig", "just text\n", "audit", "--kubeconfig",
                           "{tmp}/kubeconfig"),
                 "audit: {tmp}/kubeconfig: cannot load cluster connection settings: not a "
                 "kubeconfig", id="audit-kubeconfig-not-a-mapping"),
    pytest.param(rbac_dir_with("latin1.yaml", "kind: Role\n# caf\xe9\n".encode("latin-1")),
                 "latin1.yaml: not UTF-8 text", id="non-utf8-manifest-in-rbac-dir"),
    pytest.param(args(*CHECK, "--rbac-dir", "{tmp}/nowhere"),
                 "--rbac-dir {tmp}/nowhere: no such directory", id="missing-rbac-dir"),
    pytest.param(with_file("file.yaml", ROLE_YAML, *CHECK, "--rbac-dir", "{tmp}/file.yaml"),
                 "not a directory", id="rbac-dir-is-a-file"),
    pytest.param(empty_dir("check"), "no Role, ClusterRole, RoleBinding or ClusterRoleBinding",
                 id="empty-rbac-dir-check"),
    pytest.param(empty_dir("who-can"), "nothing to decide from", id="empty-rbac-dir-who-can"),
    pytest.param(empty_dir("audit"), "nothing to decide from", id="empty-rbac-dir-audit"),
    pytest.param(with_file("kubeconfig", "{{{ not yaml", *CHECK, "--kubeconfig",
                           "{tmp}/kubeconfig"),
                 "cannot load cluster connection settings", id="garbage-kubeconfig"),
    pytest.param(with_file("kubeconfig", "apiVersion: v1\nkind: Config\nclusters: []\n", *CHECK,
                           "--kubeconfig", "{tmp}/kubeconfig"),
                 "cannot load cluster connection settings", id="kubeconfig-without-context"),
    pytest.param(args(*CHECK, "--kubeconfig", "{tmp}/none"),
                 "--kubeconfig {tmp}/none: no such file", id="missing-kubeconfig"),
    pytest.param(with_file("kubeconfig", "apiVersion: v1\nkind: Config\nclusters: [{name: c, "
                           "cluster: {server: 'http://127.0.0.1:9'}}]\ncontexts: [{name: c, "
                           "context: {cluster: c, user: u}}]\nusers: [{name: u, user: {}}]\n"
                           "current-context: c\n", "audit", "--kubeconfig", "{tmp}/kubeconfig"),
                 "cannot read RBAC from http://127.0.0.1:9", id="unreachable-cluster"),
    pytest.param(args(*CHECK), "no RBAC to read: pass --rbac-dir DIR or --kubeconfig FILE",
                 id="no-source-at-all"),
    pytest.param(with_file("file", "x", "gen-certs", "--out", "{tmp}/file/certs", "--dns", "a"),
                 "--out {tmp}/file/certs: cannot write there", id="unwritable-gen-certs-dir"),
    pytest.param(args("gen-certs", "--out", "{tmp}/c", "--dns", "a", "--days", "-5"),
                 "invalid --days '-5'", id="negative-days"),
    pytest.param(args("gen-certs", "--out", "{tmp}/c", "--dns", "a", "--days", "0"),
                 "invalid --days '0'", id="zero-days"),
    pytest.param(args("check", "--as", "bob", "--verb", "create", "--resource", "Config Maps",
                      "--rbac-dir", str(EXAMPLES)),
                 "invalid resource 'Config Maps'", id="malformed-resource"),
    pytest.param(args("check", "--as", "bob", "--verb", "create", "--resource", "/status",
                      "--rbac-dir", str(EXAMPLES)),
                 "invalid resource '/status'", id="resource-without-name"),
    pytest.param(args("who-can", "create", "deployments..apps", "--rbac-dir", str(EXAMPLES)),
                 "invalid resource 'deployments..apps'", id="malformed-resource-who-can"),
    pytest.param(args(*CHECK, "-l", "team", "--rbac-dir", str(EXAMPLES)),
                 "invalid label 'team': expected KEY=VALUE", id="label-without-value"),
    pytest.param(args("check", "--verb", "create", "--resource", "configmaps",
                      "--rbac-dir", str(EXAMPLES)), "--as USER is required", id="no-user"),
    pytest.param(with_file("cm.yaml", b"kind: ConfigMap\nmetadata: {name: caf\xe9}\n", "check",
                           "--as", "bob", "-f", "{tmp}/cm.yaml", "--rbac-dir", str(EXAMPLES)),
                 "-f {tmp}/cm.yaml: not UTF-8 text (byte 36)", id="non-utf8-f-manifest"),
    pytest.param(with_file("empty.yaml", "# nothing\n", "check", "--as", "bob", "-f",
                           "{tmp}/empty.yaml", "--rbac-dir", str(EXAMPLES)),
                 "no Kubernetes object in it", id="f-manifest-without-object"),
    pytest.param(args("check", "--as", "bob", "-f", "{tmp}/missing.yaml", "--rbac-dir",
                      str(EXAMPLES)), "-f {tmp}/missing.yaml: No such file or directory",
                 id="missing-f-manifest"),
    pytest.param(with_file("review.json", "{not json", "check", "--review", "{tmp}/review.json",
                           "--rbac-dir", str(EXAMPLES)), "--review {tmp}/review.json: not JSON",
                 id="review-not-json"),
    pytest.param(with_file("review.json", '{"kind": "Pod"}', "check", "--review",
                           "{tmp}/review.json", "--rbac-dir", str(EXAMPLES)),
                 "kind must be AdmissionReview", id="review-not-a-review"),
    pytest.param(args("check", "--as", "bob", "--verb", "get pods", "--rbac-dir", str(EXAMPLES)),
                 "argument --verb: invalid verb 'get pods'", id="malformed-verb"),
    pytest.param(args("check", "--as", "bob", "get", "pods", "a", "b", "--rbac-dir",
                      str(EXAMPLES)), "expected VERB RESOURCE[/NAME] or VERB RESOURCE NAME",
                 id="too-many-words"),
    pytest.param(args("check", "--as", "bob", "create", "config maps", "--rbac-dir",
                      str(EXAMPLES)), "invalid resource 'config maps'", id="malformed-word"),
    pytest.param(args("chek", "--as", "bob"), "invalid choice: 'chek'; did you mean check?",
                 id="command-typo"),
    pytest.param(args("audit", "-o", "xml", "--rbac-dir", str(EXAMPLES)),
                 "argument -o/--output: invalid choice: 'xml'", id="unknown-output"),
    pytest.param(args("frobnicate"), "invalid choice: 'frobnicate'", id="unknown-command"),
    pytest.param(args("report", "--max-pass-results", "0"),
                 "--max-results and --max-pass-results must be >= 1", id="report-no-passes"),
    pytest.param(args("lint", "{tmp}/missing.yaml"), "lint: [Errno 2] No such file",
                 id="lint-missing-file"),
]  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, int, str]]:
    """Every case's process, started together (each is mostly interpreter start-up)."""
    started = {}
    for case in CASES:
        setup = case.values[0]
        assert callable(setup) and case.id is not None
        tmp = tmp_path_factory.mktemp(case.id)
        home = tmp / "home"
        home.mkdir()
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home)}
        process = subprocess.Popen(
            [sys.executable, "-m", "app", *setup(tmp)],
            cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        started[case.id] = (tmp, process)
    done = {}
    for case_id, (tmp, process) in started.items():
        _, stderr = process.communicate(timeout=120)
        done[case_id] = (tmp, process.returncode, stderr)
    return done


@pytest.mark.parametrize(("setup", "expected"), CASES)
def test_bad_input_is_one_line(
    runs: dict[str, tuple[Path, int, str]], request: pytest.FixtureRequest, setup: Setup,
    expected: str,
) -> None:  # fmt: skip
    tmp, returncode, stderr = runs[request.node.callspec.id]
    assert returncode == 2, stderr
    assert "Traceback" not in stderr
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert expected.replace("{tmp}", str(tmp)) in lines[0]
