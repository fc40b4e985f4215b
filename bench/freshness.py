"""RBAC change to enforcement under churn, through a real kube-apiserver: compiled and webhook.

A loopback control plane (tests/kube/controlplane.py: etcd and kube-apiserver) with the compiled
component installed (manifests/compiled: CRD, the compiler's RBAC, the policies) is loaded with
about ``--objects`` RBAC objects of the scale benchmark's layout (``bench.core.layout``), by
parallel clients; the time it took is printed. Then run, as a cluster runs them:

- the compiler, ``python -m app compile`` as its ServiceAccount (as tests/kube/test_compile.py
  starts it); the time until every namespace has parameters is printed;
- the webhook, ``python -m app serve`` as its ServiceAccount, watching the same API server. It
  is asked directly, over HTTPS, as the API server would ask it: its registration (the shipped
  one) selects no namespace, and is there for the compiler, which keeps its coverage condition
  in it as in a cluster (the bench waits for that condition before it goes on).

RBAC then changes at ``--rate`` changes per second for ``--seconds`` (per ten: three Role
annotation edits, three RoleBinding subject edits, two RoleBindings created and one deleted ten
changes later, spread over the namespaces). Among them, every ``--every`` seconds, a measured
change in a namespace the churn leaves alone, alternating:

- **bound**: a new RoleBinding gives a new user a label-restricted Role; enforced once the API
  server's answer to that user's dry-run create with a label the Role does not allow is the
  label denial (before: RBAC's refusal, or the policy's "do not list this user yet");
- **narrowed**: a bound Role's annotation loses a value; enforced at the first denial of a
  dry-run create with that value (the API server: the compiled policy; the webhook: its
  ``/validate`` answer, from its watch cache, the baseline).

Latency runs from the moment the change's request was sent; probes poll every 20 ms (every
250 ms after the first second), each setup in a thread of its own; a change not enforced within
a minute counts as a failure. Where the compiled policy's time goes is read from the API
server's audit log: change → the compiler's write of the namespace's parameters (watch, queue,
render) → the write's end (server-side apply) → enforcement (the API server's informer).

The cluster-wide part of the layout is cut to ``--cluster-roles``
ClusterRoles with wildcard annotations and their bindings (the scale layout's one per 500
objects would copy hundreds of cluster-wide bindings into every namespace's parameters:
``python -m bench compile`` measures that), and the churn edits no ClusterRole (a ClusterRole
bound cluster-wide renders every namespace again: also measured there).

    python -m bench freshness --objects 100000 --rate 50 --seconds 60 [--json FILE]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.compiled.registration import CONDITION
from bench.core.kube import Client, Webhook, count, documents, dormant, stamp, start_compiler
from bench.core.layout import ANNOTATION, cluster_objects, layout, namespace_objects
from bench.core.processes import peak_rss_mb, process_cpu
from bench.core.stats import percentile
from tests.kube.controlplane import ADMIN, COMPILER_USER, WEBHOOK_USER, ControlPlane, User
from tests.process import stop
from tests.support import make_review

RBAC = "rbac.authorization.k8s.io"
PARAMS = "/apis/labelrbac.io/v1alpha1/labelrbacparams"
PROBE_EVERY = 0.02
TIMEOUT = 60.0


def objects_of(objects: int, cluster_roles: int) -> Iterator[tuple[str, dict[str, Any]]]:
    """(collection path, object) of the layout, namespaces first, bindings last."""
    namespaces, _ = layout(objects)
    cluster = cluster_objects(cluster_roles)
    docs = [namespace_objects(i, cluster_roles) for i in range(namespaces)]
    for obj in (d[0] for d in docs):
        yield "/api/v1/namespaces", obj
    for obj in cluster:
        yield f"/apis/{RBAC}/v1/{obj['kind'].lower()}s", obj
    for kind in ("Role", "RoleBinding"):
        for group in docs:
            for obj in group:
                if obj["kind"] == kind:
                    ns = obj["metadata"]["namespace"]
                    yield f"/apis/{RBAC}/v1/namespaces/{ns}/{kind.lower()}s", obj


def load(admin: Client, objects: int, cluster_roles: int, clients: int) -> tuple[int, float]:
    """Create the layout's objects with ``clients`` parallel connections: (count, seconds)."""
    started = time.monotonic()
    items = list(objects_of(objects, cluster_roles))
    kinds = ["Namespace", "cluster", "Role", "RoleBinding"]

    def create(item: tuple[str, dict[str, Any]]) -> None:
        status, answer = admin.send("POST", *item)
        if status >= 300 and status != 409:
            raise RuntimeError(f"POST {item[0]}: {status} {answer}")

    def phase(item: tuple[str, dict[str, Any]]) -> str:
        kind = item[1]["kind"]
        return "cluster" if kind.startswith("Cluster") else kind

    with ThreadPoolExecutor(clients) as pool:
        for kind in kinds:  # each kind after the kinds it refers to
            list(pool.map(create, (item for item in items if phase(item) == kind)))
    return len(items), time.monotonic() - started


