"""Tenant creates through a real kube-apiserver: the compiled policy, no policy, a trivial one.

The compiled label rule is measured against no admission and against a trivial
ValidatingAdmissionPolicy, in the same run.

A loopback control plane (tests/kube/controlplane.py: etcd and kube-apiserver) holds a tenant,
alice, bound to a Role restricting configmaps to ``team=a``, and N RoleBindings in her namespace
(other users bound to ten label-restricted Roles). For each N, wrk POSTs ConfigMaps labeled
``team=a`` as alice (each a new object: ``generateName``) at each concurrency, under

- ``none``: no policy bound (RBAC only);
- ``trivial``: one policy matching the same writes, one constant expression (the floor of any
  policy);
- ``compiled``: manifests/compiled/policy.yaml with the parameters ``label-rbac compile`` writes.

Setups alternate within each round and every figure is the median of the rounds. Prints p50
latency and throughput per setup, the p50 each policy adds over ``none`` and the throughput ratio
to ``none``; ``--json FILE`` writes the rows.

    python -m bench vap --bindings 10,5000 --connections 1,8 --seconds 5 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from app.admission_policy import COMPILER
from app.engine.context import Options
from app.engine.kinds import snapshot_from_objects
from app.engine.model import Resource
from app.engine.params import NAME, PLURAL, Target, render
from app.settings import Settings
from bench.core.processes import ROOT
from tests.kube.controlplane import ADMIN, ControlPlane, User

COMPILED = ROOT / "manifests" / "compiled"
NS = "t1"
ALICE = User("alice", ("tenants",))
COMPILER_USER = User(COMPILER, ("system:serviceaccounts",))
SETUPS = ("none", "trivial", "compiled")
RBAC_API = "/apis/rbac.authorization.k8s.io/v1"

TRIVIAL = [
    {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": "bench-trivial"},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": ["*"],
                        "apiVersions": ["*"],
                        "operations": ["CREATE", "UPDATE", "DELETE"],
                        "resources": ["*"],
                        "scope": "Namespaced",
                    }
                ]
            },
            "validations": [{"expression": "true"}],
        },
    },
    {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": "bench-trivial"},
        "spec": {"policyName": "bench-trivial", "validationActions": ["Deny"]},
    },
]

BODY = {
    "apiVersion": "v1",
    "kind": "ConfigMap",
    "metadata": {"generateName": "b-", "labels": {"team": "a"}},
    "data": {"k": "v"},
}
LUA = f"""
wrk.method = "POST"
wrk.body = '{json.dumps(BODY, separators=(",", ":"))}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer TOKEN"
"""


def documents(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((COMPILED / name).read_text()) if d]


def role(name: str, team: str) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {
            "name": name,
            "namespace": NS,
            "annotations": {
                "labelrbac.io/permissions": json.dumps({"configmaps": {"team": [team]}})
            },
        },
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["*"]}],
    }


def role_binding(name: str, role_name: str, user: str) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": NS},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role_name},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }


def ok(cp: ControlPlane, user: str, method: str, path: str, body: Any = None) -> Any:
    status, answer = cp.request(user, method, path, body)
    if status >= 300 and status != 409:
        raise RuntimeError(f"{method} {path}: {status} {answer}")
    return answer


def grow_bindings(cp: ControlPlane, total: int) -> None:
    """Bring the namespace to ``total`` RoleBindings (alice's and synthetic ones)."""
    have = len(ok(cp, ADMIN, "GET", f"{RBAC_API}/namespaces/{NS}/rolebindings")["items"])
    todo = [
        role_binding(f"syn-{i}", f"team-{i % 10}", f"user-{i}") for i in range(have - 1, total - 1)
    ]
    path = f"{RBAC_API}/namespaces/{NS}/rolebindings"
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda b: ok(cp, ADMIN, "POST", path, b), todo))


def write_params(cp: ControlPlane) -> int:
    """Compile the namespace as the compiler does and write it as the compiler; its bytes."""
    objects = [
        (kind, item)
        for kind, path in (
            ("Role", f"{RBAC_API}/roles"),
            ("ClusterRole", f"{RBAC_API}/clusterroles"),
            ("RoleBinding", f"{RBAC_API}/rolebindings"),
            ("ClusterRoleBinding", f"{RBAC_API}/clusterrolebindings"),
            ("Namespace", "/api/v1/namespaces"),
        )
        for item in ok(cp, ADMIN, "GET", path)["items"]
    ]
    snapshot = snapshot_from_objects(objects, Settings().compiler)
    target = Target.of([Resource("", "configmaps")], Options())
    size = 0
    for namespace in sorted(snapshot.namespaces):
        rendered = render(snapshot, namespace, target)
        body = yaml.safe_dump(rendered.manifest())
        path = f"/apis/labelrbac.io/v1alpha1/namespaces/{namespace}/{PLURAL}/{NAME}"
        done = cp.kubectl(
            COMPILER,
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=label-rbac-compiler",
            "-f",
            "-",
            input=body,
        )
        if done.returncode != 0:
            raise RuntimeError(f"apply {path}: {done.stderr}")
        if namespace == NS:
            size = rendered.size
    return size


