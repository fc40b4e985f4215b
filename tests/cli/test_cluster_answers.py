"""``check`` and ``who-can`` answer what the cluster would: RBAC refuses what no bound role
grants, unknown resources and verbs are errors naming what was meant, ``-f`` takes the namespace
kubectl would, and every violation of an object is reported. Against the example RBAC."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from app.cli import main
from tests.conftest import EXAMPLES
from tests.support import ACCESS_REVIEWS, V135_REVIEWS

CHECK = ["check", "--rbac-dir", str(EXAMPLES)]
ALICE = ["--as", "alice", "--as-group", "tenants"]


@pytest.fixture(autouse=True)
def no_kubeconfig(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No kubeconfig of the machine running the tests leaks a namespace in."""
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))


@pytest.mark.parametrize(
    ("args", "code", "out", "err"),
    [
        pytest.param(
            ["--as", "nobody", "--verb", "create", "--resource", "configmaps", "-n", "t1",
             "-l", "team=a"],
            1, 'denied (403 NoGrantingRole): RBAC refuses it: no role bound to "nobody" grants '
            'create on configmaps in namespace "t1"', "", id="no-role-create",
        ),
        pytest.param(
            ["--as", "carol", "--as-group", "auditors", "--verb", "delete", "--resource",
             "configmaps", "-n", "t1", "--name", "c1"],
            1, "RBAC refuses it", "", id="read-only-user-deletes",
        ),
        pytest.param(
            ["--as", "nobody", "--verb", "get", "--resource", "configmaps", "-n", "t1",
             "--name", "c1"],
            1, 'denied (403 NoGrantingRole): RBAC refuses it: no role bound to "nobody" grants '
            "get on configmaps", "", id="no-role-get",
        ),
        pytest.param(
            ["--as", "carol", "--as-group", "auditors", "--verb", "get", "--resource",
             "configmaps", "-n", "t1", "--name", "c1"],
            0, "allowed (Unrestricted)", "", id="read-only-user-reads",
        ),
        pytest.param(
            ["--as", "root", "--as-group", "system:masters", "--verb", "create", "--resource",
             "configmaps", "-n", "t1"],
            0, "allowed (Unrestricted)", "", id="system-masters",
        ),
        pytest.param(
            [*ALICE, "--verb", "create", "--resource", "configmap", "-n", "t1", "-l", "team=a"],
            2, "", 'doesn\'t have a resource type "configmap" (--resource); did you mean '
            "configmaps?", id="singular",
        ),
        pytest.param(
            [*ALICE, "--verb", "create", "--resource", "cm", "-n", "t1", "-l", "team=a"],
            2, "", "did you mean configmaps?", id="short-name",
        ),
        pytest.param(
            [*ALICE, "--verb", "create", "--resource", "deployments", "-n", "t1", "-l", "team=a"],
            2, "", "did you mean deployments.apps?", id="group-left-out",
        ),
        pytest.param(
            [*ALICE, "--verb", "get", "--resource", "confgimaps", "-n", "t1"],
            2, "", "did you mean configmaps?", id="read-misspelled",
        ),
        pytest.param(
            [*ALICE, "--verb", "frobnicate", "--resource", "configmaps"],
            1, "RBAC refuses it: no role bound to \"alice\" grants frobnicate on configmaps", "",
            id="custom-verb-rbac-refuses",
        ),
        pytest.param(
            [*ALICE, "--verb", "frobnicate", "--resource", "configmaps", "-n", "t1", "-l",
             "team=b"],
            0, "allowed (VerbNotRestricted)", "", id="custom-verb-rbac-grants-whatever-labels",
        ),
        pytest.param(
            [*ALICE, "--verb", "get pods", "--resource", "configmaps"],
            2, "", "invalid verb 'get pods'", id="malformed-verb",
        ),
        pytest.param(
            ["--as", "tina", "--verb", "impersonate", "--resource", "users", "--name", "admin"],
            1, "denied", "", id="identity-resources-are-known",
        ),
    ],
)  # fmt: skip
def test_check_answers_as_the_cluster(
    args: list[str], code: int, out: str, err: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*CHECK, *args]) == code
    captured = capsys.readouterr()
    assert out in captured.out
    assert err in captured.err


@pytest.mark.parametrize(
    ("args", "err"),
    [
        pytest.param(["get pods", "configmaps"], "invalid verb 'get pods'", id="verb"),
        pytest.param(["create", "configmap"], "did you mean configmaps?", id="singular"),
        pytest.param(["create", "deployments"], "did you mean deployments.apps?", id="group"),
    ],
)
def test_who_can_refuses_what_the_cluster_does_not_serve(
    args: list[str], err: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["who-can", *args, "--rbac-dir", str(EXAMPLES)]) == 2
    assert err in capsys.readouterr().err


