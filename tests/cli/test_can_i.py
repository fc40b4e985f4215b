"""``check`` with ``kubectl auth can-i``'s habits: the positional form (``check create configmaps
NAME``), ``--list``, ``-q``, any verb RBAC accepts, and ``-l`` as the labels of the objects asked
about. Run through ``main`` against the example RBAC, and a directory with RBAC-only verbs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.cli import main
from tests.conftest import EXAMPLES

CHECK = ["check", "--rbac-dir", str(EXAMPLES)]
ALICE = ["--as", "alice", "--as-group", "tenants"]


@pytest.fixture(autouse=True)
def no_kubeconfig(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No kubeconfig of the machine running the tests leaks a namespace in."""
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))


def answer(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, Any]:
    code = main([*args, "-o", "json"])
    out = capsys.readouterr().out
    return code, json.loads(out) if out else None


# -- The positional form asks what the flags ask --------------------------------------------------


@pytest.mark.parametrize(
    ("words", "flags"),
    [
        pytest.param(["create", "configmaps"], ["--verb", "create", "--resource", "configmaps"],
                     id="plural"),
        pytest.param(["create", "configmap"], ["--verb", "create", "--resource", "configmaps"],
                     id="singular"),
        pytest.param(["create", "cm"], ["--verb", "create", "--resource", "configmaps"],
                     id="short-name"),
        pytest.param(["create", "ConfigMap"], ["--verb", "create", "--resource", "configmaps"],
                     id="kind"),
        pytest.param(["patch", "deployments"],
                     ["--verb", "patch", "--resource", "deployments.apps"], id="group-left-out"),
        pytest.param(["patch", "deploy.apps"],
                     ["--verb", "patch", "--resource", "deployments.apps"], id="short-with-group"),
        pytest.param(["patch", "deployments.v1.apps"],
                     ["--verb", "patch", "--resource", "deployments.apps"], id="version-group"),
        pytest.param(["delete", "secrets/db"],
                     ["--verb", "delete", "--resource", "secrets", "--name", "db"],
                     id="resource-slash-name"),
        pytest.param(["delete", "secrets", "db"],
                     ["--verb", "delete", "--resource", "secrets", "--name", "db"],
                     id="resource-then-name"),
        pytest.param(["create", "pods", "web", "--subresource", "exec"],
                     ["--verb", "create", "--resource", "pods/exec", "--name", "web"],
                     id="subresource"),
        pytest.param(["get", "-n", "t1", "configmaps", "c2"],
                     ["--verb", "get", "--resource", "configmaps", "--name", "c2"],
                     id="flags-between-words"),
        pytest.param(["list", "configmaps"], ["--verb", "list", "--resource", "configmaps"],
                     id="list"),
        pytest.param(["impersonate", "serviceaccounts", "ci-deployer"],
                     ["--verb", "impersonate", "--resource", "serviceaccounts", "--name",
                      "ci-deployer"], id="identity-verb"),
    ],
)  # fmt: skip
@pytest.mark.parametrize(
    "who",
    [
        pytest.param([*ALICE, "-l", "team=a"], id="alice-own-labels"),
        pytest.param([*ALICE, "-l", "team=b"], id="alice-foreign-labels"),
        pytest.param(["--as", "nobody"], id="nobody"),
    ],
)
def test_the_positional_form_asks_what_the_flags_ask(
    words: list[str], flags: list[str], who: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    ns = [] if "-n" in words else ["-n", "t1"]
    by_words = answer([*CHECK, *who, *ns, *words], capsys)
    by_flags = answer([*CHECK, *who, "-n", "t1", *flags], capsys)
    assert by_words == by_flags
    code, found = by_words
    assert found["resource"] == flags[flags.index("--resource") + 1]
    assert code == (0 if found["allowed"] else 1)


def test_the_positional_form_has_answers_of_both_kinds(capsys: pytest.CaptureFixture[str]) -> None:
    """The comparison above is not vacuous: the same words are allowed and denied by labels."""
    assert main([*CHECK, *ALICE, "-n", "t1", "create", "cm", "-l", "team=a"]) == 0
    assert "allowed (LabelsPermitted)" in capsys.readouterr().out
    assert main([*CHECK, *ALICE, "-n", "t1", "create", "cm", "-l", "team=b"]) == 1
    assert 'label team="b" is not permitted' in capsys.readouterr().out


@pytest.mark.parametrize(
    ("namespace", "expected"),
    [
        pytest.param([], "default", id="no-n-is-default-as-kubectl"),
        pytest.param(["-n", "t1"], "t1", id="n"),
        pytest.param(["-A"], "", id="all-namespaces"),
    ],
)
def test_a_namespaced_resource_is_asked_where_kubectl_asks(
    namespace: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _, found = answer([*CHECK, *ALICE, "list", "configmaps", *namespace], capsys)
    assert found["namespace"] == expected
    _, cluster_scoped = answer([*CHECK, *ALICE, "get", "nodes", "n1"], capsys)
    assert cluster_scoped["namespace"] == ""


@pytest.mark.parametrize(
    ("args", "error"),
    [
        pytest.param(["create"], "expected VERB RESOURCE[/NAME] or VERB RESOURCE NAME",
                     id="verb-only"),
        pytest.param(["get", "secrets", "a", "b"], "got 4 words", id="too-many"),
        pytest.param(["get", "secrets/a", "b"], "give the name once", id="name-twice"),
        pytest.param(["get", "secrets/"], "invalid name ''", id="empty-name"),
        pytest.param(["get", "secrets/a/b"], "invalid name 'a/b'", id="name-with-slash"),
        pytest.param(["get", "confgimaps"], "did you mean configmaps?", id="misspelled"),
        pytest.param(["get", "config maps"], "invalid resource 'config maps'", id="malformed"),
        pytest.param(["get pods", "configmaps"], "invalid verb 'get pods'", id="malformed-verb"),
        pytest.param(["get", "secrets", "--verb", "get"], "not both", id="words-and-flags"),
        pytest.param(["--verb", "get", "--resource", "pods", "--subresource", "log"],
                     "--subresource goes with the positional form", id="subresource-alone"),
        pytest.param(["get", "secrets", "-n", "t1", "-A"], "-n and -A", id="n-and-A"),
        pytest.param(["list", "secrets", "-l", "team=a", "--selector", "team=a"],
                     "-l and --selector both give the selector", id="l-and-selector"),
    ],
)  # fmt: skip
def test_a_malformed_question_is_exit_2(
    args: list[str], error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*CHECK, *ALICE, *args]) == 2
    captured = capsys.readouterr()
    assert error in captured.err
    assert captured.out == ""


def _crd(group: str, plural: str, kind: str) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {"group": group, "scope": "Namespaced",
                 "names": {"plural": plural, "kind": kind, "shortNames": ["wd"]}},
    }  # fmt: skip


