"""High availability through a real kube-apiserver: drain, kill and a soak, with figures.

A loopback control plane (etcd + kube-apiserver, tests/kube/controlplane.py) with label-rbac
installed from its manifests, two replicas behind HAProxy (TCP, health checks on ``/readyz``)
registered as both webhooks' URL (tests/e2e/replicas.py). A tenant's writes and reads go
through the API server, inside and outside her label bucket, each answer checked
(tests/e2e/load.py).

1. Faults: steady traffic, one replica drained (SIGTERM) and started again, the other killed
   (SIGKILL) and started again, steady again. Per phase: requests, wrong decisions, failures,
   latency p50/p99.
2. Soak: ``--soak-minutes`` of the same traffic while an admin churns RBAC (bob's binding
   made and removed, team-b's annotation widened and narrowed: nothing alice may do changes).
   Per interval: requests, wrong, failed, p50/p99, RSS of each replica (arbiter + workers).

Exit status 1 on any wrong decision, or a failure outside the kill phase.

    .venv/bin/python -m bench ha --steady 400 --soak-minutes 3
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.core.processes import rss_bytes
from tests.e2e.load import FAILED, WRONG, Load, probes, summary
from tests.e2e.replicas import PHASES, Replicated, replicated, run_faults
from tests.kube.controlplane import ADMIN
from tests.kube.support import fresh_namespace, install_tenants

COLUMNS = ("requests", "right", "wrong", "failed", "p50_ms", "p99_ms")


def churn(ha: Replicated, namespace: str, stop: threading.Event, per_second: float) -> int:
    """RBAC changes that never touch alice's bucket, until ``stop``; how many were made."""
    cp = ha.cluster.control_plane
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}"
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "churn-bob", "namespace": namespace},
        "subjects": [{"kind": "User", "name": "bob", "apiGroup": "rbac.authorization.k8s.io"}],
        "roleRef": {"kind": "Role", "name": "team-b", "apiGroup": "rbac.authorization.k8s.io"},
    }
    made = 0
    while not stop.wait(1 / per_second):
        step = made % 4
        if step == 0:
            status, body = cp.request(ADMIN, "POST", f"{rbac}/rolebindings", binding)
        elif step == 2:
            status, body = cp.request(ADMIN, "DELETE", f"{rbac}/rolebindings/churn-bob")
        else:
            teams = ["b", "c"] if step == 1 else ["b"]
            permissions = json.dumps({"configmaps": {"team": teams}})
            status, body = cp.request(
                ADMIN,
                "PATCH",
                f"{rbac}/roles/team-b",
                {"metadata": {"annotations": {"labelrbac.io/permissions": permissions}}},
                content_type="application/merge-patch+json",
            )
        if status >= 300:
            print(f"churn: {status} {body}", file=sys.stderr)
        made += 1
    return made


def print_rows(rows: list[dict[str, object]], key: str, extra: tuple[str, ...] = ()) -> None:
    names = (key, *COLUMNS, *extra)
    print(" ".join(f"{n:>9}" for n in names))
    for row in rows:
        print(" ".join(f"{row[n]!s:>9}" for n in names))


def faults(ha: Replicated, namespace: str, args: argparse.Namespace) -> int:
    load = Load(ha.cluster.control_plane, probes(namespace), threads=args.threads).start()
    try:
        run_faults(ha, load, steady=args.steady)
    finally:
        load.stop()
    print("## faults: r1 drained (SIGTERM), then r2 killed (SIGKILL), each started again")
    print_rows(summary(load, PHASES), "phase")
    for result in load.of(outcome=FAILED):
        print(f"  failed in {result.phase}: {result.probe} {result.detail}")
    wrong = load.of(outcome=WRONG)
    outside_kill = [r for r in load.of(outcome=FAILED) if r.phase != "kill"]
    return 1 if wrong or outside_kill else 0


def soak(ha: Replicated, namespace: str, args: argparse.Namespace) -> int:
    load = Load(ha.cluster.control_plane, probes(namespace), threads=args.threads)
    load.phase = "0"
    stop = threading.Event()
    made: list[int] = []
    churner = threading.Thread(
        target=lambda: made.append(churn(ha, namespace, stop, args.churn_per_second))
    )
    load.start()
    churner.start()
    rows: list[dict[str, object]] = []
    end = time.monotonic() + args.soak_minutes * 60
    interval = 0
    try:
        while time.monotonic() < end:
            time.sleep(min(args.interval, max(0.0, end - time.monotonic())))
            phase = str(interval)
            interval += 1
            load.phase = str(interval)
            (row,) = summary(load, [phase])
            for name, server in ha.servers.items():
                row[f"rss_{name}_mb"] = round(rss_bytes(server.process.pid) / 1e6, 1)
            rows.append(row)
    finally:
        stop.set()
        churner.join(timeout=30)
        load.stop()
    print(f"## soak: {args.soak_minutes} min, {made[0] if made else 0} RBAC changes")
    print_rows(rows, "phase", tuple(f"rss_{n}_mb" for n in ha.servers))
    wrong = load.of(outcome=WRONG)
    failed = load.of(outcome=FAILED)
    for result in (wrong + failed)[:10]:
        print(f"  {result.outcome}: {result.probe} {result.detail}")
    return 1 if wrong or failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steady", type=int, default=400, help="requests per quiet phase")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--soak-minutes", type=float, default=3.0)
    parser.add_argument("--interval", type=float, default=30.0, help="seconds per soak row")
    parser.add_argument("--churn-per-second", type=float, default=2.0)
    args = parser.parse_args(argv)
    with (
        tempfile.TemporaryDirectory(prefix="label-rbac-ha-") as tmp,
        replicated(Path(tmp)) as ha,
    ):
        namespace = fresh_namespace(ha.cluster)
        install_tenants(ha.cluster, namespace)
        status = faults(ha, namespace, args)
        status |= soak(ha, namespace, args)
    return status


if __name__ == "__main__":
    sys.exit(main())