@dataclass
class Measured:
    kind: str  # bound | narrowed
    setup: str  # compiled | webhook
    seconds: float
    namespace: str
    sent_at: float  # wall clock, as the API server's audit log has it


class Freshness:
    """The churn, the measured changes and their probes, against one control plane."""

    def __init__(self, cp: ControlPlane, webhook: Webhook, objects: int, reserved: int) -> None:
        self.cp = cp
        self.admin = Client(cp.url, cp.ca, cp.users[ADMIN].token)
        self.webhook = Client(webhook.server.base_url, webhook.tls.ca)
        self.namespaces, _ = layout(objects)
        self.reserved = reserved  # tenant-0 .. tenant-<reserved-1>: measured changes only
        self.results: list[Measured] = []
        self.failures: list[str] = []
        self.lock = threading.Lock()

    # -- churn ---------------------------------------------------------------------------------

    def churn_step(self, k: int, added: list[tuple[str, str]]) -> None:
        spread = self.namespaces - self.reserved
        i = self.reserved + (k * 7919) % spread
        ns = f"tenant-{i}"
        kind = k % 10
        base = f"/apis/{RBAC}/v1/namespaces/{ns}"
        merge = {"Content-Type": "application/merge-patch+json"}
        if kind < 3:
            annotation = json.dumps({"configmaps": {"team": [f"t{i}-*", f"c{k}"]},
                                     "pods": {"team": [f"t{i}-*"]}})  # fmt: skip
            body: Any = {"metadata": {"annotations": {ANNOTATION: annotation}}}
            self.admin.send("PATCH", f"{base}/roles/team-own", body, merge)
        elif kind < 6 or kind == 9:
            subjects = [{"apiGroup": RBAC, "kind": "User", "name": f"user-{i}-{u}"}
                        for u in range(3)] + [{"apiGroup": RBAC, "kind": "User",
                                               "name": f"churn-{k}"}]  # fmt: skip
            self.admin.send("PATCH", f"{base}/rolebindings/team-shared",
                            {"subjects": subjects}, merge)  # fmt: skip
        elif kind < 8:
            binding = {"apiVersion": f"{RBAC}/v1", "kind": "RoleBinding",
                       "metadata": {"name": f"churn-{k}", "namespace": ns},
                       "roleRef": {"apiGroup": RBAC, "kind": "Role", "name": "team-shared"},
                       "subjects": [{"apiGroup": RBAC, "kind": "User",
                                     "name": f"new-{k}"}]}  # fmt: skip
            self.admin.send("POST", f"{base}/rolebindings", binding)
            with self.lock:
                added.append((ns, f"churn-{k}"))
        else:
            with self.lock:
                found = added.pop(0) if len(added) > 2 else None
            if found is not None:
                self.admin.send("DELETE", f"/apis/{RBAC}/v1/namespaces/{found[0]}/rolebindings/"
                                f"{found[1]}")  # fmt: skip

    def churn(self, rate: float, seconds: float) -> int:
        """Changes at ``rate`` per second for ``seconds`` (four clients); the changes made."""
        added: list[tuple[str, str]] = []
        count = int(rate * seconds)
        started = time.monotonic()

        def at(k: int) -> None:
            delay = started + k / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            self.churn_step(k, added)

        with ThreadPoolExecutor(4) as pool:
            list(pool.map(at, range(count)))
        return count

    # -- measured changes ----------------------------------------------------------------------

    def vap_denies(self, user: str, ns: str, team: str) -> str:
        """The API server's answer to ``user``'s dry-run create labeled ``team``: its message,
        "" when allowed."""
        body = {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"generateName": "f-", "labels": {"team": team}}}  # fmt: skip
        status, answer = self.admin.send(
            "POST", f"/api/v1/namespaces/{ns}/configmaps?dryRun=All", body,
            {"Impersonate-User": user},
        )  # fmt: skip
        return "" if status < 300 else str((answer or {}).get("message", status))

    def webhook_denies(self, user: str, ns: str, team: str) -> str:
        review = make_review(user, "CREATE", "configmaps", namespace=ns, labels={"team": team})
        status, answer = self.webhook.send("POST", "/validate", review)
        response = (answer or {}).get("response", {})
        if status != 200 or response.get("allowed", False):
            return ""
        return str(response.get("status", {}).get("message", "denied"))

    def probe(
        self, kind: str, setup: str, sent: tuple[float, float], ns: str, check: Callable[[], bool]
    ) -> None:
        while time.monotonic() - sent[0] < TIMEOUT:
            if check():
                seconds = time.monotonic() - sent[0]
                with self.lock:
                    self.results.append(Measured(kind, setup, seconds, ns, sent[1]))
                return
            # Past the goal of a second, a quarter of a second is precision enough (and spares
            # the server the probes of every change still waiting).
            time.sleep(PROBE_EVERY if time.monotonic() - sent[0] < 1 else 0.25)
        with self.lock:
            self.failures.append(f"{kind} {setup}: not enforced within {TIMEOUT:.0f} s")

    def bound(self, n: int) -> list[threading.Thread]:
        """A new user bound to tenant-<j>'s restricted Role: until judged by its labels."""
        j = n % self.reserved
        ns, user = f"tenant-{j}", f"fresh-{n}"
        binding = {"apiVersion": f"{RBAC}/v1", "kind": "RoleBinding",
                   "metadata": {"name": f"fresh-{n}", "namespace": ns},
                   "roleRef": {"apiGroup": RBAC, "kind": "Role", "name": "team-own"},
                   "subjects": [{"apiGroup": RBAC, "kind": "User", "name": user}]}  # fmt: skip
        denial = "is not permitted ("
        sent = (time.monotonic(), time.time())
        status, answer = self.admin.send(
            "POST", f"/apis/{RBAC}/v1/namespaces/{ns}/rolebindings", binding
        )
        if status >= 300:
            raise RuntimeError(f"binding {user}: {status} {answer}")
        checks = {
            "compiled": lambda: denial in self.vap_denies(user, ns, "nobody"),
            "webhook": lambda: denial in self.webhook_denies(user, ns, "nobody"),
        }
        return self.start_probes("bound", sent, ns, checks)

    def narrowed(self, n: int) -> list[threading.Thread]:
        """tenant-<j>'s Role ``team-own`` loses a value its user used: until denied."""
        j = n % self.reserved
        ns, user, team = f"tenant-{j}", f"user-{j}-3", f"t{j}-n{n}"
        path = f"/apis/{RBAC}/v1/namespaces/{ns}/roles/team-own"
        merge = {"Content-Type": "application/merge-patch+json"}

        def annotate(values: list[str]) -> None:
            annotation = json.dumps({"configmaps": {"team": values}})
            body = {"metadata": {"annotations": {ANNOTATION: annotation}}}
            status, answer = self.admin.send("PATCH", path, body, merge)
            if status >= 300:
                raise RuntimeError(f"PATCH {path}: {status} {answer}")

        annotate([f"t{j}-*"])  # allows ``team``: wait until both say so
        deadline = time.monotonic() + TIMEOUT
        while self.vap_denies(user, ns, team) or self.webhook_denies(user, ns, team):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{user} is not allowed {team} in {ns}")
            time.sleep(PROBE_EVERY)
        sent = (time.monotonic(), time.time())
        annotate([f"t{j}-x"])
        checks = {
            "compiled": lambda: bool(self.vap_denies(user, ns, team)),
            "webhook": lambda: bool(self.webhook_denies(user, ns, team)),
        }
        return self.start_probes("narrowed", sent, ns, checks)

    def start_probes(
        self, kind: str, sent: tuple[float, float], ns: str, checks: dict[str, Callable[[], bool]]
    ) -> list[threading.Thread]:
        threads = [threading.Thread(target=self.probe, args=(kind, setup, sent, ns, check))
                   for setup, check in checks.items()]  # fmt: skip
        for thread in threads:
            thread.start()
        return threads

    def measure(self, every: float, seconds: float) -> None:
        """Measured changes every ``every`` seconds for ``seconds``, alternating kinds."""
        threads: list[threading.Thread] = []
        started = time.monotonic()
        for n in itertools.count():
            if time.monotonic() - started > seconds:
                break
            threads += self.bound(n) if n % 2 == 0 else self.narrowed(n)
            time.sleep(max(0.0, started + (n + 1) * every - time.monotonic()))
        for thread in threads:
            thread.join()


