"""The command line: check, gen-certs and lint (in-process through ``main``, plus one real run)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509

from app.cli import main
from app.cli.check import impersonated
from tests.conftest import EXAMPLES
from tests.support import REVIEWS, ROOT, load_review

CHECK = ["check", "--rbac-dir", str(EXAMPLES)]


@pytest.mark.parametrize(
    ("args", "code", "expected"),
    [
        pytest.param(
            ["--user", "alice", "--verb", "create", "--resource", "configmaps",
             "--namespace", "t1", "--label", "team=a"],
            0, "allowed (LabelsPermitted)", id="alice-own-bucket",
        ),
        pytest.param(
            ["--user", "bob", "--verb", "create", "--resource", "configmaps",
             "--namespace", "t1", "--name", "c2", "--label", "team=a"],
            1, 'label team="a" is not permitted (role t1/team-b allows team in [b])',
            id="bob-foreign-bucket",
        ),
        pytest.param(
            ["--user", "erin", "--group", "platform", "--verb", "patch",
             "--resource", "deployments.apps", "--namespace", "t2", "--label", "tier=shared-db"],
            0, "permitted by clusterrole platform-ops", id="group-clusterrole-glob",
        ),
        pytest.param(
            ["--user", "system:serviceaccount:t1:ci-deployer", "--verb", "update",
             "--resource", "deployments.apps", "--namespace", "t1", "--name", "api",
             "--label", "team=a"],
            1, 'denied (403 NoGrantingRole): RBAC refuses it: no role bound to '
            '"system:serviceaccount:t1:ci-deployer" grants update on deployments.apps in namespace '
            '"t1"', id="resource-names-do-not-match-other-names",
        ),
        pytest.param(
            ["--user", "bob", "--verb", "delete", "--resource", "secrets",
             "--namespace", "t1", "--name", "db"],
            1, "the existing object has no label team", id="unlabeled-object-denied",
        ),
        pytest.param(
            ["--user", "bob", "--verb", "deletecollection", "--resource", "secrets",
             "--namespace", "t1", "--name", "db"],
            1, 'may not deletecollection secrets "db" in namespace "t1"',
            id="deletecollection-names-no-object-to-rbac",
        ),
        pytest.param(
            ["--user", "bob", "--verb", "delete", "--resource", "secrets",
             "--namespace", "t1", "--name", "db", "--allow-unlabeled"],
            0, "warning: object has no label team", id="allow-unlabeled-warns",
        ),
        pytest.param(
            ["--as", "bob", "--verb", "create", "--resource", "configmaps", "-n", "t1",
             "--name", "c2", "-l", "team=a", "--mode", "warn"],
            0, 'allowed in warn mode, would be denied (LabelNotPermitted): user "bob" may not '
            'create configmaps "c2" in namespace "t1": label team="a" is not permitted',
            id="global-warn-mode",
        ),
    ],
)  # fmt: skip
def test_check_explains(
    args: list[str], code: int, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*CHECK, *args]) == code
    assert expected in capsys.readouterr().out


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["--user", "bob"], id="missing-verb-and-resource"),
        pytest.param(
            ["--user", "b", "--verb", "create", "--resource", "pods", "--label", "oops"],
            id="bad-label",
        ),
    ],
)
def test_check_usage_errors_exit_2(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*CHECK, *args]) == 2
    assert "check:" in capsys.readouterr().err


def akraino_rbac(tmp_path: Path) -> Path:
    """The recorded Akraino scenario: Role default/create-intent bound to alice and tenants."""
    rbac = tmp_path / "rbac"
    rbac.mkdir()
    for name in ("a001-create-roles", "a002-create-rolebindings"):
        obj = load_review(name)["request"]["object"]
        (rbac / f"{name}.json").write_text(json.dumps(obj))
    return rbac


@pytest.mark.parametrize(
    ("review", "code"),
    [
        pytest.param("a003-create-mwan3policies", 0, id="app-intent-allowed"),
        pytest.param("a004-create-mwan3policies", 1, id="k8s-service-denied"),
    ],
)
def test_check_review_file_with_akraino_flags(
    tmp_path: Path, review: str, code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [
        "check", "--rbac-dir", str(akraino_rbac(tmp_path)),
        "--review", str(REVIEWS / f"{review}.json"),
        "--annotation-key", "sdewan-bucket-type-permission",
        "--default-label-key", "sdewan-bucket-type",
    ]  # fmt: skip
    assert main(args) == code
    out = capsys.readouterr().out
    if code:
        assert "role default/create-intent allows sdewan-bucket-type in [app-intent]" in out


@pytest.mark.parametrize(
    ("depth", "code"),
    [pytest.param(10_000, 0, id="as-deep-as-the-api-server-allows"),
     pytest.param(200_000, 2, id="beyond-parsing")],
)  # fmt: skip
def test_check_a_deeply_nested_review(
    tmp_path: Path, depth: int, code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    review = load_review("a003-create-mwan3policies")
    review["request"]["object"]["spec"] = "DEEP"
    path = tmp_path / "deep.json"
    path.write_text(json.dumps(review).replace('"DEEP"', "[" * depth + "]" * depth))
    args = [
        "check", "--rbac-dir", str(akraino_rbac(tmp_path)), "--review", str(path),
        "--annotation-key", "sdewan-bucket-type-permission",
        "--default-label-key", "sdewan-bucket-type",
    ]  # fmt: skip
    assert main(args) == code
    if code == 2:
        assert "nested deeper than" in capsys.readouterr().err


def test_shorthand_without_default_key_grants_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [
        "check", "--rbac-dir", str(akraino_rbac(tmp_path)),
        "--review", str(REVIEWS / "a003-create-mwan3policies.json"),
        "--annotation-key", "sdewan-bucket-type-permission",
    ]  # fmt: skip
    assert main(args) == 1
    assert "no default label key is configured" in capsys.readouterr().out


def test_gen_certs_writes_a_verifiable_chain(tmp_path: Path) -> None:
    out = tmp_path / "certs"
    dns = ["label-rbac.label-rbac.svc", "127.0.0.1"]
    assert main(["gen-certs", "--out", str(out), "--dns", dns[0], "--dns", dns[1]]) == 0
    ca = x509.load_pem_x509_certificate((out / "ca.crt").read_bytes())
    cert = x509.load_pem_x509_certificate((out / "tls.crt").read_bytes())
    cert.verify_directly_issued_by(ca)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == [dns[0]]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == [dns[1]]
    assert (out / "tls.key").stat().st_mode & 0o077 == 0


def test_lint_accepts_examples(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lint", *map(str, sorted(EXAMPLES.glob("*.yaml")))]) == 0
    assert "ok: role t1/team-a (4 permission entries)" in capsys.readouterr().out


def test_lint_reports_invalid_annotation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = tmp_path / "bad.yaml"
    manifest.write_text(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\n"
        "metadata:\n  name: broken\n  namespace: t1\n"
        '  annotations:\n    labelrbac.io/permissions: \'{"configmaps": {"team": []}}\'\n'
        "rules: []\n"
    )
    assert main(["lint", str(manifest)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("invalid: role t1/broken: invalid labelrbac.io/permissions annotation")


@pytest.mark.parametrize(
    ("kind", "metadata", "line"),
    [
        pytest.param("Role", "{name: x, namespace: t1}", "ok: role t1/x", id="role"),
        # Applied later into kubectl's namespace: still a Role, not a ClusterRole.
        pytest.param("Role", "{name: x}", "ok: role x", id="role-without-namespace"),
        pytest.param("ClusterRole", "{name: x, namespace: t1}", "ok: clusterrole x", id="cluster"),
        pytest.param(
            "Role",
            "[1]",
            "invalid: role (no name): malformed metadata: not a mapping",
            id="metadata-not-a-mapping",
        ),
        pytest.param("Role", "{namespace: t1}", "ok: role t1/(no name)", id="no-name"),
    ],
)
def test_lint_names_each_role_as_its_manifest_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, metadata: str, line: str
) -> None:
    manifest = tmp_path / "role.yaml"
    manifest.write_text(
        f"apiVersion: rbac.authorization.k8s.io/v1\nkind: {kind}\nmetadata: {metadata}\nrules: []\n"
    )
    assert main(["lint", str(manifest)]) == (1 if line.startswith("invalid") else 0)
    assert capsys.readouterr().out.startswith(line)


def test_lint_without_roles_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = tmp_path / "ns.yaml"
    manifest.write_text("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: x\n")
    assert main(["lint", str(manifest)]) == 2


def test_module_entry_point() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "app", *CHECK, "--user", "bob", "--verb", "create",
         "--resource", "configmaps", "--namespace", "t1", "--label", "team=b"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("allowed")


def test_lint_reports_an_unknown_mode(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    manifest = tmp_path / "mode.yaml"
    manifest.write_text(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\n"
        "metadata:\n  name: loud\n  namespace: t1\n"
        "  annotations:\n    labelrbac.io/mode: loud\n"
        '    labelrbac.io/permissions: \'{"configmaps": {"team": ["a"]}}\'\n'
        "rules: []\n"
    )
    assert main(["lint", str(manifest)]) == 1
    assert capsys.readouterr().out == (
        "invalid: role t1/loud: invalid labelrbac.io/mode annotation 'loud': "
        "expected one of enforce, warn, audit\n"
    )


BAD_ROLE = """\
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: bad
  namespace: t1
  annotations:
    labelrbac.io/mode: loud
    labelrbac.io/permissions: >-
      {"configmaps": {"team": 5}, "secrets": {"Bad Key!": ["a"]}, "pods": {"team": ["a"]}}