def configure(cp: ControlPlane, setup: str) -> None:
    """Bind exactly the policies of ``setup``; wait until the API server applies them."""
    for kind in ("validatingadmissionpolicybindings", "validatingadmissionpolicies"):
        cp.kubectl(ADMIN, "delete", kind, "--all", "--wait=true")
    if setup == "trivial":
        cp.apply(ADMIN, TRIVIAL)
    elif setup == "compiled":
        cp.apply(ADMIN, documents("policy.yaml"))
    time.sleep(3)  # the policy informer picks bindings up within a second or two
    probe = {"metadata": {"generateName": "p-", "labels": {"team": "b"}}}
    status, _ = cp.request("alice", "POST", f"/api/v1/namespaces/{NS}/configmaps?dryRun=All", probe)
    if (status == 403) != (setup == "compiled"):
        raise RuntimeError(f"{setup}: the probe answered {status}")


def wrk(cp: ControlPlane, connections: int, seconds: int, script: Path) -> tuple[float, float]:
    """(p50 ms, requests/s) of POSTs as alice."""
    url = f"{cp.url}/api/v1/namespaces/{NS}/configmaps"
    out = subprocess.run(
        ["wrk", "-t", str(min(connections, 2)), "-c", str(connections), "-d", f"{seconds}s",
         "--latency", "-s", str(script), url],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    p50 = re.search(r"^\s+50%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
    rate = re.search(r"^Requests/sec:\s+([\d.]+)", out, re.M)
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if p50 is None or rate is None:
        raise RuntimeError(f"cannot read wrk's output:\n{out}")
    if non2xx:
        raise RuntimeError(f"{non2xx.group(1)} creates failed:\n{out}")
    scale = {"us": 0.001, "ms": 1.0, "s": 1000.0}[p50.group(2)]
    ok(cp, ADMIN, "DELETE", f"/api/v1/namespaces/{NS}/configmaps")  # keep etcd small
    return float(p50.group(1)) * scale, float(rate.group(1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bindings", default="10,5000")
    parser.add_argument("--connections", default="1,8")
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if shutil.which("wrk") is None:
        print("python -m bench vap: wrk is not installed", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="bench-vap-"))
    cp = ControlPlane(workdir, users=(User(ADMIN, ("system:masters",)), ALICE, COMPILER_USER))
    cp.start()
    rows: list[dict[str, Any]] = []
    try:
        script = workdir / "post.lua"
        script.write_text(LUA.replace("TOKEN", cp.users["alice"].token))
        for namespace in (NS, "label-rbac"):
            ok(cp, ADMIN, "POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
        cp.apply(ADMIN, documents("crd.yaml"))
        time.sleep(3)
        cp.apply(ADMIN, documents("rbac.yaml"))
        cp.apply(ADMIN, [role(f"team-{i}", str(i)) for i in range(10)] + [role("team-a", "a")])
        cp.apply(ADMIN, [role_binding("alice", "team-a", "alice")])
        for total in (int(n) for n in args.bindings.split(",")):
            grow_bindings(cp, total)
            size = write_params(cp)
            results: dict[tuple[str, int], list[tuple[float, float]]] = {}
            for _ in range(args.rounds):
                for setup in SETUPS:
                    configure(cp, setup)
                    for c in (int(n) for n in args.connections.split(",")):
                        results.setdefault((setup, c), []).append(wrk(cp, c, args.seconds, script))
            for c in (int(n) for n in args.connections.split(",")):
                base_p50 = statistics.median(r[0] for r in results[("none", c)])
                base_rate = statistics.median(r[1] for r in results[("none", c)])
                for setup in SETUPS:
                    p50 = statistics.median(r[0] for r in results[(setup, c)])
                    rate = statistics.median(r[1] for r in results[(setup, c)])
                    row = {
                        "bindings": total, "params_bytes": size, "connections": c,
                        "setup": setup, "p50_ms": round(p50, 3), "rps": round(rate, 1),
                        "added_p50_ms": round(p50 - base_p50, 3),
                        "throughput_ratio": round(rate / base_rate, 3),
                    }  # fmt: skip
                    rows.append(row)
                    print(
                        f"bindings={total:<5} params={size:>8} B  C={c}  {setup:<8} "
                        f"p50 {p50:6.2f} ms (+{p50 - base_p50:5.2f})  {rate:7.0f} req/s "
                        f"({rate / base_rate:.2f}x)",
                        flush=True,
                    )
    finally:
        cp.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