def figures(results: list[Measured], kind: str, setup: str) -> dict[str, Any]:
    values = sorted(r.seconds for r in results if r.kind == kind and r.setup == setup)
    if not values:
        return {"kind": kind, "setup": setup, "count": 0}
    return {
        "kind": kind, "setup": setup, "count": len(values),
        "p50_ms": round(1000 * statistics.median(values), 1),
        "p99_ms": round(1000 * percentile(values, 0.99), 1),
        "max_ms": round(1000 * values[-1], 1),
    }  # fmt: skip


def hops(results: list[Measured], events: list[dict[str, Any]]) -> dict[str, Any]:
    """Where a compiled change's time goes, from the API server's audit log: from the change
    to the compiler's write of the namespace's parameters (its watch, its queue, the render),
    the write itself (server-side apply), and from the write to enforcement (the API server's
    informer of the parameters, and the probe's 20 ms)."""
    writes: dict[str, list[tuple[float, float]]] = {}
    for event in events:
        ref = event.get("objectRef", {})
        if (
            event.get("stage") == "ResponseComplete"
            and event.get("verb") == "patch"
            and ref.get("resource") == "labelrbacparams"
            and not ref.get("subresource")
        ):
            received = stamp(event["requestReceivedTimestamp"])
            writes.setdefault(ref.get("namespace", ""), []).append(
                (received, stamp(event["stageTimestamp"]))
            )
    pieces: dict[str, list[float]] = {"to_write": [], "write": [], "after_write": []}
    for r in results:
        if r.setup != "compiled":
            continue
        later = [w for w in sorted(writes.get(r.namespace, ())) if w[0] >= r.sent_at]
        if not later:
            continue
        received, done = later[0]
        pieces["to_write"].append(received - r.sent_at)
        pieces["write"].append(done - received)
        pieces["after_write"].append(r.seconds - (done - r.sent_at))
    return {
        name: {"p50_ms": round(1000 * statistics.median(values), 1),
               "p99_ms": round(1000 * percentile(values, 0.99), 1)}
        for name, values in pieces.items() if values
    }  # fmt: skip