def test_a_name_two_groups_serve_is_refused_as_ambiguous(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "tenants.yaml").write_text((EXAMPLES / "tenants.yaml").read_text())
    crds = [_crd("a.example.com", "widgets", "Widget"), _crd("b.example.com", "widgets", "Widget")]
    (tmp_path / "crds.yaml").write_text(yaml.safe_dump_all(crds))
    base = ["check", "--rbac-dir", str(tmp_path), *ALICE, "-n", "t1"]
    for typed in ("widgets", "widget", "wd"):
        assert main([*base, "create", typed]) == 2
        assert "is ambiguous: say which, widgets.a.example.com or widgets.b.example.com" in (
            capsys.readouterr().err
        )
    assert main([*base, "create", "wd.b.example.com", "-o", "json"]) == 1  # RBAC refuses it
    assert json.loads(capsys.readouterr().out)["resource"] == "widgets.b.example.com"


# -- Any verb RBAC accepts -------------------------------------------------------------------------

DELEGATION = """
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: delegator
  namespace: t1
  annotations:
    labelrbac.io/permissions: '{"roles.rbac.authorization.k8s.io": {"team": ["a"]},
      "securitycontextconstraints.security.openshift.io": {"team": ["a"]}}'
rules:
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles]
  verbs: [get, list, bind, escalate, frobnicate]
- apiGroups: [security.openshift.io]
  resources: [securitycontextconstraints]
  verbs: [use]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: delegator, namespace: t1}
subjects: [{kind: User, name: dora, apiGroup: rbac.authorization.k8s.io}]
roleRef: {kind: Role, name: delegator, apiGroup: rbac.authorization.k8s.io}
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: securitycontextconstraints.security.openshift.io}
spec:
  group: security.openshift.io
  scope: Cluster
  names: {plural: securitycontextconstraints, kind: SecurityContextConstraints, shortNames: [scc]}
"""


@pytest.fixture
def delegation(tmp_path: Path) -> list[str]:
    rbac = tmp_path / "rbac"
    rbac.mkdir()
    (rbac / "delegation.yaml").write_text(DELEGATION)
    return ["check", "--rbac-dir", str(rbac), "-n", "t1"]