rules: []
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: fine
  annotations:
    labelrbac.io/permissions: '{"configmaps": {"team": ["a"]}}'
rules: []
"""


def test_lint_reports_every_error_of_a_role(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = tmp_path / "bad.yaml"
    manifest.write_text(BAD_ROLE)
    assert main(["lint", str(manifest)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(": ", 2)[:2] for line in lines] == [
        ["invalid", "role t1/bad"], ["invalid", "role t1/bad"], ["invalid", "role t1/bad"],
        ["ok", "clusterrole fine (1 permission entry)"],
    ]  # fmt: skip
    assert "at configmaps/team: 5 is not of type 'array'" in lines[0]
    assert "at secrets: 'Bad Key!' is not a label key" in lines[1]
    assert "labelrbac.io/mode annotation 'loud'" in lines[2]
    assert main(["lint", str(manifest), "-o", "json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert (data["valid"], data["invalid"]) == (1, 1)
    bad, fine = data["roles"]
    assert (bad["kind"], bad["namespace"], bad["name"], bad["valid"]) == (
        "Role",
        "t1",
        "bad",
        False,
    )
    assert [e.split(": ", 1)[1] for e in bad["errors"]] == [
        line.split(": ", 3)[3] for line in lines[:3]
    ]
    assert fine == {"kind": "ClusterRole", "namespace": "", "name": "fine", "valid": True,
                    "entries": 1, "errors": []}  # fmt: skip


@pytest.mark.parametrize(
    ("user", "groups", "expected"),
    [
        pytest.param("bob", [], ("system:authenticated",), id="user"),
        pytest.param("bob", ["devs"], ("devs", "system:authenticated"), id="user-with-group"),
        pytest.param("system:serviceaccount:t1:ci", [],
                     ("system:serviceaccounts", "system:serviceaccounts:t1",
                      "system:authenticated"), id="service-account-default-groups"),
        pytest.param("system:serviceaccount:t1:ci", ["x"], ("x", "system:authenticated"),
                     id="service-account-with-groups"),
        pytest.param("system:anonymous", [], ("system:unauthenticated",), id="anonymous"),
        pytest.param("bob", ["system:unauthenticated"], ("system:unauthenticated",),
                     id="explicitly-unauthenticated"),
    ],
)  # fmt: skip
def test_as_is_completed_like_api_server_impersonation(
    user: str, groups: list[str], expected: tuple[str, ...]
) -> None:
    assert impersonated(user, groups).groups == expected


def test_as_counts_bindings_to_system_authenticated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rbac = tmp_path / "rbac"
    rbac.mkdir()
    (rbac / "rbac.yaml").write_text(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\n"
        "metadata: {name: all, namespace: t1, annotations: "
        '{labelrbac.io/permissions: \'{"configmaps": {"team": ["x"]}}\'}}\n'
        "rules: [{apiGroups: [''], resources: [configmaps], verbs: [create]}]\n---\n"
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\n"
        "metadata: {name: all, namespace: t1}\nroleRef: {kind: Role, name: all}\n"
        "subjects: [{kind: Group, name: 'system:authenticated'}]\n"
    )
    assert main(["check", "--rbac-dir", str(rbac), "--as", "bob", "--verb", "create",
                 "--resource", "configmaps", "-n", "t1", "-l", "team=y"]) == 1  # fmt: skip
    assert "(role t1/all allows team in [x])" in capsys.readouterr().out
