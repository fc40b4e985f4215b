"""API-server CPU per namespace the compiler writes: the status with the parameters, or apart, and
the create of new parameters, by server-side apply or by POST.

A loopback control plane (tests/kube/controlplane.py) with the compiled component's CRD, RBAC and
policies receives, as the compiler's ServiceAccount, ``--writes`` server-side applies of real
rendered parameters (``bench.compile``'s layout at ``--objects``, a new subject each time so that
every apply changes the object), eight at a time, in two shapes measured in the same run:

- **together**: one apply of the parameters and their status (the kind has no status
  subresource: what the compiler does);
- **replaced**: the same content as a JSON patch replacing the spec and the status (an update
  rather than an apply: what skipping server-side apply would save);
- **apart**: the CRD given a status subresource, an apply of the parameters, then one of the
  status through ``/status`` (two requests per namespace);
- **created**: the apply creating the parameters in a namespace that has none (what a first
  compile sends per namespace);
- **posted**: the same object created by a POST: what creating without server-side apply would
  save.

For each, the API server's and etcd's CPU per namespace written (from /proc) and the writes a
second; a merge patch of a Namespace label (the compiler's mark) is the baseline of every
round. Rounds alternate the shapes.

    python -m bench writes [--objects 1000] [--writes 600] [--rounds 2] [--json FILE]
"""

from __future__ import annotations

import argparse
import http.client
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from app.compiled.admission_policy import COMPILER
from app.engine.incremental import LiveSnapshot
from app.engine.params import API_VERSION, MARK, NAME, PLURAL, namespaces_of, render
from bench.core.compiled import compiled_objects, target
from bench.core.kube import Client, documents
from bench.core.processes import process_cpu
from tests.kube.controlplane import ADMIN, COMPILER_USER, ControlPlane, User

APPLY = {"Content-Type": "application/apply-patch+yaml"}
MERGE = {"Content-Type": "application/merge-patch+json"}
JSON_PATCH = {"Content-Type": "application/json-patch+json"}
JSON = {"Content-Type": "application/json"}
QUERY = "?fieldManager=label-rbac-compiler&force=true"
CRD = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/labelrbacparams.labelrbac.io"
CLIENTS = 8
RBAC = "rbac.authorization.k8s.io"
STATUS_RBAC = [
    {"apiVersion": f"{RBAC}/v1", "kind": "ClusterRole", "metadata": {"name": "bench-status"},
     "rules": [{"apiGroups": ["labelrbac.io"], "resources": ["labelrbacparams/status"],
                "verbs": ["patch"]}]},
    {"apiVersion": f"{RBAC}/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "bench-status"},
     "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": "bench-status"},
     "subjects": [{"kind": "ServiceAccount", "name": COMPILER.rsplit(":", 1)[1],
                   "namespace": "label-rbac"}]},
]  # fmt: skip

# One write: (method, path, body, headers).
Write = tuple[str, str, Any, dict[str, str]]
# The writes of one namespace, given its parameters and a serial number.
Shape = Callable[[dict[str, Any], int], list[Write]]


def manifests(objects: int, most: int) -> list[dict[str, Any]]:
    """The rendered parameters of up to ``most`` namespaces of the layout (those indexing
    something)."""
    by_kind, _ = compiled_objects(objects)
    snapshot = LiveSnapshot.build(by_kind).snapshot
    found = []
    for namespace in sorted(namespaces_of(snapshot)):
        rendered = render(snapshot, namespace, target())
        if rendered.spec.get("roles"):
            found.append(rendered.manifest())
        if len(found) == most:
            break
    return found


def changed(manifest: dict[str, Any], k: int) -> dict[str, Any]:
    """``manifest`` with one more subject (given its first role), so the apply writes."""
    spec = manifest["spec"]
    first = next(iter(spec["roles"]))
    return {**manifest, "spec": {**spec, "users": {**spec["users"], f"bench-{k}": [first]}}}


def status(k: int) -> dict[str, Any]:
    return {
        "observedResourceVersion": str(k),
        "grants": 3,
        "bytes": 3000,
        "conditions": [
            {
                "type": "Compiled",
                "status": "True",
                "reason": "Compiled",
                "message": "the label rule of this namespace is compiled",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }
        ],
    }


