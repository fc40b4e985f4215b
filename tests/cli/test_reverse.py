"""who-can and audit: from a manifests directory, and from a cluster (the loopback API server),
and check against a cluster with kubectl's flags, ``-f FILE`` and ``-f -``."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.cli import main
from app.engine.model import Resource
from app.engine.reverse import Existing, audit, who_can
from tests.conftest import EXAMPLES
from tests.kubeapi import Collection, FakeKubeAPI, discovery
from tests.support import ROOT, binding, role, rule, snapshot

TEAM = "labelrbac.io/permissions"


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, Any]:
    code = main([*args, "-o", "json"])
    return code, json.loads(capsys.readouterr().out)


# -- who-can -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        pytest.param(
            ["create", "configmaps", "-n", "t1", "-l", "team=a"],
            {("Group", "system:masters"): True, ("Group", "t1-admins"): True,
             ("User", "alice"): True, ("User", "bob"): False, ("Group", "platform"): False},
            id="team-a-configmaps",
        ),
        pytest.param(
            ["update", "configmaps", "-n", "t1", "-l", "team=b"],
            {("Group", "system:masters"): True, ("Group", "t1-admins"): False,
             ("User", "alice"): False, ("User", "bob"): True, ("Group", "platform"): False},
            id="team-b-configmaps",
        ),
        pytest.param(
            ["patch", "deployments.apps", "-n", "t2", "-l", "tier=shared-db"],
            {("Group", "system:masters"): True, ("Group", "platform"): True},
            id="platform-glob-in-another-namespace",
        ),
        pytest.param(
            ["update", "deployments.apps", "-n", "t1", "--name", "web", "-l", "team=b"],
            {("Group", "system:masters"): True, ("Group", "platform"): False,
             ("Group", "t1-admins"): False, ("User", "alice"): False, ("User", "bob"): True,
             ("ServiceAccount", "t1/ci-deployer"): True},
            id="resource-names-rule-for-its-name",
        ),
    ],
)  # fmt: skip
def test_who_can_examples(
    args: list[str], expected: dict[tuple[str, str], bool], capsys: pytest.CaptureFixture[str]
) -> None:
    code, data = run_json(capsys, "who-can", *args, "--rbac-dir", str(EXAMPLES))
    assert code == 0
    found = {(s["subject"]["kind"], s["subject"]["name"]): s["allowed"] for s in data["subjects"]}
    assert found == expected


def test_who_can_names_the_roles_bindings_and_limits(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["who-can", "create", "configmaps", "-n", "t1", "-l", "team=a",
                 "--rbac-dir", str(EXAMPLES)]) == 0  # fmt: skip
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["SUBJECT", "ALLOWED", "THROUGH", "ROLE", "PERMITS"]
    alice = next(line for line in lines if line.startswith("User alice"))
    assert alice.split()[2:] == ["yes", "role", "t1/team-a", "(rolebinding", "t1/team-a)", "team",
                                 "in", "[a]"]  # fmt: skip
    bob = next(line for line in lines if line.startswith("User bob"))
    assert " no " in bob and "team in [b]" in bob


def test_who_can_agrees_with_check_for_every_subject() -> None:
    """The reverse answer for each subject is what ``check`` decides for that subject."""
    objects = [
        role("a", "t1", [rule("create", "configmaps")], {"configmaps": {"team": ["a"]}}),
        role("warned", "t1", [rule("create", "configmaps")], {"configmaps": {"team": ["w"]}},
             mode="warn"),
        role("all", rules=[rule("create", "configmaps")]),
        binding("a", "a", "User:ann", "Group:devs", "ServiceAccount:t1:bot", namespace="t1"),
        binding("w", "warned", "User:wes", namespace="t1"),
        binding("all", "all", "Group:ops"),
    ]  # fmt: skip
    snap = snapshot(*objects)
    holders = {str(h.subject): h for h in who_can(snap, "create", Resource("", "configmaps"),
                                                  "t1", {"team": "a"})}  # fmt: skip
    assert {k: (h.allowed, h.mode) for k, h in holders.items()} == {
        "User ann": (True, "enforce"),
        "Group devs": (True, "enforce"),
        "ServiceAccount t1/bot": (True, "enforce"),
        "User wes": (False, "warn"),
        "Group ops": (True, "enforce"),
    }
    assert holders["Group ops"].limits == "" and holders["User ann"].limits == "team in [a]"


# -- audit ---------------------------------------------------------------------------------------


def audit_world() -> tuple[list[tuple[str, dict[str, Any]]], list[Existing]]:
    rbac = [
        role("team-a", "t1", [rule("create update delete", "configmaps")],
             {"configmaps": {"team": ["a"]}}),
        role("team-b", "t1", [rule("create update delete", "configmaps")],
             {"configmaps": {"team": ["b"]}}),
        role("admin", rules=[rule("*", "*", "*")]),
        binding("alice", "team-a", "User:alice", namespace="t1"),
        binding("admins", "admin", "Group:admins"),
    ]  # fmt: skip
    cm = Resource("", "configmaps")
    objects = [
        Existing(cm, "t1", "mine", {"team": "a"}),
        Existing(cm, "t1", "left", {"team": "b"}),  # team-b is bound to nobody
        Existing(cm, "t1", "stray", {"team": "z"}),  # no role permits team=z
        Existing(cm, "t1", "bare", {}),
        Existing(Resource("", "secrets"), "t1", "s", {}),  # not restricted by anyone
    ]
    return rbac, objects


def test_audit_finds_orphans_and_labels_in_no_bucket() -> None:
    rbac, objects = audit_world()
    report = audit(snapshot(*rbac), objects)
    assert report.objects == 5
    assert [(o.obj.name, o.why) for o in report.orphans] == [
        ("left", "bound roles permit team in [a]"),
        ("stray", "bound roles permit team in [a]"),
        ("bare", "bound roles permit team in [a]"),
    ]
    assert [o.name for o in report.unbucketed] == ["stray", "bare"]
    assert [(str(b.role), b.pattern, b.limits, b.holders) for b in report.buckets["t1"]] == [
        ("role t1/team-a", "configmaps", "team in [a]", ("User alice (rolebinding t1/alice)",))
    ]
    assert "" not in report.buckets  # the unrestricted admin holds no bucket


def write_dir(directory: Path, objects: list[tuple[str, dict[str, Any]]]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    docs = [{"apiVersion": "rbac.authorization.k8s.io/v1", **obj} for _, obj in objects]
    (directory / "rbac.yaml").write_text(yaml.safe_dump_all(docs))
    return directory


def test_audit_of_a_manifests_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rbac, _ = audit_world()
    directory = write_dir(tmp_path / "m", rbac)
    configmaps = [
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": {"name": name, "namespace": "t1", "labels": labels}}
        for name, labels in (("mine", {"team": "a"}), ("left", {"team": "b"}))
    ]  # fmt: skip
    (directory / "objects.yaml").write_text(yaml.safe_dump_all(configmaps))
    code, data = run_json(capsys, "audit", "--rbac-dir", str(directory))
    assert code == 1  # findings
    assert data["objects"] == 2
    assert [(o["name"], o["labels"], o["permitted"]) for o in data["orphans"]] == [
        ("left", {"team": "b"}, [[{"key": "team", "values": ["a"]}]])
    ]
    assert data["unbucketed"] == []
    assert main(["audit", "--rbac-dir", str(directory)]) == 1
    text = capsys.readouterr().out
    assert "Orphans: only holders of unrestricted roles may still write these" in text
    assert "configmaps   t1          left   team=b   bound roles permit team in [a]" in text


# -- against a cluster: the loopback API server -------------------------------------------------


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[FakeKubeAPI, Path]]:
    api = FakeKubeAPI().start()
    rbac, _ = audit_world()
    for kind, obj in rbac:
        api.apply(kind.lower() + "s", obj)
    discovery(api)
    api.collections["configmaps"] = Collection("configmaps", "/api/v1", "ConfigMap", "v1")
    for name, labels in (("mine", {"team": "a"}), ("stray", {"team": "z"})):
        api.apply(
            "configmaps",
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "data": {"k": "not for the audit"},
                "metadata": {"name": name, "namespace": "t1", "labels": labels},
            },
        )
    yield api, api.write_kubeconfig(tmp_path / "kubeconfig")
    api.stop()


def test_audit_against_a_cluster_lists_restricted_resources_as_metadata(
    cluster: tuple[FakeKubeAPI, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    api, kubeconfig = cluster
    code, data = run_json(capsys, "audit", "--kubeconfig", str(kubeconfig))
    assert code == 1
    assert data["objects"] == 2
    assert [o["name"] for o in data["orphans"]] == ["stray"]
    assert [(o["name"], o["labels"]) for o in data["unbucketed"]] == [("stray", {"team": "z"})]
    assert data["buckets"]["t1"] == [
        {"role": {"kind": "Role", "namespace": "t1", "name": "team-a"},
         "resource": "configmaps", "labels": [{"key": "team", "values": ["a"]}],
         "mode": "enforce",
         "holders": [{"subject": {"kind": "User", "name": "alice"},
                      "binding": {"kind": "RoleBinding", "namespace": "t1", "name": "alice"}}]}
    ]  # fmt: skip
    requests = api.recorded()
    assert {r.method for r in requests} == {"GET"}
    paths = {r.path for r in requests}
    # Only the restricted resource is listed, and as metadata: Secrets are never read.
    assert "/api/v1/configmaps" in paths
    assert not paths & {"/api/v1/secrets", "/api/v1/pods", "/apis/apps/v1/deployments"}
    (listing,) = [r for r in requests if r.path == "/api/v1/configmaps"]
    assert "as=PartialObjectMetadataList" in listing.accept


def test_who_can_and_check_against_a_cluster(
    cluster: tuple[FakeKubeAPI, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, kubeconfig = cluster
    code, data = run_json(capsys, "who-can", "delete", "configmaps", "-n", "t1", "-l", "team=a",
                          "--kubeconfig", str(kubeconfig))  # fmt: skip
    assert code == 0
    found = {(s["subject"]["kind"], s["subject"]["name"]): s for s in data["subjects"]}
    assert found[("User", "alice")]["allowed"] and found[("User", "alice")]["labels"]
    assert found[("Group", "admins")]["allowed"] and not found[("Group", "admins")]["labels"]
    # The recorded cluster's own holders (system:masters, controllers) hold unrestricted roles.
    assert all(s["allowed"] and not s["labels"] for k, s in found.items() if k[1] != "alice")
    manifest = tmp_path / "cm.yaml"
    manifest.write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\n  namespace: t1\n"
        "  labels:\n    team: b\n"
    )
    code, decision = run_json(capsys, "check", "--as", "alice", "-f", str(manifest),
                              "--kubeconfig", str(kubeconfig))  # fmt: skip
    assert code == 1
    assert decision["reason"] == "LabelNotPermitted"
    assert decision["resource"] == "configmaps"  # the kind's resource, by discovery
    assert decision["message"].startswith('user "alice" may not create configmaps "c"')


def test_check_reads_a_manifest_from_stdin_with_the_current_context(
    cluster: tuple[FakeKubeAPI, Path],
) -> None:
    """No --kubeconfig: $KUBECONFIG and its current context, as kubectl does."""
    _, kubeconfig = cluster
    manifest = {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "c", "namespace": "t1", "labels": {"team": "a"}}}  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-m", "app", "check", "--as", "alice", "-f", "-"],
        input=json.dumps(manifest), capture_output=True, text=True, timeout=60, cwd=ROOT,
        env={"KUBECONFIG": str(kubeconfig), "PATH": "/usr/bin:/bin", "HOME": str(ROOT)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("allowed (LabelsPermitted)")


def test_yaml_output_is_the_json_document(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["who-can", "create", "configmaps", "-n", "t1", "-l", "team=a",
            "--rbac-dir", str(EXAMPLES)]  # fmt: skip
    assert main([*argv, "-o", "json"]) == 0
    as_json = json.loads(capsys.readouterr().out)
    assert main([*argv, "-o", "yaml"]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == as_json


@pytest.mark.parametrize(
    ("pod_team", "code", "expected"),
    [
        pytest.param("a", 0, "allowed (LabelsPermitted)", id="own-pod"),
        pytest.param("b", 1, 'the existing object\'s label team="b" is not permitted',
                     id="other-teams-pod"),
    ],
)  # fmt: skip
def test_check_against_a_cluster_reads_the_parent(
    cluster: tuple[FakeKubeAPI, Path],
    capsys: pytest.CaptureFixture[str],
    pod_team: str,
    code: int,
    expected: str,
) -> None:
    """``kubectl exec`` carries no pod: against a cluster, check reads it as the webhook does."""
    api, kubeconfig = cluster
    exec_role = role("exec", "t1", [rule("create get", "pods/exec")], {"pods": {"team": ["a"]}})
    api.apply("roles", exec_role[1])
    api.apply("rolebindings", binding("exec", "exec", "User:alice", namespace="t1")[1])
    api.put_object("/api/v1/namespaces/t1/pods/app", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "app", "namespace": "t1", "labels": {"team": pod_team}},
    })  # fmt: skip
    assert (
        main(
            [
                "check",
                "--as",
                "alice",
                "--verb",
                "connect",
                "--resource",
                "pods/exec",
                "-n",
                "t1",
                "--name",
                "app",
                "--kubeconfig",
                str(kubeconfig),
            ]
        )
        == code
    )
    assert expected in capsys.readouterr().out
    assert "/api/v1/namespaces/t1/pods/app" in {r.path for r in api.recorded()}


def test_audit_of_one_namespace_lists_only_there(
    cluster: tuple[FakeKubeAPI, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    api, kubeconfig = cluster
    api.collections["t1-configmaps"] = Collection(
        "configmaps", "/api/v1/namespaces/t1", "ConfigMap", "v1",
        items={key: obj for key, obj in api.collections["configmaps"].items.items()},
    )  # fmt: skip
    code, data = run_json(capsys, "audit", "-n", "t1", "--kubeconfig", str(kubeconfig))
    assert (code, data["objects"], [o["name"] for o in data["orphans"]]) == (1, 2, ["stray"])
    assert list(data["buckets"]) == ["t1"]
    paths = {r.path for r in api.recorded()}
    assert "/api/v1/namespaces/t1/configmaps" in paths and "/api/v1/configmaps" not in paths


def test_check_judges_every_object_of_a_manifest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = tmp_path / "two.yaml"
    manifest.write_text(yaml.safe_dump_all([
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": {"name": name, "namespace": "t1", "labels": {"team": team}}}
        for name, team in (("ours", "b"), ("theirs", "a"))
    ]))  # fmt: skip
    assert main(["check", "--as", "bob", "-f", str(manifest), "--rbac-dir", str(EXAMPLES)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == 'configmaps "ours" in namespace "t1":'
    assert out[1] == "allowed (LabelsPermitted)"
    theirs = out.index('configmaps "theirs" in namespace "t1":')
    assert out[theirs + 1].startswith("denied (403 LabelNotPermitted)")


def test_context_picks_another_cluster_of_the_kubeconfig(
    cluster: tuple[FakeKubeAPI, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """The current context points at nothing; ``--context`` picks the loopback server."""
    _, kubeconfig = cluster
    config = yaml.safe_load(kubeconfig.read_text())
    config["clusters"].append({"name": "gone", "cluster": {"server": "http://127.0.0.1:9"}})
    config["contexts"].append({"name": "gone", "context": {"cluster": "gone", "user": "webhook"}})
    config["current-context"] = "gone"
    kubeconfig.write_text(yaml.safe_dump(config))
    argv = ["who-can", "create", "configmaps", "-n", "t1", "-l", "team=a",
            "--kubeconfig", str(kubeconfig)]  # fmt: skip
    assert main(argv) == 2
    assert "cannot read RBAC from http://127.0.0.1:9" in capsys.readouterr().err
    code, data = run_json(capsys, *argv, "--context", "fake")
    assert code == 0
    assert any(s["subject"]["name"] == "alice" and s["allowed"] for s in data["subjects"])