def test_a_directorys_custom_resources_are_known(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rbac = tmp_path / "rbac"
    rbac.mkdir()
    (rbac / "examples.yaml").write_text((EXAMPLES / "tenants.yaml").read_text())
    (rbac / "crd.yaml").write_text(Path("manifests/compiled/crd.yaml").read_text())
    args = ["check", "--rbac-dir", str(rbac), *ALICE, "--verb", "create", "-n", "t1"]
    assert main([*args, "--resource", "labelrbacparams.labelrbac.io"]) == 1
    assert "RBAC refuses it" in capsys.readouterr().out
    assert main([*args, "--resource", "lrp"]) == 2
    assert "did you mean labelrbacparams.labelrbac.io?" in capsys.readouterr().err


def _deployment(labels: dict[str, str], pod_labels: dict[str, str]) -> dict[str, object]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "labels": labels},
        "spec": {
            "selector": {"matchLabels": {"app": "web", **pod_labels}},
            "template": {
                "metadata": {"labels": {"app": "web", **pod_labels}},
                "spec": {"containers": [{"name": "c", "image": "x"}]},
            },
        },
    }


def _kubeconfig(path: Path, namespace: str) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "here",
        "contexts": [{"name": "here", "context": {"cluster": "c", "user": "u",
                                                  "namespace": namespace}}],
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:9"}}],
        "users": [{"name": "u", "user": {}}],
    }))  # fmt: skip
    return path


@pytest.mark.parametrize(
    ("flags", "context", "code", "namespace", "said"),
    [
        pytest.param(["-n", "t1"], "", 0, "t1", "", id="dash-n"),
        pytest.param([], "t1", 0, "t1", "the kubeconfig context's namespace", id="context"),
        pytest.param([], "", 1, "default", "no -n and no namespace in the kubeconfig context",
                     id="default"),
    ],
)  # fmt: skip
def test_f_without_a_namespace_takes_the_one_kubectl_would(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    flags: list[str],
    context: str,
    code: int,
    namespace: str,
    said: str,
) -> None:
    if context:
        monkeypatch.setenv("KUBECONFIG", str(_kubeconfig(tmp_path / "config", context)))
    manifest = tmp_path / "web.yaml"
    manifest.write_text(yaml.safe_dump(_deployment({"team": "a"}, {"team": "a"})))
    assert main([*CHECK, *ALICE, "-f", str(manifest), *flags, "-o", "json"]) == code
    captured = capsys.readouterr()
    assert json.loads(captured.out)["namespace"] == namespace
    assert said in captured.err
    if said:
        assert f'judged in "{namespace}"' in captured.err


def test_f_of_a_directory_reads_every_manifest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(_deployment({"team": "a"}, {"team": "a"})))
    (tmp_path / "sub").mkdir()
    config = {"apiVersion": "v1", "kind": "ConfigMap",
              "metadata": {"name": "c", "labels": {"team": "b"}}}  # fmt: skip
    (tmp_path / "sub" / "b.json").write_text(json.dumps(config))
    assert main([*CHECK, *ALICE, "-n", "t1", "-f", str(tmp_path), "-o", "json"]) == 1
    answers = json.loads(capsys.readouterr().out)
    assert [(a["resource"], a["allowed"]) for a in answers] == [
        ("deployments.apps", True),
        ("configmaps", False),
    ]


def test_every_violation_of_an_object_is_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = tmp_path / "web.yaml"
    manifest.write_text(yaml.safe_dump(_deployment({"team": "b"}, {"team": "c"})))
    argv = [*CHECK, *ALICE, "-n", "t1", "-f", str(manifest)]
    assert main([*argv, "-o", "json"]) == 1
    violations = json.loads(capsys.readouterr().out)["violations"]
    assert len(violations) == 2
    assert 'label team="b" is not permitted' in violations[0]
    assert 'its pod template (spec.template) has label team="c"' in violations[1]
    assert main(argv) == 1
    assert "also denied: " in capsys.readouterr().out


def test_one_decision_shape_for_every_input(capsys: pytest.CaptureFixture[str]) -> None:
    inputs = [
        ["--review", str(V135_REVIEWS / "c021-tenant-create-configmaps.json")],
        ["--review", str(ACCESS_REVIEWS / "c002-tenant-get-configmaps.json")],
        [*ALICE, "--verb", "create", "--resource", "configmaps", "-n", "t1", "-l", "team=a"],
        [*ALICE, "--verb", "get", "--resource", "configmaps", "-n", "t1", "-l", "team=a"],
    ]
    shapes = []
    for args in inputs:
        assert main([*CHECK, *args, "-o", "json"]) in (0, 1)
        answer = json.loads(capsys.readouterr().out)
        shapes.append(sorted(answer))
        assert isinstance(answer["allowed"], bool) and answer["reason"]
    assert all(shape == shapes[0] for shape in shapes)
    assert shapes[0] == sorted([
        "user", "groups", "verb", "resource", "namespace", "name", "allowed", "reason", "code",
        "mode", "message", "explanation", "warnings", "violations",
    ])  # fmt: skip