def path_of(manifest: dict[str, Any]) -> str:
    namespace = manifest["metadata"]["namespace"]
    return f"/apis/{API_VERSION}/namespaces/{namespace}/{PLURAL}/{NAME}"


def together(manifest: dict[str, Any], k: int) -> list[Write]:
    body = {**changed(manifest, k), "status": status(k)}
    return [("PATCH", path_of(manifest) + QUERY, body, APPLY)]


def apart(manifest: dict[str, Any], k: int) -> list[Write]:
    only_status = {key: v for key, v in manifest.items() if key != "spec"}
    return [
        ("PATCH", path_of(manifest) + QUERY, changed(manifest, k), APPLY),
        ("PATCH", path_of(manifest) + "/status" + QUERY, {**only_status, "status": status(k)},
         APPLY),
    ]  # fmt: skip


def replaced(manifest: dict[str, Any], k: int) -> list[Write]:
    body = [
        {"op": "replace", "path": "/spec", "value": changed(manifest, k)["spec"]},
        {"op": "add", "path": "/status", "value": status(k)},
    ]
    query = "?fieldManager=label-rbac-compiler"
    return [("PATCH", path_of(manifest) + query, body, JSON_PATCH)]


def fresh(k: int) -> str:
    """The namespace, without parameters, that the ``k``-th creating write goes to."""
    return f"bench-new-{k}"


def in_fresh(manifest: dict[str, Any], k: int) -> dict[str, Any]:
    """``manifest`` with its status, in the ``k``-th namespace without parameters."""
    meta = {**manifest["metadata"], "namespace": fresh(k)}
    return {**manifest, "metadata": meta, "status": status(k)}


def created(manifest: dict[str, Any], k: int) -> list[Write]:
    body = in_fresh(manifest, k)
    return [("PATCH", path_of(body) + QUERY, body, APPLY)]


def posted(manifest: dict[str, Any], k: int) -> list[Write]:
    body = in_fresh(manifest, k)
    collection = f"/apis/{API_VERSION}/namespaces/{fresh(k)}/{PLURAL}"
    return [("POST", collection + "?fieldManager=label-rbac-compiler", body, JSON)]


def mark(manifest: dict[str, Any], k: int) -> list[Write]:
    namespace = manifest["metadata"]["namespace"]
    body = {"metadata": {"labels": {MARK: "true" if k % 2 else None}}}
    return [("PATCH", f"/api/v1/namespaces/{namespace}", body, MERGE)]


# (name, shape, the CRD with a status subresource, whether it creates the parameters)
SHAPES: list[tuple[str, Shape, bool, bool]] = [
    ("together", together, False, False),
    ("replaced", replaced, False, False),
    ("apart", apart, True, False),
    ("created", created, False, True),
    ("posted", posted, False, True),
]