@pytest.mark.parametrize(
    ("args", "code", "reason"),
    [
        # No label permission narrows these verbs: RBAC's grant stands whatever the labels.
        pytest.param(["--as", "dora", "bind", "roles", "admin", "-l", "team=b"], 0,
                     "VerbNotRestricted", id="bind-whatever-labels"),
        pytest.param(["--as", "dora", "escalate", "roles.rbac.authorization.k8s.io", "x"], 0,
                     "VerbNotRestricted", id="escalate"),
        pytest.param(["--as", "dora", "frobnicate", "roles", "x", "-l", "team=b"], 0,
                     "VerbNotRestricted", id="custom-verb"),
        pytest.param(["--as", "dora", "use", "scc", "restricted"], 0, "VerbNotRestricted",
                     id="use-through-a-crd"),
        # ...and RBAC alone refuses what no rule grants: never widened.
        pytest.param(["--as", "dora", "bind", "clusterroles", "admin"], 1, "NoGrantingRole",
                     id="bind-not-granted"),
        pytest.param(["--as", "dora", "frobnicate", "configmaps", "x"], 1, "NoGrantingRole",
                     id="custom-verb-not-granted"),
        pytest.param(["--as", "nobody", "use", "scc", "restricted"], 1, "NoGrantingRole",
                     id="use-not-granted"),
        pytest.param(["--as", "dora", "--verb", "bind", "--resource",
                      "roles.rbac.authorization.k8s.io", "--name", "admin"], 0,
                     "VerbNotRestricted", id="flags"),
        # The verbs a label permission narrows keep being narrowed in the same role.
        pytest.param(["--as", "dora", "get", "roles", "x", "-l", "team=b"], 1,
                     "LabelNotPermitted", id="get-narrowed"),
        pytest.param(["--as", "dora", "get", "roles", "x", "-l", "team=a"], 0,
                     "LabelsPermitted", id="get-within"),
    ],
)  # fmt: skip
def test_any_verb_rbac_accepts_is_answered_as_the_cluster_answers(
    delegation: list[str], args: list[str], code: int, reason: str,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    got, found = answer([*delegation, *args], capsys)
    assert (got, found["reason"]) == (code, reason), found


def test_who_can_answers_any_verb(
    delegation: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    rbac = delegation[2]
    base = ["who-can", "--rbac-dir", rbac, "-n", "t1", "-o", "json"]
    assert main([*base, "bind", "roles.rbac.authorization.k8s.io", "-l", "team=b"]) == 0
    holders = json.loads(capsys.readouterr().out)["subjects"]
    dora = [h for h in holders if h["subject"]["name"] == "dora"]
    assert [(h["allowed"], h["labels"]) for h in dora] == [(True, [])]
    assert main([*base, "get", "roles.rbac.authorization.k8s.io", "-l", "team=b"]) == 0
    holders = json.loads(capsys.readouterr().out)["subjects"]
    dora = [h for h in holders if h["subject"]["name"] == "dora"]
    assert [(h["allowed"], h["labels"]) for h in dora] == [
        (False, [[{"key": "team", "values": ["a"]}]])
    ]


# -- --list ----------------------------------------------------------------------------------------


def test_list_shows_every_rule_with_its_label_limits(
    delegation: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*delegation, "--as", "dora", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["RESOURCES", "RESOURCE", "NAMES", "VERBS", "LABELS", "THROUGH"]
    rows = {" ".join(line.split()) for line in lines[1:]}
    assert rows == {
        "roles.rbac.authorization.k8s.io [] [get list] team in [a] role t1/delegator",
        "roles.rbac.authorization.k8s.io [] [bind escalate frobnicate] any (not label-scoped) "
        "role t1/delegator",
        "securitycontextconstraints.security.openshift.io [] [use] any (not label-scoped) "
        "role t1/delegator",
    }


@pytest.mark.parametrize(
    ("who", "namespace", "expected"),
    [
        pytest.param(ALICE, "t1",
                     {("configmaps", ("*",), "team in [a]", "t1/team-a"),
                      ("pods/exec", ("*",), "team in [a]", "t1/team-a"),
                      ("deployments.apps/scale", ("*",), "team in [a]", "t1/team-a")},
                     id="alice-in-her-namespace"),
        pytest.param(ALICE, "t2", set(), id="alice-elsewhere"),
        pytest.param(["--as", "x", "--as-group", "t1-admins"], "t1",
                     {("configmaps", ("*",), "team in [a]", "t1/team-a"),
                      ("roles.rbac.authorization.k8s.io",
                       ("create", "delete", "get", "list", "patch", "update", "watch"), "any",
                       "t1/tenant-admin")},
                     id="group-holds-two-roles"),
        pytest.param(["--as", "root", "--as-group", "system:masters"], "t1",
                     {("*.*", ("*",), "any (not label-scoped)", None)}, id="system-masters"),
    ],
)  # fmt: skip
def test_list_as_json(
    who: list[str], namespace: str, expected: set[tuple[Any, ...]],
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    assert main([*CHECK, *who, "--list", "-n", namespace, "-o", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["namespace"] == namespace
    found = {
        (r["resource"], tuple(r["verbs"]), r["limits"],
         f"{r['role']['namespace']}/{r['role']['name']}" if r["role"] else None)
        for r in data["rules"]
    }  # fmt: skip
    assert expected <= found
    if not expected:
        assert found == set()
    for rule in data["rules"]:
        if rule["limits"] == "team in [a]":
            assert rule["labels"] == [{"key": "team", "values": ["a"]}]


@pytest.mark.parametrize(
    ("args", "error"),
    [
        pytest.param(["--list"], "--list needs --as USER", id="no-user"),
        pytest.param([*ALICE, "--list", "get", "pods"], "--list takes no question", id="question"),
        pytest.param([*ALICE, "--list", "-q"], "--list and -q", id="quiet"),
        pytest.param([*ALICE, "--list", "-n", "t1", "-A"], "-n and -A", id="n-and-A"),
    ],
)
def test_list_refuses_a_question(
    args: list[str], error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*CHECK, *args]) == 2
    assert error in capsys.readouterr().err


# -- -q --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "code"),
    [
        pytest.param([*ALICE, "create", "cm", "-n", "t1", "-l", "team=a"], 0, id="allowed"),
        pytest.param([*ALICE, "create", "cm", "-n", "t1", "-l", "team=b"], 1, id="denied"),
        pytest.param(["--as", "nobody", "get", "cm", "-n", "t1"], 1, id="rbac-refuses"),
        pytest.param([*ALICE, "--verb", "create", "--resource", "configmaps", "-n", "t1",
                      "-l", "team=a"], 0, id="flags"),
        pytest.param([*ALICE, "create", "confgimaps"], 2, id="bad-input"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("quiet", ["-q", "--quiet"])
def test_quiet_prints_nothing_and_answers_with_the_exit_status(
    args: list[str], code: int, quiet: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*CHECK, *args]) == code  # the same answer...
    capsys.readouterr()
    assert main([*CHECK, *args, quiet]) == code  # ...in silence
    captured = capsys.readouterr()
    assert captured.out == ""
    assert (captured.err != "") == (code == 2)  # a bad input still says what is wrong


# -- -l: the labels of the objects asked about, in every command -----------------------------------


@pytest.mark.parametrize(
    ("labels", "selector"),
    [
        pytest.param(["-l", "team=a"], "team=a", id="one"),
        pytest.param(["-l", "team=b"], "team=b", id="outside"),
        pytest.param(["-l", "team=a,tier=web"], "team=a,tier=web", id="comma"),
        pytest.param(["-l", "team=a", "-l", "tier=web"], "team=a,tier=web", id="repeated"),
    ],
)
@pytest.mark.parametrize("verb", ["list", "watch", "deletecollection"])
def test_l_of_a_collection_is_its_selector(
    labels: list[str], selector: str, verb: str, capsys: pytest.CaptureFixture[str]
) -> None:
    by_l = answer([*CHECK, *ALICE, verb, "configmaps", "-n", "t1", *labels], capsys)
    by_selector = answer([*CHECK, *ALICE, verb, "configmaps", "-n", "t1", "--selector", selector],
                         capsys)  # fmt: skip
    assert by_l == by_selector
    assert by_l[1]["allowed"] == ("team=a" in selector)


@pytest.mark.parametrize(
    "labels",
    [
        pytest.param(["-l", "team=b,tier=web"], id="comma"),
        pytest.param(["-l", "team=b", "-l", "tier=web"], id="repeated"),
    ],
)
@pytest.mark.parametrize("command", ["check", "who-can"])
def test_l_takes_kubectls_comma_form_in_every_command(
    labels: list[str], command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    if command == "check":
        code, found = answer([*CHECK, "--as", "bob", "create", "cm", "-n", "t1", *labels], capsys)
        assert (code, found["allowed"]) == (0, True)
    else:
        args = ["who-can", "create", "configmaps", "--rbac-dir", str(EXAMPLES), "-n", "t1"]
        assert main([*args, *labels, "-o", "json"]) == 0
        data = json.loads(capsys.readouterr().out)
        assert data["labels"] == {"team": "b", "tier": "web"}
        allowed = [s["subject"]["name"] for s in data["subjects"] if s["allowed"]]
        assert allowed == ["system:masters", "bob"]
