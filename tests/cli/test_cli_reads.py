"""``check`` explains reads as the authorization webhook answers them: flags or a recorded
SubjectAccessReview file, against the example RBAC (alice: team=a in t1)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from app.cli import main
from app.engine.selectors import SelectorError, parse_selector
from tests.conftest import EXAMPLES
from tests.support import ACCESS_REVIEWS, ROOT, binding, role, rule

CHECK = ["check", "--rbac-dir", str(EXAMPLES)]
LIST = ["--as", "alice", "--verb", "list", "--resource", "configmaps", "-n", "t1"]
GET = ["--as", "alice", "--verb", "get", "--resource", "configmaps", "-n", "t1", "--name", "c2"]


@pytest.mark.parametrize(
    ("args", "code", "expected"),
    [
        pytest.param(
            LIST, 1,
            'denied (403 SelectorNotWithinLabels): user "alice" may list configmaps in namespace '
            '"t1" only with a label selector within team in [a] (add -l team=a)',
            id="list-without-selector",
        ),
        pytest.param(
            [*LIST, "--selector", "team=a"], 0, "allowed (SelectorWithinLabels)",
            id="list-own-bucket",
        ),
        pytest.param(
            [*LIST, "--selector", "team in (a,b)"], 1, "(add -l team=a)", id="list-two-buckets"
        ),
        pytest.param(
            [*GET, "-l", "team=b"], 1,
            'denied (403 LabelNotPermitted): user "alice" may not get configmaps "c2" in namespace '
            "\"t1\": the existing object's label team=\"b\" is not permitted",
            id="get-other-bucket",
        ),
        pytest.param(GET, 1, "without cluster access", id="get-unknown-labels"),
        pytest.param([*GET, "-l", "team=a"], 0, "allowed (LabelsPermitted)", id="get-own"),
        pytest.param(
            ["--as", "alice", "--verb", "deletecollection", "--resource", "configmaps", "-n", "t1",
             "--selector", "team=b"], 1, "deletecollection configmaps", id="deletecollection",
        ),
        pytest.param(
            ["--review", str(ACCESS_REVIEWS / "c005-tenant-list-configmaps.json")], 0,
            "allowed (SelectorWithinLabels)", id="review-file-list-team-a",
        ),
        pytest.param(
            ["--review", str(ACCESS_REVIEWS / "c001-tenant-get-nonresource.json")], 2,
            "", id="review-file-non-resource",
        ),
    ],
)  # fmt: skip
def test_check_explains_reads(
    args: list[str], code: int, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*CHECK, *args]) == code
    assert expected in capsys.readouterr().out


def test_check_read_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*CHECK, *LIST, "--selector", "team", "-o", "json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert (data["allowed"], data["reason"]) == (False, "SelectorNotWithinLabels")
    assert data["explanation"] == ["role t1/team-a: team in [a]"]


def test_bad_selector_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*CHECK, *LIST, "--selector", "team in (a"]) == 2
    assert "cannot parse label selector" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("team=a", ["team=a"], id="equals"),
        pytest.param("team==a", ["team=a"], id="double-equals"),
        pytest.param("team!=a", ["team notin (a)"], id="not-equals"),
        pytest.param("team in (a, b),env", ["team in (a,b)", "env"], id="set-and-exists"),
        pytest.param("team notin (a),!env", ["team notin (a)", "!env"], id="notin-and-absent"),
    ],
)
def test_selector_syntax(text: str, expected: list[str]) -> None:
    assert [str(r) for r in parse_selector(text)] == expected


@pytest.mark.parametrize("text", ["", "a=b=c", "team in a", "(x)", "a in (b", "=a"])
def test_selector_syntax_errors(text: str) -> None:
    with pytest.raises(SelectorError):
        parse_selector(text)


@pytest.mark.parametrize(
    ("args", "error"),
    [
        pytest.param(
            [*CHECK, *LIST, "--unrestricted-reads", "config maps"],
            "is not a resource pattern",
            id="unrestricted-reads-pattern",
        ),
        pytest.param(
            ["serve", "--dev-tls", "--watch-labels", "pods/log"],
            "name a resource, not a subresource",
            id="watch-labels-subresource",
        ),
    ],
)
def test_read_flags_are_checked(
    args: list[str], error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(args) == 2
    assert error in capsys.readouterr().err


def test_unrestricted_reads_leave_the_read_to_rbac(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*CHECK, *LIST, "--unrestricted-reads", "configmaps"]) == 0
    assert "allowed (ReadsUnrestricted)" in capsys.readouterr().out


# -- Acting as another subject: impersonation, as /authorize answers it ---------------------------


@pytest.fixture
def act_as_rbac(tmp_path: Path) -> Path:
    objects = [
        role("tenant", "t2", [rule("*", "*")], {"*": {"team": ["a"]}}),
        binding("tina", "tenant", "User:tina", namespace="t2"),
        role("act-as", "", [rule("impersonate", "users")], {"*": {"team": ["a"]}}),
        binding("tina-act-as", "act-as", "User:tina"),
    ]
    (tmp_path / "rbac.json").write_text(
        json.dumps({"kind": "List", "items": [obj for _, obj in objects]})
    )
    return tmp_path


IMPERSONATE_SA = [
    "--as", "tina", "--verb", "impersonate", "--resource", "serviceaccounts", "-n", "t2",
    "--name", "deployer-b",
]  # fmt: skip


@pytest.mark.parametrize(
    ("args", "code", "expected"),
    [
        pytest.param(
            [*IMPERSONATE_SA, "-l", "team=b"], 1,
            'denied (403 LabelNotPermitted): user "tina" may not impersonate serviceaccounts '
            '"deployer-b" in namespace "t2": the existing object\'s label team="b" is not '
            "permitted; it may impersonate only ServiceAccounts labeled team in [a] "
            "(role t2/tenant)",
            id="service-account-of-another-bucket",
        ),
        pytest.param(
            [*IMPERSONATE_SA, "-l", "team=a"], 0, "allowed (LabelsPermitted)",
            id="service-account-of-her-bucket",
        ),
        pytest.param(
            ["--as", "tina", "--verb", "impersonate", "--resource", "users", "--name", "admin"], 1,
            'denied (403 IdentityNotLabeled): user "tina" may not impersonate users "admin": users '
            "carry no labels",
            id="user",
        ),
    ],
)  # fmt: skip
def test_check_explains_impersonation(
    act_as_rbac: Path, args: list[str], code: int, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check", "--rbac-dir", str(act_as_rbac), *args]) == code
    assert expected in capsys.readouterr().out


def test_python_dash_m_app_check_refuses_impersonating_another_bucket(act_as_rbac: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "app", "check", "--rbac-dir", str(act_as_rbac),
         *IMPERSONATE_SA, "-l", "team=b"],
        capture_output=True, text=True, timeout=60, cwd=ROOT, check=False,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert result.stdout.startswith("denied (403 LabelNotPermitted)")


# -- Handing reads out: check -f judges a Role as the escalation check does -----------------------


@pytest.mark.parametrize(
    ("permissions", "code", "expected"),
    [
        pytest.param(
            None, 1,
            'denied (403 Escalation): user "alice" may not grant configmaps without a label '
            "restriction: their own access is limited to team in [a]",
            id="unannotated-read-only-role",
        ),
        pytest.param(
            '{"configmaps": {"team": ["b"]}, "secrets": {"team": ["b"]}}', 1,
            'user "alice" may not grant configmaps with team="b"', id="another-buckets-reads",
        ),
        pytest.param(
            '{"configmaps": {"team": ["a"]}, "secrets": {"team": ["a"]}}', 0, "allowed",
            id="her-own-buckets-reads",
        ),
    ],
)  # fmt: skip
def test_check_judges_a_role_handing_out_reads(
    tmp_path: Path,
    permissions: str | None,
    code: int,
    expected: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    metadata: dict[str, object] = {"name": "peek", "namespace": "t1", "labels": {"team": "a"}}
    if permissions is not None:
        metadata["annotations"] = {"labelrbac.io/permissions": permissions}
    manifest = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": metadata,
        "rules": [
            {"apiGroups": [""], "resources": ["secrets", "configmaps"], "verbs": ["get", "list"]}
        ],
    }
    path = tmp_path / "peek.json"
    path.write_text(json.dumps(manifest))
    # alice as a tenant admin of t1: RBAC lets her write roles, the escalation check judges them.
    assert main([*CHECK, "--as", "alice", "--as-group", "t1-admins", "-f", str(path)]) == code
    assert expected in capsys.readouterr().out