class Bench:
    def __init__(self, cp: ControlPlane, found: list[dict[str, Any]]) -> None:
        self.cp = cp
        self.found = found
        self.admin = Client(cp.url, cp.ca, cp.users[ADMIN].token)
        self._local = threading.local()
        self.k = 0

    def _namespace(self, k: int) -> None:
        status, answer = self.admin.send(
            "POST", "/api/v1/namespaces", {"metadata": {"name": fresh(k)}}
        )
        if status >= 300:
            raise RuntimeError(f"namespace {fresh(k)}: {status} {answer}")

    def client(self) -> Client:
        if not hasattr(self._local, "client"):
            self._local.client = Client(self.cp.url, self.cp.ca, self.cp.users[COMPILER].token)
        client: Client = self._local.client
        return client

    def subresource(self, on: bool) -> None:
        """Give the CRD a status subresource, or take it away, and wait until it is served so."""
        (version,) = documents("crd.yaml")[0]["spec"]["versions"]  # a list is replaced whole
        version.pop("subresources", None)
        if on:
            version["subresources"] = {"status": {}}
        status, answer = self.admin.send("PATCH", CRD, {"spec": {"versions": [version]}}, MERGE)
        if status >= 300:
            raise RuntimeError(f"CRD: {status} {answer}")
        probe = path_of(self.found[0]) + "/status"
        deadline = time.monotonic() + 60
        while self._status_served(probe) is not on:
            if time.monotonic() > deadline:
                raise RuntimeError("the CRD's status subresource did not change in time")
            time.sleep(0.2)
        time.sleep(1)

    def _status_served(self, probe: str) -> bool | None:
        """Whether ``probe`` answers; None when the API server dropped the request, as it does
        with requests reaching a CRD whose storage it is replacing."""
        try:
            return self.admin.send("GET", probe)[0] == 200
        except (OSError, http.client.HTTPException):
            return None

    def measure(self, shape: Shape, n: int, creates: bool = False) -> dict[str, float]:
        """Write ``n`` namespaces in ``shape``: CPU (ms) per namespace and namespaces a second.
        With ``creates``, the namespaces it writes to (``fresh``) are made first."""
        assert self.cp.apiserver is not None and self.cp.etcd is not None
        apiserver, etcd = self.cp.apiserver.pid, self.cp.etcd.pid
        base = self.k
        self.k += n
        if creates:
            with ThreadPoolExecutor(CLIENTS) as pool:
                list(pool.map(self._namespace, range(base, base + n)))
        before = process_cpu(apiserver), process_cpu(etcd)

        def one(j: int) -> None:
            for write in shape(self.found[j % len(self.found)], base + j):
                status, answer = self.client().send(*write)
                if status >= 300:
                    raise RuntimeError(f"{write[0]} {write[1]}: {status} {answer}")

        started = time.monotonic()
        with ThreadPoolExecutor(CLIENTS) as pool:
            list(pool.map(one, range(n)))
        seconds = time.monotonic() - started
        return {
            "apiserver_ms": 1000 * (process_cpu(apiserver) - before[0]) / n,
            "etcd_ms": 1000 * (process_cpu(etcd) - before[1]) / n,
            "per_s": n / seconds,
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=1000, help="RBAC objects of the layout")
    parser.add_argument("--writes", type=int, default=600, help="namespaces written per round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    found = manifests(args.objects, 100)
    sizes = [len(json.dumps(m["spec"])) for m in found]
    print(f"{len(found)} namespaces' parameters, {statistics.median(sizes) / 1000:.1f} KB median",
          flush=True)  # fmt: skip
    workdir = Path(tempfile.mkdtemp(prefix="bench-writes-"))
    cp = ControlPlane(workdir, users=(User(ADMIN, ("system:masters",)), COMPILER_USER))
    cp.start(timeout=180)
    rows: list[dict[str, Any]] = []
    try:
        bench = Bench(cp, found)
        bench.admin.send("POST", "/api/v1/namespaces", {"metadata": {"name": "label-rbac"}})
        cp.apply(ADMIN, documents("crd.yaml"))
        time.sleep(3)
        cp.apply(ADMIN, documents("rbac.yaml"))
        cp.apply(ADMIN, STATUS_RBAC)  # for the shape apart, as the compiler once had it
        for manifest in found:
            namespace = {"metadata": {"name": manifest["metadata"]["namespace"]}}
            bench.admin.send("POST", "/api/v1/namespaces", namespace)
        cp.apply(ADMIN, documents("policy.yaml"))
        time.sleep(3)
        bench.measure(together, len(found))  # every object created, the policies warm
        for r in range(args.rounds):
            for name, shape, subresource, creates in SHAPES:
                bench.subresource(subresource)
                baseline = bench.measure(mark, args.writes)
                row: dict[str, Any] = {"round": r, "shape": name,
                                       **bench.measure(shape, args.writes, creates),
                                       "mark_apiserver_ms": baseline["apiserver_ms"]}  # fmt: skip
                rows.append(row)
                print(f"round {r} {name:<8} API server {row['apiserver_ms']:5.2f} ms CPU a "
                      f"namespace ({row['apiserver_ms'] / row['mark_apiserver_ms']:.1f}x a "
                      f"Namespace mark's {row['mark_apiserver_ms']:.2f} ms), etcd "
                      f"{row['etcd_ms']:.2f} ms, {row['per_s']:.0f} namespaces/s",
                      flush=True)  # fmt: skip
    finally:
        cp.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    for name, *_ in SHAPES:
        mine = [row for row in rows if row["shape"] == name]
        cpu = statistics.median(r["apiserver_ms"] for r in mine)
        rate = statistics.median(r["per_s"] for r in mine)
        print(f"{name:<8} median: API server {cpu:.2f} ms a namespace, {rate:.0f} namespaces/s")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
