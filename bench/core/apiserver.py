"""The loopback API server process of the scale, churn, traffic and HTTP churn benchmarks.

The loopback API server of the tests (``tests/kubeapi.py``: list and watch as kube-apiserver
does them, every request and response byte counted) serves the generated layout of
``bench.core.layout``, written as the recorded ``list-<resource>.json`` files it loads, in a
process of its own as the API server is. For the churn benchmarks the same process makes RBAC
changes on a schedule: per ten, three Role annotation edits, three RoleBinding subject edits
(every 500th change a ClusterRole annotation edit instead), two RoleBindings created and one of
them deleted again.
"""

from __future__ import annotations

import copy
import gc
import itertools
import json
import sys
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from bench.core.layout import ANNOTATION, cluster_objects, layout, namespace_objects
from tests.kubeapi import RESOURCES, FakeKubeAPI

RBAC = "rbac.authorization.k8s.io"
KINDS = ("roles", "clusterroles", "rolebindings", "clusterrolebindings", "namespaces")


def write_lists(directory: Path, objects: int) -> int:
    """The generated objects as the recorded ``list-<resource>.json`` files the server loads."""
    namespaces, cluster_roles = layout(objects)
    by_kind: dict[str, list[dict[str, Any]]] = {r: [] for r in KINDS}
    kinds = {RESOURCES[r][1]: r for r in KINDS}
    rv = itertools.count(1)
    docs = itertools.chain(
        cluster_objects(cluster_roles),
        *(namespace_objects(i, cluster_roles) for i in range(namespaces)),
    )
    for obj in docs:
        meta = obj["metadata"]
        meta["uid"] = f"{kinds[obj['kind']]}-{meta.get('namespace', '')}-{meta['name']}"
        meta["resourceVersion"] = str(next(rv))
        by_kind[kinds[obj["kind"]]].append(obj)
    last = str(next(rv))
    directory.mkdir(parents=True, exist_ok=True)
    for resource, items in by_kind.items():
        _, kind, api_version, fixture = RESOURCES[resource]
        assert fixture is not None
        document = {"kind": f"{kind}List", "apiVersion": api_version,
                    "metadata": {"resourceVersion": last}, "items": items}  # fmt: skip
        (directory / fixture).write_text(json.dumps(document))
    return sum(len(items) for items in by_kind.values())


@dataclass(frozen=True)
class Step:
    """Change number ``k``: what the server changes, and who can tell it happened."""

    k: int
    action: str  # role | subjects | clusterrole | add | delete
    namespace: str
    name: str
    cluster_role: int = 0
    deletes: int = -1  # for a deletion: the position in the plan of the creation it undoes


def steps(count: int, objects: int, first: int = 0) -> list[Step]:
    """The changes, numbered from ``first``, in order: spread over the namespaces so that no
    object changes twice in a row."""
    namespaces, cluster_roles = layout(objects)
    out: list[Step] = []
    for k in range(first, first + count):
        ns = f"tenant-{(k * 7919) % namespaces}"
        kind = k % 10
        if kind < 3:
            out.append(Step(k, "role", ns, "team-own"))
        elif kind < 6:
            if kind == 5 and k % 500 == 5:  # ten seconds at 50/s
                out.append(Step(k, "clusterrole", "", "", (k // 500) % cluster_roles))
            else:
                out.append(Step(k, "subjects", ns, "team-shared"))
        elif kind < 8:
            out.append(Step(k, "add", ns, f"churn-{k}"))
        elif kind == 8 and len(out) >= 12:
            # The binding created ten changes (200 ms at 50/s) before: it has shown by now.
            added = out[-12]
            out.append(Step(k, "delete", added.namespace, added.name, deletes=len(out) - 12))
        else:
            out.append(Step(k, "subjects", ns, "team-shared"))
    return out


def permissions(step: Step) -> str:
    if step.action == "clusterrole":
        return json.dumps({"*": {"team": ["*"]}, "configmaps": {"env": [f"p{step.k}"]}})
    i = step.namespace.removeprefix("tenant-")
    return json.dumps({"configmaps": {"team": [f"t{i}-*", f"c{step.k}"]},
                       "pods": {"team": [f"t{i}-*"]}})  # fmt: skip


def make_change(api: Any, step: Step) -> None:
    """Make ``step`` on the server (in the server's process)."""
    if step.action == "delete":
        api.delete("rolebindings", step.name, step.namespace)
        return
    if step.action == "add":
        api.apply("rolebindings", {
            "apiVersion": f"{RBAC}/v1", "kind": "RoleBinding",
            "metadata": {"name": step.name, "namespace": step.namespace},
            "roleRef": {"apiGroup": RBAC, "kind": "Role", "name": "team-shared"},
            "subjects": [{"apiGroup": RBAC, "kind": "User", "name": f"new-{step.k}"}],
        })  # fmt: skip
        return
    resource = {"role": "roles", "subjects": "rolebindings", "clusterrole": "clusterroles"}
    name = f"platform-{step.cluster_role}" if step.action == "clusterrole" else step.name
    collection = api.collections[resource[step.action]]
    obj = copy.deepcopy(collection.items[(step.namespace, name)])
    if step.action == "subjects":
        kept = [s for s in obj["subjects"] if not s["name"].startswith("churn-")]
        obj["subjects"] = [*kept, {"apiGroup": RBAC, "kind": "User", "name": f"churn-{step.k}"}]
    else:
        obj["metadata"].setdefault("annotations", {})[ANNOTATION] = permissions(step)
    api.apply(resource[step.action], obj)


def serve_lists(lists: Path, kubeconfig: Path) -> None:
    """Serve the lists in ``lists`` until stdin closes; print this process's CPU seconds spent
    serving when a line arrives on stdin (the measurement is done)."""
    api = FakeKubeAPI(lists).start()
    api.write_kubeconfig(kubeconfig)
    cpu = time.process_time()
    print("serving", flush=True)
    sys.stdin.readline()  # the measurement is done
    print(json.dumps({"server_s": time.process_time() - cpu}), flush=True)
    sys.stdin.read()
    api.stop()


def serve(
    lists: str, kubeconfig: str, conn: Connection, made: Any = None, made_at: Any = None
) -> None:
    """Serve ``lists``; make each plan received on ``conn`` at its rate, then send back when
    each change was made. If given, ``made`` (a shared integer) counts the changes made so far
    and ``made_at`` (a shared array) receives when each was made, as they are made."""
    api = FakeKubeAPI(Path(lists)).start()
    api.write_kubeconfig(Path(kubeconfig))
    # The objects served live as long as the server: out of its collector's sight, else each
    # whole collection (0.4 s at 100k objects) would hold back the watch events, a pause
    # kube-apiserver's concurrent collector does not make.
    gc.freeze()
    conn.send("ready")
    while True:
        message = conn.recv()
        if message == "stop":
            api.stop()
            return
        rate, plan = message
        started = time.monotonic()
        sent = []
        for n, step in enumerate(plan):
            delay = started + n / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            sent.append(time.monotonic())
            make_change(api, step)
            if made is not None:
                made_at[made.value] = sent[-1]
                made.value += 1  # after the time: a reader of the count finds the times there
        conn.send(sent)