def wait_compiled(admin: Client, timeout: float) -> float:
    """Seconds until every namespace has parameters."""
    started = time.monotonic()
    while count(admin, PARAMS) < count(admin, "/api/v1/namespaces"):
        if time.monotonic() - started > timeout:
            raise RuntimeError("the parameters of every namespace were not written in time")
        time.sleep(0.5)
    return time.monotonic() - started


def wait_covered(admin: Client, name: str, timeout: float) -> float:
    """Seconds until the compiler has written its coverage condition into the registration."""
    started = time.monotonic()
    path = f"/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/{name}"
    while True:
        _, config = admin.send("GET", path)
        hooks = config.get("webhooks") or ()
        if any(c.get("name") == CONDITION for w in hooks for c in w.get("matchConditions") or ()):
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise RuntimeError("the compiler did not write its coverage condition in time")
        time.sleep(0.5)


def wait_enforcing(fresh: Freshness, timeout: float) -> float:
    """Seconds until the policy, just created, judges a write by its parameters: its informer
    of them has listed every namespace's (before, it refuses as not yet synced)."""
    started = time.monotonic()
    while "is not permitted (" not in fresh.vap_denies("user-0-3", "tenant-0", "nobody"):
        if time.monotonic() - started > timeout:
            raise RuntimeError("the policy did not judge by its parameters in time")
        time.sleep(0.2)
    return time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=100_000)
    parser.add_argument("--cluster-roles", type=int, default=2)
    parser.add_argument("--rate", type=float, default=50, help="RBAC changes per second")
    parser.add_argument("--seconds", type=float, default=60, help="of churn")
    parser.add_argument("--every", type=float, default=0.5, help="seconds between measured")
    parser.add_argument("--clients", type=int, default=8, help="parallel clients loading")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--keep", action="store_true", help="keep the logs (printed: where)")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="bench-freshness-"))
    users = (User(ADMIN, ("system:masters",)), COMPILER_USER, WEBHOOK_USER)
    cp = ControlPlane(workdir, users=users)
    cp.start(timeout=180)
    webhook: Webhook | None = None
    compiler: subprocess.Popen[bytes] | None = None
    out: dict[str, Any] = {"load_average_before": round(os.getloadavg()[0], 2)}
    try:
        admin = Client(cp.url, cp.ca, cp.users[ADMIN].token)
        admin.send("POST", "/api/v1/namespaces", {"metadata": {"name": "label-rbac"}})
        cp.apply(ADMIN, documents("crd.yaml"))
        time.sleep(3)
        cp.apply(ADMIN, documents("rbac.yaml"))
        count, seconds = load(admin, args.objects, args.cluster_roles, args.clients)
        out.update(objects=count, load_s=round(seconds, 1))
        print(f"loaded {count} RBAC objects in {seconds:.1f} s ({args.clients} clients)",
              flush=True)  # fmt: skip
        namespaces, _ = layout(args.objects)
        started = time.monotonic()
        # (the webhook's manifests first: the policy would refuse them)
        webhook = Webhook(cp, workdir, full_compiler=True)
        cp.apply(ADMIN, [dormant(webhook.config)])
        compiler = start_compiler(cp, workdir)
        out["webhook_ready_s"] = round(time.monotonic() - started, 1)
        wait_compiled(admin, 3600)
        out["compiled_s"] = round(time.monotonic() - started, 1)
        wait_covered(admin, webhook.config["metadata"]["name"], 300)
        cp.apply(ADMIN, documents("policy.yaml"))
        # Even: bound users (even changes) and narrowed roles (odd ones) never share a namespace.
        reserved = max(2, 2 * (min(50, namespaces // 4) // 2))
        fresh = Freshness(cp, webhook, args.objects, reserved)
        out["enforcing_s"] = round(wait_enforcing(fresh, 600), 1)
        print(
            f"webhook ready after {out['webhook_ready_s']} s; parameters of every "
            f"namespace after {out['compiled_s']} s (both from the webhook's start); the "
            f"policy enforcing {out['enforcing_s']} s after it was created",
            flush=True,
        )
        assert cp.apiserver is not None
        cpu = {"apiserver": process_cpu(cp.apiserver.pid), "compiler": process_cpu(compiler.pid)}

        def churn_all() -> None:
            out["changes"] = fresh.churn(args.rate, args.seconds)

        churn = threading.Thread(target=churn_all)
        churn_started = time.monotonic()
        churn.start()
        fresh.measure(args.every, args.seconds)
        churn.join()
        churn_s = time.monotonic() - churn_started
        out["load_average_after"] = round(os.getloadavg()[0], 2)
        out["churn_rate"] = round(out["changes"] / churn_s, 1)
        out["apiserver_cpu_share"] = round(
            (process_cpu(cp.apiserver.pid) - cpu["apiserver"]) / churn_s, 2)  # fmt: skip
        out["compiler_cpu_share"] = round(
            (process_cpu(compiler.pid) - cpu["compiler"]) / churn_s, 2)  # fmt: skip
        out["compiler_peak_mb"] = round(peak_rss_mb(compiler.pid))
        out["failures"] = fresh.failures
        out["rows"] = [
            figures(fresh.results, kind, setup)
            for kind in ("bound", "narrowed")
            for setup in ("compiled", "webhook")
        ]
        print(f"{out['changes']} changes in {churn_s:.1f} s ({out['churn_rate']}/s); load "
              f"average {out['load_average_before']} before, {out['load_average_after']} after; "
              f"CPU share during churn: API server {out['apiserver_cpu_share']}, compiler "
              f"{out['compiler_cpu_share']}; the compiler's peak memory "
              f"{out['compiler_peak_mb']} MB", flush=True)  # fmt: skip
        for row in out["rows"]:
            if row["count"]:
                print(f"{row['kind']:<9} {row['setup']:<9} n={row['count']:<4} "
                      f"p50 {row['p50_ms']:7.1f} ms  p99 {row['p99_ms']:7.1f} ms  "
                      f"max {row['max_ms']:7.1f} ms", flush=True)  # fmt: skip
        out["compiled_hops"] = hops(fresh.results, cp.audit_events())
        for name, hop in out["compiled_hops"].items():
            print(f"compiled, {name.replace('_', ' ')}: p50 {hop['p50_ms']} ms, "
                  f"p99 {hop['p99_ms']} ms", flush=True)  # fmt: skip
        for failure in fresh.failures:
            print(f"FAILED: {failure}", flush=True)
    finally:
        if compiler is not None:
            stop(compiler)
        if webhook is not None:
            webhook.stop()
        cp.stop()
        if args.keep:
            print(f"logs kept in {workdir}", flush=True)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 1 if out.get("failures") else 0


if __name__ == "__main__":
    sys.exit(main())
