"""Placement on the command line: ``check -f`` of pods and workloads, ``who-can`` showing where
the deciding roles place pods, ``audit`` finding pods bound outside their pool, ``lint``, and
``test`` suites asserting placement verdicts; over a manifests directory with Nodes in two pools."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.cli import main
from tests.support import binding, meta, role, rule

POOL = "node-restriction.kubernetes.io/pool"
PLACEMENT = {"nodeLabels": {POOL: ["a"]}, "tolerations": [{"key": "pool", "values": ["a"]}]}


def node(name: str, pool: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": meta(name, labels={POOL: pool})}


def pod(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta(name, "t1", labels={"team": "a"}),
        "spec": {"containers": [{"name": "c", "image": "nginx"}], **spec},
    }


@pytest.fixture
def rbac(tmp_path: Path) -> Path:
    directory = tmp_path / "rbac"
    directory.mkdir()
    rules = [rule("*", "pods"), rule("*", "deployments", "apps")]
    objects = [
        node("a1", "a"),
        node("b1", "b"),
        role("team-a", "t1", rules, {"*": {"team": ["a"]}}, placement=PLACEMENT)[1],
        binding("alice", "team-a", "User:alice", namespace="t1")[1],
        pod("home", nodeName="a1"),
        pod("stray", nodeName="b1"),
    ]
    (directory / "all.yaml").write_text(yaml.safe_dump_all(objects))
    return directory


def manifest(tmp_path: Path, document: dict[str, Any]) -> str:
    path = tmp_path / f"{document['metadata']['name']}.yaml"
    path.write_text(yaml.safe_dump(document))
    return str(path)


def deployment(selector: dict[str, str]) -> dict[str, Any]:
    labels = {"team": "a"}
    template = {
        "metadata": {"labels": labels},
        "spec": {"nodeSelector": selector, "containers": [{"name": "c", "image": "x"}]},
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta("d", "t1", labels=labels),
        "spec": {"selector": {"matchLabels": labels}, "template": template},
    }


@pytest.mark.parametrize(
    ("document", "status", "said"),
    [
        pytest.param(pod("p", nodeSelector={POOL: "a"}), 0, "allowed", id="pod-pinned"),
        pytest.param(
            pod("p", nodeName="b1"), 1, f'which has label {POOL}="b"', id="pod-other-node"
        ),
        pytest.param(deployment({POOL: "a"}), 0, "allowed", id="deployment-pinned"),
        pytest.param(deployment({POOL: "b"}), 1, f"add nodeSelector {POOL}: a", id="deployment-b"),
    ],
)
def test_check_judges_placement_of_a_manifest(
    tmp_path: Path, rbac: Path, capsys: pytest.CaptureFixture[str],
    document: dict[str, Any], status: int, said: str,
) -> None:  # fmt: skip
    path = manifest(tmp_path, document)
    assert main(["check", "-f", path, "--as", "alice", "--rbac-dir", str(rbac)]) == status
    out = capsys.readouterr().out
    assert said in out
    if status:
        assert "PlacementNotPermitted" in out


def test_who_can_shows_placements(rbac: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["who-can", "create", "pods", "-n", "t1", "--rbac-dir", str(rbac), "-o", "json"]) == 0
    )
    (alice,) = json.loads(capsys.readouterr().out)["subjects"]
    assert alice["placements"] == [
        f"role t1/team-a: nodes {POOL} in [a]; tolerations pool in [a] "
        "(NoSchedule, PreferNoSchedule, NoExecute)"
    ]
    assert main(["who-can", "create", "pods", "-n", "t1", "--rbac-dir", str(rbac)]) == 0
    header, row = capsys.readouterr().out.splitlines()
    assert header.split()[-1] == "PLACEMENT" and f"nodes {POOL} in [a]" in row


def test_audit_finds_pods_outside_their_pool(
    rbac: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["audit", "--rbac-dir", str(rbac), "-o", "json"]) == 1
    (found,) = json.loads(capsys.readouterr().out)["misplaced"]
    assert (found["namespace"], found["name"], found["node"]) == ("t1", "stray", "b1")
    assert found["why"].startswith('node "b1" is outside its pool (role t1/team-a places it on')


def test_lint_reports_invalid_placements_and_warns_of_node_writable_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = role("bad", "t1", [rule("get", "pods")], placement={"nodeLabels": {POOL: []}})[1]
    warned = role("warned", "t1", [rule("get", "pods")], placement={"nodeLabels": {"pool": ["a"]}})[
        1
    ]
    path = tmp_path / "roles.yaml"
    path.write_text(yaml.safe_dump_all([bad, warned]))
    assert main(["lint", str(path)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (
        "invalid: role t1/bad: invalid labelrbac.io/placement annotation: schema violation at "
        f"nodeLabels/{POOL}: [] should be non-empty"
    )
    assert lines[1].startswith(
        "warning: role t1/warned: labelrbac.io/placement: node label pool is outside "
        "node-restriction.kubernetes.io/"
    )
    assert lines[2] == "ok: role t1/warned (0 permission entries)"


def test_a_suite_asserts_placement_verdicts(
    tmp_path: Path, rbac: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    objects = tmp_path / "objects"
    objects.mkdir()
    pinned = manifest(objects, pod("pinned", nodeSelector={POOL: "a"}))
    loose = manifest(objects, pod("loose"))
    suite = {
        "rbac": [str(rbac)],
        "cases": [
            {"name": "pinned", "as": "alice", "file": pinned, "expect": "allowed"},
            {"name": "loose", "as": "alice", "file": loose, "expect": "denied",
             "reason": "PlacementNotPermitted", "message": f"add nodeSelector {POOL}: a"},
        ],
    }  # fmt: skip
    (tmp_path / "label-rbac-test.yaml").write_text(yaml.safe_dump(suite))
    assert main(["test", str(tmp_path / "label-rbac-test.yaml"), "-o", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["passed"] == 2 and data["failed"] == 0


@pytest.mark.parametrize(
    ("extra", "pod_labels", "node_name", "why"),
    [
        pytest.param([], {"team": "a"}, "b1", 'node "b1" is outside its pool', id="outside"),
        pytest.param([], {"team": "a"}, "a1", None, id="inside"),
        pytest.param([], {"team": "a"}, "gone", 'node "gone" is not known', id="unknown-node"),
        pytest.param([], {"team": "z"}, "b1", None, id="no-bucket-holds-it"),
        pytest.param(
            [role("controller", rules=[rule("create", "pods")])], {"team": "a"}, "b1",
            'node "b1" is outside its pool', id="unannotated-holder-holds-no-bucket",
        ),
        pytest.param(
            [role("open-a", "t1", [rule("create", "pods")], {"pods": {"team": ["a"]}})],
            {"team": "a"}, "b1", None, id="unplaced-bucket-role",
        ),
        pytest.param(
            [role("pool-b", "t1", [rule("create", "pods")],
                  placement={"nodeLabels": {POOL: ["b"]}})],
            {"team": "a"}, "b1", None, id="placement-only-role-fits",
        ),
    ],
)  # fmt: skip
def test_misplaced(
    extra: list[tuple[str, dict[str, Any]]], pod_labels: dict[str, str], node_name: str,
    why: str | None,
) -> None:  # fmt: skip
    from app.engine.reverse import BoundPod, misplaced
    from tests.support import snapshot

    objects = [
        ("Node", node("a1", "a")),
        ("Node", node("b1", "b")),
        role("team-a", "t1", [rule("*", "pods")], {"*": {"team": ["a"]}}, placement=PLACEMENT),
        binding("alice", "team-a", "User:alice", namespace="t1"),
        *extra,
        *(binding(f"x-{kind}-{obj['metadata']['name']}", obj["metadata"]["name"], "User:x",
                  namespace=obj["metadata"].get("namespace", ""))
          for kind, obj in extra),
    ]  # fmt: skip
    found = misplaced(snapshot(*objects), [BoundPod("t1", "p", pod_labels, node_name)])
    assert [m.why.split(" (")[0] for m in found] == ([] if why is None else [why])


def test_a_renamed_placement_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    directory = tmp_path / "rbac"
    directory.mkdir()
    placed = role("team-a", "t1", [rule("*", "pods")], {"pods": {"team": ["a"]}})[1]
    placed["metadata"]["annotations"]["example.com/where"] = json.dumps(PLACEMENT)
    objects = [node("a1", "a"), placed, binding("alice", "team-a", "User:alice", namespace="t1")[1]]
    (directory / "all.yaml").write_text(yaml.safe_dump_all(objects))
    path = manifest(tmp_path, pod("p", nodeSelector={POOL: "b"}))
    base = ["check", "-f", path, "--as", "alice", "--rbac-dir", str(directory)]
    assert main(base) == 0  # the default key names no placement here
    assert main([*base, "--placement-key", "example.com/where"]) == 1
    assert "PlacementNotPermitted" in capsys.readouterr().out
