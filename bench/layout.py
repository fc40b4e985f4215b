"""Layout benchmark: the compiled path at N namespaces with K cluster-wide grants, stored once.

Through a real kube-apiserver v1.36 and etcd (tests/kube/controlplane.py), the cluster is built
by ``--clients`` parallel clients: per namespace ``tenant-<i>`` two annotated Roles, one plain
Role and three RoleBindings (the scale layout's, ``bench.core.layout``, without its
ClusterRole binding), and K restricted ClusterRoles of seven resources each bound cluster-wide,
each to a user of its own (``bench.core.layout.cluster_grant``). The compiled component is
installed as shipped (CRD, the compiler's ServiceAccount and RBAC, the policies; the webhook's
registration held dormant, there for the compiler's coverage conditions) and the compiler
(``python -m app compile``) runs as its ServiceAccount. Reported, in one run:

- **build**: the objects created and how long it took;
- **all written**: seconds from the compiler's start until every namespace has parameters
  and (this layout) the compiler has written the policy; then until the policy enforces a
  cluster-wide grant, as a probe write sees it;
- **bytes stored**: the ``LabelRbacParams`` specs and the label-rule policies' specs (compact
  JSON), in all and per namespace, against the information they carry: N namespaces' own part
  and the cluster part once, rendered by the engine (``app.engine.params``) for one namespace
  of the layout and the K grants;
- **API server RSS** (/proc) with the cluster built and no compiled path, after the first
  compile, and at the end, minutes later, then ``--settle`` seconds after that (as the one with
  no compiled path is read: a garbage collection forced, then ``--settle`` seconds for Go's
  scavenger to return what a burst of writes left); and its live heap (its /metrics right
  after a garbage collection the benchmark forces, without the garbage and free pages its RSS
  still holds);
- **all marked**: seconds from the compiler's start until every namespace is marked compiled
  (the first full compile: every namespace's plain writes judged by the policy);
- **first compile CPU**: CPU milliseconds per namespace the API server, etcd and the compiler
  spent from the compiler's start until every namespace was marked (/proc);
- **compiler peak RSS** (VmHWM) of the first compile, of a replica taking the lease over with
  everything stored (a new identity: a restart elsewhere), and for the baseline the upgrade:
  this release's compiler taking the lease over from the previous release's, the previous
  layout stored;
- **edits**: ``--edits`` ClusterRole annotation edits and as many ClusterRoleBinding subject
  edits, alternating: the ``LabelRbacParams`` whose resourceVersion changed (listed metadata
  only before and after), the compiler's writes of policies (the API server's audit log), and
  seconds from the edit to its enforcement, as the affected cluster-bound user's dry-run
  creates see it through the API server (polled: every 20 ms for the first 5 seconds, then
  every 250 ms): the value the edit grants is allowed and the one it took away (or a value never
  granted) is refused by the label rule. Once enforced, the compiler's writes are waited out
  (``--quiet`` seconds without one); ``settled_s`` is when its last write came;
- **namespaced**: ``--edits`` RoleBindings added, each binding a new user to a namespace's
  annotated Role: seconds until that user's writes are judged by the Role's labels;
- **a CRD created** that no annotation restricts, a user granted its writes by a plain
  ClusterRole bound cluster-wide: seconds until that user's dry-run create in a compiled
  namespace is admitted, and the parameters and policies the compiler wrote for it;
- (this layout) **a Role restricting** that CRD's resource in one tenant namespace, which every
  namespace then indexes: seconds until that namespace indexes it and until the policy judges it
  everywhere, the parameters rewritten, and how many of that user's dry-run creates in the
  namespace written last were refused meanwhile (none should be: no role restricts it there);
- with ``--profiles DIR``, the API server's heap profiles with no compiled path and after the
  first compile (``go tool pprof -sample_index=inuse_space -top -diff_base A B``), and its CPU
  profiles over the first ``--profile-seconds`` of the first compile and of the cluster edits
  (``go tool pprof -top``; profiling costs the API server a few percent meanwhile: compare
  runs made alike).

Beside them, the same figures for the previous layout (every namespace's parameters holding a
copy of the cluster part) at ``--baseline-namespaces``, with the previous release's compiler and
manifests checked out of git at ``--baseline-ref`` into a temporary worktree (skipped with a
message when the ref is unavailable), with ``--baseline-edits`` edits of each cluster kind (each
rewrites every namespace there). Every figure is printed as a table and written as JSON
(``--json``, after each layout).

    python -m bench layout --namespaces 10000 --cluster-grants 200 --baseline-namespaces 1000 \\
        --edits 20 --json bench-layout.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from app.compiled.admission_policy import unjudged_of
from app.compiled.compiler import POLICY_LOADED
from app.engine.kinds import snapshot_from_objects
from app.engine.params import API_VERSION, NAME, PLURAL, render, render_cluster, spec_text
from app.settings import Settings
from app.source.api import METADATA_LIST
from bench.core.compiled import target
from bench.core.kube import (
    Client,
    Webhook,
    compiler_idle,
    compiler_metrics,
    count,
    documents,
    dormant,
    profiling,
    stamp,
    start_compiler,
)
from bench.core.layout import ANNOTATION, CLUSTER_RESOURCES, cluster_grant
from bench.core.processes import ROOT, peak_rss_mb, process_cpu, rss_bytes
from bench.core.stats import percentile
from bench.core.tenants import RBAC, TENANT, build, namespace_docs
from tests.kube.controlplane import ADMIN, COMPILER_USER, WEBHOOK_USER, ControlPlane, User
from tests.process import free_port, stop

PARAMS = f"/apis/{API_VERSION}/{PLURAL}"
POLICIES = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
# The policies holding the label rule (the warn and audit ones only with manifests/compiled/modes).
RULE_POLICIES = ("label-rbac", "label-rbac-warn", "label-rbac-audit")
FIELD_MANAGER = "label-rbac-compiler"
# The label rule's denial, as the policy words it (not RBAC's, nor "not listed yet").
DENIAL = "is not permitted ("
PAGE = 500  # items per page of the bench's own lists
WAIT = 3600.0  # at most this long for a compile, an enforcement or a rewrite
CHUNK = 8 << 20  # bytes of the audit log read at once


# -- what is stored -------------------------------------------------------------------------------


def pages(admin: Client, path: str, size: int, metadata_only: bool = False) -> Iterator[Any]:
    """The items of the collection at ``path``, a page at a time (never all held at once)."""
    token = ""
    headers = {"Accept": METADATA_LIST} if metadata_only else {}
    while True:
        query = f"?limit={size}" + (f"&continue={quote(token)}" if token else "")
        status, page = admin.send("GET", path + query, headers=headers)
        if status != 200:
            raise RuntimeError(f"GET {path}: {status} {page}")
        yield from page.get("items") or ()
        token = (page.get("metadata") or {}).get("continue") or ""
        if not token:
            return


def versions(admin: Client) -> dict[str, str]:
    """Each namespace's parameters' resourceVersion (metadata only)."""
    return {item["metadata"]["namespace"]: item["metadata"]["resourceVersion"]
            for item in pages(admin, PARAMS, PAGE, metadata_only=True)}  # fmt: skip


def stored(admin: Client) -> dict[str, Any]:
    """Bytes of the parameters' specs and of the label-rule policies' specs (compact JSON)."""
    sizes = [len(spec_text(item.get("spec") or {}).encode()) for item in pages(admin, PARAMS, 50)]
    policies = {}
    for name in RULE_POLICIES:
        status, policy = admin.send("GET", f"{POLICIES}/{name}")
        if status == 200:
            policies[name] = len(spec_text(policy.get("spec") or {}).encode())
    total = sum(sizes) + sum(policies.values())
    return {
        "params_objects": len(sizes), "params_bytes": sum(sizes),
        "params_max_bytes": max(sizes, default=0), "policy_bytes": policies,
        "stored_bytes": total, "per_namespace_bytes": round(total / max(1, len(sizes))),
    }  # fmt: skip


def information(namespaces: int, grants: int) -> dict[str, int]:
    """What the stored objects carry: each namespace's own part (tenant-0's, rendered by the
    engine; every tenant's is alike) and the cluster part once (its JSON)."""
    objects = [(o["kind"], o) for o in namespace_docs(0)]
    objects += [(o["kind"], o) for i in range(grants) for o in cluster_grant(i)]
    snapshot = snapshot_from_objects(objects, Settings().compiler)
    goal = target()
    own = render(snapshot, "tenant-0", goal).size
    cluster = len(spec_text(render_cluster(snapshot, goal).spec).encode())
    return {"own_bytes": own, "cluster_bytes": cluster,
            "information_bytes": namespaces * own + cluster}  # fmt: skip


def apiserver_mb(cp: ControlPlane) -> float:
    assert cp.apiserver is not None
    return round(rss_bytes(cp.apiserver.pid) / 1e6, 1)


def settled_rss_mb(cp: ControlPlane, settle: float) -> float:
    """The API server's RSS ``settle`` seconds after a garbage collection: Go's scavenger
    returns the free pages above twice the live heap (``GOGC=100``) in the background, so RSS
    read at once still holds those a burst of writes left."""
    time.sleep(settle)
    return apiserver_mb(cp)


def apiserver_heap_mb(cp: ControlPlane, profile: Path | None = None) -> float:
    """The API server's live heap as its /metrics tells it, right after a garbage collection
    forced through its heap profile (which is written to ``profile`` when given: ``go tool
    pprof -sample_index=inuse_space -top -diff_base A B`` reads two); its RSS also holds memory
    not returned to the system yet. -1 if absent."""
    token = cp.users[ADMIN].token
    subprocess.run(
        ["curl", "-sf", "--cacert", str(cp.ca), "-H", f"Authorization: Bearer {token}",
         "-o", str(profile or os.devnull), f"{cp.url}/debug/pprof/heap?gc=1"],
        check=True, timeout=120,
    )  # fmt: skip
    status, text = cp.request(ADMIN, "GET", "/metrics", timeout=60)
    lines = text.splitlines() if status == 200 and isinstance(text, str) else []
    for name in ("go_gc_heap_live_bytes", "go_memstats_heap_alloc_bytes"):
        for line in lines:
            if line.startswith(f"{name} "):
                return round(float(line.split()[1]) / 1e6, 1)
    return -1.0


# -- the compiler -----------------------------------------------------------------------------


@dataclass
class Compiler:
    """A running ``label-rbac compile``, its metrics served on loopback."""

    process: subprocess.Popen[bytes]
    port: int
    writes: CompilerWrites  # its requests, from the API server's audit log
    started: float = field(default_factory=time.monotonic)

    @classmethod
    def start(cls, cp: ControlPlane, workdir: Path, root: Path, identity: str) -> Compiler:
        port, writes = free_port(), CompilerWrites(cp.audit_log)
        process = start_compiler(cp, workdir, "--probe-bind", f"127.0.0.1:{port}",
                                 identity=identity, root=root)  # fmt: skip
        return cls(process, port, writes)

    def metrics(self) -> dict[str, float]:
        return compiler_metrics(self.port)

    def settled(self, quiet: float, timeout: float = WAIT) -> float:
        """Seconds from the start until it leads, has nothing pending, writes nothing, waits
        for no request of its own and spends (almost) no CPU for ``quiet`` seconds: its render
        of every namespace is done (a slow write of the policy leaves it idle meanwhile)."""

        def no_request() -> bool:
            return not self.writes.read() and not self.writes.open

        return compiler_idle(self.process, self.port, quiet, timeout, self.started, no_request)

    def peak_mb(self) -> float:
        return round(peak_rss_mb(self.process.pid), 1)

    def stop(self) -> None:
        stop(self.process)


def wait_written(admin: Client, started: float, policy: bool) -> float:
    """Seconds from ``started`` until every namespace has parameters and, with ``policy``, the
    compiler has written the label-rbac policy."""
    while True:
        done = count(admin, PARAMS) >= count(admin, "/api/v1/namespaces")
        if done and policy:
            status, found = admin.send("GET", f"{POLICIES}/label-rbac")
            managers = {m.get("manager") for m in (found or {}).get("metadata", {})
                        .get("managedFields") or ()} if status == 200 else set()  # fmt: skip
            done = FIELD_MANAGER in managers
        if done:
            return time.monotonic() - started
        if time.monotonic() - started > WAIT:
            raise RuntimeError("the parameters (and the policy) were not written in time")
        time.sleep(0.5)


def wait_marked(compiler: Compiler, namespaces: int, quiet: float = 30.0) -> float:
    """Seconds from the compiler's start until it has marked every namespace compiled (its
    merge patches of Namespaces, from the audit log: no list loads the API server meanwhile),
    or until its last mark when no more came for ``quiet`` seconds: the first full compile is
    done, every namespace's plain writes judged by the policy."""
    writes, calm = compiler.writes, time.monotonic()
    while len(writes.marked) < namespaces and time.monotonic() - calm < quiet:
        before = len(writes.marked)
        writes.read()
        if len(writes.marked) > before:
            calm = time.monotonic()
        if time.monotonic() - compiler.started > WAIT:
            raise RuntimeError("the namespaces were not marked in time")
        time.sleep(0.25)
    return writes.marked_at - compiler.started


class CompilerWrites:
    """The compiler's writes of parameters and policies from now on, read from the API server's
    audit log as it grows (never the whole log)."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.offset = log.stat().st_size if log.exists() else 0
        self.params = 0
        self.policies = 0
        self.last = 0.0  # when the last one was received (wall clock, from the log)
        self.open: set[str] = set()  # its requests received and not answered yet (audit IDs)
        self.marked: set[str] = set()  # the Namespaces it patched (marked, in a first compile)
        self.marked_at = 0.0  # when the last one was answered (monotonic, as read)

    def read(self) -> int:
        """The writes logged since the last read (counted in ``params`` and ``policies``)."""
        found = 0
        if self.log.stat().st_size < self.offset:
            # The API server rotated its log (at 100 MB): the rest of the old one, then the new.
            rotated = max(self.log.parent.glob("audit-*.log"), key=lambda p: p.stat().st_mtime)
            found, self.offset = self._read(rotated), 0
        return found + self._read(self.log)

    def _read(self, log: Path) -> int:
        found = 0
        with log.open("rb") as handle:
            while True:  # a chunk at a time: the log grows by 100 MB over a large compile
                handle.seek(self.offset)
                data = handle.read(CHUNK)
                whole = data[: data.rfind(b"\n") + 1]
                if not whole:
                    return found
                self.offset += len(whole)
                found += sum(map(self._event, whole.splitlines()))

    def _event(self, line: bytes) -> int:
        """Count one audit event: 1 for a write of the compiler's, else 0."""
        event = json.loads(line)
        if (event.get("user") or {}).get("username") != COMPILER_USER.name:
            return 0
        if event.get("verb") != "watch":
            if event.get("stage") == "RequestReceived":
                self.open.add(event.get("auditID", ""))
            else:
                self.open.discard(event.get("auditID", ""))
        ref = event.get("objectRef") or {}
        if (
            event.get("stage") == "ResponseComplete"
            and event.get("verb") == "patch"
            and ref.get("resource") == "namespaces"
            and (event.get("responseStatus") or {}).get("code", 500) < 300
            and ref.get("name") not in self.marked
        ):
            self.marked.add(ref["name"])
            self.marked_at = time.monotonic()
        if (
            event.get("stage") == "ResponseComplete"
            and event.get("verb") in ("create", "update", "patch")
            and not ref.get("subresource")
            and (event.get("responseStatus") or {}).get("code", 500) < 300
            and ref.get("resource") in (PLURAL, "validatingadmissionpolicies")
        ):
            self.params += ref["resource"] == PLURAL
            self.policies += ref["resource"] != PLURAL
            self.last = max(self.last, stamp(event["requestReceivedTimestamp"]))
            return 1
        return 0

    def settle(self, since: float, quiet: float) -> float:
        """Wait until no write came for ``quiet`` seconds; seconds from ``since`` (wall clock)
        to the last one's arrival (0 for none)."""
        calm = time.monotonic()
        while time.monotonic() - calm < quiet:
            if self.read():
                calm = time.monotonic()
            if time.time() - since > WAIT:
                raise RuntimeError("the compiler's writes did not stop in time")
            time.sleep(0.25)
        return max(0.0, self.last - since)


# -- probes and edits ---------------------------------------------------------------------------


def answer(admin: Client, user: str, namespace: str, labels: dict[str, str]) -> tuple[bool, str]:
    """The API server's answer to ``user``'s dry-run ConfigMap create labeled ``labels``:
    (allowed, the refusal's message)."""
    body = {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"generateName": "l-", "labels": labels}}  # fmt: skip
    status, found = admin.send("POST", f"/api/v1/namespaces/{namespace}/configmaps?dryRun=All",
                               body, {"Impersonate-User": user})  # fmt: skip
    return status < 300, "" if status < 300 else str((found or {}).get("message", status))


@dataclass(frozen=True)
class Probe:
    """``user``'s writes in ``namespace``: enforced once ``allowed`` passes and ``refused`` is
    refused by the label rule."""

    user: str
    namespace: str
    allowed: dict[str, str]
    refused: dict[str, str]

    def enforced(self, admin: Client) -> bool:
        if not answer(admin, self.user, self.namespace, self.allowed)[0]:
            return False
        passed, message = answer(admin, self.user, self.namespace, self.refused)
        return not passed and DENIAL in message

    def wait(self, admin: Client, since: float) -> float:
        """Seconds from ``since`` until enforced."""
        while not self.enforced(admin):
            waited = time.monotonic() - since
            if waited > WAIT:
                raise RuntimeError(f"not enforced in time: {self}")
            time.sleep(0.02 if waited < 5 else 0.25 if waited < 10 else 1.0)
        return time.monotonic() - since


def grant_labels(index: int, team: str) -> dict[str, str]:
    return {"team": team, "tier": f"t{index}-x"}


def edit_cluster_role(admin: Client, n: int, namespace: str) -> Probe:
    """bench-cluster-0 now grants ``c0-e<n>`` instead of what it granted: its user's writes of
    the new value pass, of the old one are refused."""
    value, old = f"c0-e{n}", f"c0-e{n - 1}" if n else "c0"
    permissions = {r: {"team": [value], "tier": ["t0-*"]} for r in CLUSTER_RESOURCES}
    body = {"metadata": {"annotations": {"labelrbac.io/permissions": json.dumps(permissions)}}}
    send(admin, "PATCH", f"/apis/{RBAC}/v1/clusterroles/bench-cluster-0", body)
    return Probe("cluster-user-0", namespace, grant_labels(0, value), grant_labels(0, old))


def edit_cluster_binding(admin: Client, n: int, namespace: str) -> Probe:
    """bench-cluster-1 bound to ``edit-user-<n>`` (instead of the last edit's user): judged by
    its grant's labels."""
    subjects = [{"apiGroup": RBAC, "kind": "User", "name": name}
                for name in ("cluster-user-1", f"edit-user-{n}")]  # fmt: skip
    send(admin, "PATCH", f"/apis/{RBAC}/v1/clusterrolebindings/bench-cluster-1",
         {"subjects": subjects})  # fmt: skip
    return Probe(f"edit-user-{n}", namespace, grant_labels(1, "c1"), grant_labels(1, "nobody"))


def bind_in_namespace(admin: Client, n: int, namespace: str) -> Probe:
    """A new user bound to the namespace's annotated Role ``team-own``."""
    i = namespace.removeprefix("tenant-")
    binding = {"apiVersion": f"{RBAC}/v1", "kind": "RoleBinding",
               "metadata": {"name": f"fresh-{n}", "namespace": namespace},
               "roleRef": {"apiGroup": RBAC, "kind": "Role", "name": "team-own"},
               "subjects": [{"apiGroup": RBAC, "kind": "User", "name": f"fresh-{n}"}]}  # fmt: skip
    send(admin, "POST", f"/apis/{RBAC}/v1/namespaces/{namespace}/rolebindings", binding)
    return Probe(f"fresh-{n}", namespace, {"team": f"t{i}-x"}, {"team": "nobody"})


def send(admin: Client, method: str, path: str, body: Any) -> None:
    headers = {"Content-Type": "application/merge-patch+json"} if method == "PATCH" else {}
    status, found = admin.send(method, path, body, headers)
    if status >= 300:
        raise RuntimeError(f"{method} {path}: {status} {found}")


EDITS: dict[str, Callable[[Client, int, str], Probe]] = {
    "clusterrole": edit_cluster_role,
    "clusterrolebinding": edit_cluster_binding,
}


def cluster_edits(cp: ControlPlane, admin: Client, edits: int, namespace: str,
                  quiet: float) -> dict[str, list[dict[str, float]]]:  # fmt: skip
    """``edits`` edits of each cluster kind, alternating: to enforcement, then the compiler's
    writes waited out and counted."""
    found: dict[str, list[dict[str, float]]] = {kind: [] for kind in EDITS}
    before = versions(admin)
    for n in range(edits):
        for kind, edit in EDITS.items():
            writes = CompilerWrites(cp.audit_log)
            sent, wall = time.monotonic(), time.time()
            seconds = edit(admin, n, namespace).wait(admin, sent)
            settled = writes.settle(wall, quiet)
            after = versions(admin)
            rewritten = sum(1 for ns, rv in after.items() if before.get(ns) != rv)
            found[kind].append({"seconds": round(seconds, 3), "params_rewritten": rewritten,
                                "params_writes": writes.params,
                                "policy_writes": writes.policies,
                                "settled_s": round(settled, 3)})  # fmt: skip
            print(f"  {kind} edit {n}: enforced in {seconds:.3f} s; {rewritten} parameters "
                  f"rewritten, {writes.policies} policy writes, the last {settled:.1f} s after "
                  f"the edit", flush=True)  # fmt: skip
            before = after
    return found


CRD_GROUP = "bench.example.com"
CRD_USER = "crd-user"
# The CRD's create, granted to its user (and restricted by ``role_restricts``), and one object of
# it, created by dry run in a namespace (``bolt_path``).
BOLT_RULES = [{"apiGroups": [CRD_GROUP], "resources": ["bolts"], "verbs": ["create"]}]
BOLT = {"apiVersion": f"{CRD_GROUP}/v1", "kind": "Bolt", "metadata": {"generateName": "b-"}}


def bolt_path(namespace: str) -> str:
    return f"/apis/{CRD_GROUP}/v1/namespaces/{namespace}/bolts?dryRun=All"


def crd_created(cp: ControlPlane, admin: Client, namespace: str, quiet: float) -> dict[str, Any]:
    """A CRD no annotation restricts created (``bolts``), with a user granted its writes by a
    plain ClusterRole bound cluster-wide: seconds until that user's dry-run create in
    ``namespace`` (labeled compiled) is admitted, the parameters rewritten and the policy
    writes."""
    grant = {"apiVersion": f"{RBAC}/v1", "kind": "ClusterRole", "metadata": {"name": "bolts"},
             "rules": BOLT_RULES}  # fmt: skip
    bound = {"apiVersion": f"{RBAC}/v1", "kind": "ClusterRoleBinding",
             "metadata": {"name": "bolts"},
             "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": "bolts"},
             "subjects": [{"apiGroup": RBAC, "kind": "User", "name": CRD_USER}]}  # fmt: skip
    send(admin, "POST", f"/apis/{RBAC}/v1/clusterroles", grant)
    send(admin, "POST", f"/apis/{RBAC}/v1/clusterrolebindings", bound)
    time.sleep(quiet)  # a role granting nothing indexed: nothing to write, waited out anyway
    before = versions(admin)
    schema = {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}
    names = {"plural": "bolts", "singular": "bolt", "kind": "Bolt"}
    version = {"name": "v1", "served": True, "storage": True, "schema": schema}
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"bolts.{CRD_GROUP}"},
        "spec": {"group": CRD_GROUP, "scope": "Namespaced", "names": names, "versions": [version]},
    }
    writes = CompilerWrites(cp.audit_log)
    sent, wall = time.monotonic(), time.time()
    send(admin, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
    path = bolt_path(namespace)

    def admitted() -> bool:
        try:
            return admin.send("POST", path, BOLT, {"Impersonate-User": CRD_USER})[0] < 300
        except ValueError:  # not served yet: the API server's plain-text 404
            return False

    while not admitted():
        if time.monotonic() - sent > WAIT:
            raise RuntimeError("the new CRD's writes were never admitted")
        time.sleep(0.05)
    seconds = time.monotonic() - sent
    settled = writes.settle(wall, quiet)
    rewritten = sum(1 for ns, rv in versions(admin).items() if before.get(ns) != rv)
    print(f"  CRD created: its writes admitted after {seconds:.2f} s; {rewritten} parameters "
          f"rewritten, {writes.policies} policy writes, the last {settled:.1f} s after it",
          flush=True)  # fmt: skip
    return {"seconds": round(seconds, 3), "params_rewritten": rewritten,
            "params_writes": writes.params, "policy_writes": writes.policies,
            "settled_s": round(settled, 3)}  # fmt: skip


BOLTS = f"bolts.{CRD_GROUP}"


def lets_pass(admin: Client) -> set[str]:
    """The resources the enforcing policy, as stored, lets pass unjudged (its constant)."""
    status, policy = admin.send("GET", f"{POLICIES}/{RULE_POLICIES[0]}")
    if status != 200:
        raise RuntimeError(f"the enforcing policy could not be read: {status}")
    found = unjudged_of(policy)
    if found is None:
        raise RuntimeError("the enforcing policy holds no unjudged constant")
    return set(found)


def indexes(admin: Client, namespace: str, key: str) -> bool:
    status, params = admin.send(
        "GET", f"/apis/{API_VERSION}/namespaces/{namespace}/{PLURAL}/{NAME}"
    )
    return status == 200 and key in (params.get("spec") or {}).get("indexed", ())


def role_restricts(
    cp: ControlPlane, admin: Client, namespaces: int, quiet: float
) -> dict[str, Any]:
    """After ``crd_created``: a tenant's Role in the middle namespace starts restricting bolts,
    which no annotation restricted, so every namespace indexes them and is written again. Polled
    meanwhile (every 50 ms) until the policy judges them and that namespace indexes them: the
    CRD's user's dry-run creates of a bolt in the namespace written last (the last by name),
    where no role restricts bolts, and how many were refused. Seconds until the Role's namespace
    indexes bolts, until the policy no longer lets them pass (every compiled namespace indexes
    them) and until the last namespace does, the parameters rewritten and the policy writes."""
    own = f"{TENANT}{namespaces // 2}"
    last = max(f"{TENANT}{i}" for i in range(namespaces))
    annotations = {ANNOTATION: json.dumps({"bolts": {"team": ["a"]}})}
    restricting = {"apiVersion": f"{RBAC}/v1", "kind": "Role",
                   "metadata": {"name": "bolts-a", "namespace": own, "annotations": annotations},
                   "rules": BOLT_RULES}  # fmt: skip
    path = bolt_path(last)
    before = versions(admin)
    writes = CompilerWrites(cp.audit_log)
    sent, wall = time.monotonic(), time.time()
    send(admin, "POST", f"/apis/{RBAC}/v1/namespaces/{own}/roles", restricting)
    own_s = judged_s = last_s = None
    probes = refused = 0
    first = ""  # the first refusal's message
    while judged_s is None or last_s is None:  # the pass, whichever ends it
        waited = time.monotonic() - sent
        if waited > WAIT:
            raise RuntimeError("the policy never judged the Role's new restriction")
        probes += 1
        status, found = admin.send("POST", path, BOLT, {"Impersonate-User": CRD_USER})
        if status >= 300:
            refused += 1
            first = first or str((found or {}).get("message", status))
        if own_s is None and indexes(admin, own, BOLTS):
            own_s = waited
        if probes % 10 == 0 and judged_s is None and BOLTS not in lets_pass(admin):
            judged_s = waited
        if probes % 10 == 0 and last_s is None and indexes(admin, last, BOLTS):
            last_s = waited
        time.sleep(0.05)
    settled = writes.settle(wall, quiet)
    rewritten = sum(1 for ns, rv in versions(admin).items() if before.get(ns) != rv)
    print(f"  a Role restricting bolts: its namespace indexes them after {own_s:.2f} s, the "
          f"policy judges them after {judged_s:.1f} s, {last} after {last_s:.1f} s; "
          f"{refused} of {probes} writes in {last} "
          f"refused meanwhile; {rewritten} parameters rewritten, {writes.policies} policy "
          f"writes, the last {settled:.1f} s after it", flush=True)  # fmt: skip
    if first:
        print(f"  the first refusal: {first}", flush=True)
    return {"seconds": round(judged_s, 3), "own_s": round(own_s or 0.0, 3),
            "last_s": round(last_s, 3), "probes": probes,
            "refused": refused, "first_refusal": first, "params_rewritten": rewritten,
            "params_writes": writes.params, "policy_writes": writes.policies,
            "settled_s": round(settled, 3)}  # fmt: skip


def namespaced_edits(admin: Client, edits: int, namespaces: int) -> list[dict[str, float]]:
    found = []
    for n in range(edits):
        namespace = f"tenant-{n % max(1, namespaces // 2)}"
        sent = time.monotonic()
        seconds = bind_in_namespace(admin, n, namespace).wait(admin, sent)
        found.append({"seconds": round(seconds, 3)})
    return found


def summary(rows: list[dict[str, float]]) -> dict[str, Any]:
    values = sorted(r["seconds"] for r in rows)
    out: dict[str, Any] = {"count": len(values)}
    if values:
        out["p50_s"] = round(percentile(values, 0.5), 3)
        out["p99_s"] = round(percentile(values, 0.99), 3)
        out["max_s"] = round(values[-1], 3)
    for key in ("params_rewritten", "policy_writes", "settled_s"):
        if rows and key in rows[0]:
            out[f"{key}_max"] = max(r[key] for r in rows)
    return out


# -- one layout ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    name: str  # this | previous
    root: Path  # the checkout whose compiler and manifests run
    namespaces: int
    grants: int
    edits: int


def never_called(config: dict[str, Any]) -> dict[str, Any]:
    """The webhook registration selecting no namespace (``dormant``) and no object: cluster-wide
    objects (a ClusterRole) are not selected by namespace."""
    never = {"matchLabels": {"labelrbac.io/bench-never": "true"}}
    found = dormant(config)
    return {**found, "webhooks": [{**w, "objectSelector": never} for w in found["webhooks"]]}


def install(cp: ControlPlane, root: Path, name: str) -> None:
    """The compiled component's manifests of ``root``: ``name`` of manifests/compiled."""
    cp.apply(ADMIN, documents(name, root))


@dataclass(frozen=True)
class Profiles:
    """Where the API server's profiles go (``--profiles``): its heap with no compiled path and
    after the first compile, and its CPU over the first ``seconds`` of the first compile and of
    the cluster edits."""

    into: Path
    seconds: int

    def heap(self, layout: Layout, at: str) -> Path:
        return self.into / f"{layout.name}-{at}.pprof"

    def cpu(self, layout: Layout, phase: str = "first-compile") -> Path:
        return self.into / f"{layout.name}-{phase}.cpu.pprof"


def measure(layout: Layout, workdir: Path, clients: int, quiet: float, upgrade: Path | None,
            profiles: Profiles | None = None, settle: float = 0.0) -> dict[str, Any]:  # fmt: skip
    """Every figure of one layout, in a control plane of its own; with ``upgrade`` (a checkout),
    that release's compiler taking the lease over at the end; with ``profiles``, the API
    server's profiles; its settled RSS read ``settle`` seconds after a forced garbage
    collection (``settled_rss_mb``)."""
    workdir.mkdir(parents=True)
    users = (User(ADMIN, ("system:masters",)), COMPILER_USER, WEBHOOK_USER)
    cp = ControlPlane(workdir, users=users)
    cp.start(timeout=180)
    compiler: Compiler | None = None
    out: dict[str, Any] = {"layout": layout.name, "namespaces": layout.namespaces,
                           "cluster_grants": layout.grants,
                           "load_average_before": round(os.getloadavg()[0], 2)}  # fmt: skip
    try:
        admin = Client(cp.url, cp.ca, cp.users[ADMIN].token)
        admin.send("POST", "/api/v1/namespaces", {"metadata": {"name": "label-rbac"}})
        install(cp, layout.root, "crd.yaml")
        time.sleep(3)
        install(cp, layout.root, "rbac.yaml")
        # The webhook's manifests and its registration, never called (its server is not
        # needed): there for the compiler, which keeps its coverage conditions in it.
        webhook = Webhook(cp, workdir, full_compiler=True)
        cp.apply(ADMIN, [never_called(webhook.config)])
        webhook.stop()
        objects, seconds = build(admin, layout.namespaces, layout.grants, clients)
        out.update(objects=objects, build_s=round(seconds, 1))
        print(f"[{layout.name}] built {objects} objects in {seconds:.0f} s", flush=True)
        time.sleep(5)
        out["apiserver_heap_none_mb"] = apiserver_heap_mb(
            cp, profiles.heap(layout, "none") if profiles else None
        )
        out["apiserver_rss_none_mb"] = settled_rss_mb(cp, settle)
        install(cp, layout.root, "policy.yaml")
        parts = {"apiserver": cp.apiserver, "etcd": cp.etcd}
        before = {name: process_cpu(p.pid) for name, p in parts.items() if p is not None}
        compiler = Compiler.start(cp, workdir, layout.root, "bench")
        cpu = profiling(cp, profiles.seconds, profiles.cpu(layout)) if profiles else None
        out["written_s"] = round(wait_written(admin, compiler.started, layout.name == "this"), 1)
        out["marked_s"] = round(wait_marked(compiler, count(admin, "/api/v1/namespaces")), 1)
        parts["compiler"] = compiler.process
        out["first_compile_cpu_ms_per_namespace"] = {
            name: round(1000 * (process_cpu(p.pid) - before.get(name, 0.0)) / layout.namespaces, 1)
            for name, p in parts.items()
            if p is not None
        }
        middle = f"tenant-{layout.namespaces // 2}"
        probe = Probe("cluster-user-0", middle, grant_labels(0, "c0"), grant_labels(0, "nobody"))
        out["enforcing_s"] = round(probe.wait(admin, compiler.started), 1)
        out["settled_s"] = round(compiler.settled(quiet), 1)
        out["compiler_peak_first_mb"] = compiler.peak_mb()
        if cpu is not None and profiles is not None:
            cpu.wait(timeout=profiles.seconds + 60)
        print(f"[{layout.name}] all written after {out['written_s']} s, all marked after "
              f"{out['marked_s']} s, enforcing after "
              f"{out['enforcing_s']} s, settled after {out['settled_s']} s; compiler peak "
              f"{out['compiler_peak_first_mb']} MB; CPU ms a namespace "
              f"{out['first_compile_cpu_ms_per_namespace']}", flush=True)  # fmt: skip
        out.update(stored(admin))
        out.update(information(layout.namespaces, layout.grants))
        out["stored_vs_information"] = round(out["stored_bytes"] / out["information_bytes"], 2)
        out["apiserver_heap_compiled_mb"] = apiserver_heap_mb(
            cp, profiles.heap(layout, "compiled") if profiles else None
        )
        out["apiserver_rss_compiled_mb"] = apiserver_mb(cp)
        print(f"[{layout.name}] stored {out['stored_bytes'] / 1e6:.1f} MB "
              f"({out['stored_vs_information']}x the information); API server "
              f"{out['apiserver_rss_none_mb']:.0f} MB before, "
              f"{out['apiserver_rss_compiled_mb']:.0f} MB after", flush=True)  # fmt: skip
        cpu = profiling(cp, profiles.seconds, profiles.cpu(layout, "edits")) if profiles else None
        edits = cluster_edits(cp, admin, layout.edits, middle, quiet)
        if cpu is not None and profiles is not None:
            cpu.wait(timeout=profiles.seconds + 60)
        out["edits"] = {kind: {**summary(rows), "rows": rows} for kind, rows in edits.items()}
        rows = namespaced_edits(admin, layout.edits, layout.namespaces)
        out["edits"]["rolebinding"] = {**summary(rows), "rows": rows}
        row = crd_created(cp, admin, middle, quiet)
        out["edits"]["crd"] = {**summary([row]), "rows": [row]}
        if layout.name == "this":  # the previous release refuses those writes meanwhile
            row = role_restricts(cp, admin, layout.namespaces, quiet)
            out["edits"]["role"] = {**summary([row]), "rows": [row],
                                    "refused": row["refused"], "probes": row["probes"]}  # fmt: skip
        # Another replica takes the lease over: everything it finds is stored already.
        compiler.stop()
        compiler = Compiler.start(cp, workdir, layout.root, "bench-takeover")
        out["takeover_settled_s"] = round(compiler.settled(quiet), 1)
        out["compiler_peak_takeover_mb"] = compiler.peak_mb()
        if upgrade is not None:
            # This release's manifests and compiler, the previous layout stored.
            compiler.stop()
            for name in ("crd.yaml", "rbac.yaml", "policy.yaml"):
                install(cp, upgrade, name)
            compiler = Compiler.start(cp, workdir, upgrade, "bench-upgrade")
            # It writes every namespace's parameters again once its own policy is in force,
            # ``POLICY_LOADED`` seconds after writing it (until then they list what no
            # annotation restricts, as the previous release's policy reads it there).
            out["upgrade_settled_s"] = round(compiler.settled(max(quiet, POLICY_LOADED + 3)), 1)
            out["compiler_peak_upgrade_mb"] = compiler.peak_mb()
            out["upgraded"] = stored(admin)
        out["apiserver_heap_end_mb"] = apiserver_heap_mb(cp)
        out["apiserver_rss_end_mb"] = apiserver_mb(cp)
        out["apiserver_rss_settled_mb"] = settled_rss_mb(cp, settle)
        out["load_average_after"] = round(os.getloadavg()[0], 2)
    finally:
        if compiler is not None:
            compiler.stop()
        cp.stop()
    return out


# -- the run ---------------------------------------------------------------------------------------


def checkout(ref: str, into: Path) -> Path | None:
    """``ref`` checked out (detached) into ``into``; None when it is not available."""
    known = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
                           cwd=ROOT, capture_output=True, text=True)  # fmt: skip
    if known.returncode != 0:
        return None
    subprocess.run(["git", "worktree", "add", "--detach", str(into), ref], cwd=ROOT,
                   check=True, capture_output=True)  # fmt: skip
    return into


def remove_checkout(path: Path) -> None:
    subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=ROOT,
                   capture_output=True)  # fmt: skip


ROWS: tuple[tuple[str, str, Callable[[Any], str]], ...] = (
    ("namespaces", "namespaces", lambda v: f"{v:,}"),
    ("cluster grants", "cluster_grants", str),
    ("objects built", "objects", lambda v: f"{v:,}"),
    ("build s", "build_s", str),
    ("all written s", "written_s", str),
    ("all marked s", "marked_s", str),
    *(
        (
            f"first compile CPU ms/ns, {part}",
            "first_compile_cpu_ms_per_namespace",
            lambda v, part=part: str(v.get(part, "-")),
        )
        for part in ("apiserver", "etcd", "compiler")
    ),
    ("enforcing s", "enforcing_s", str),
    ("settled s", "settled_s", str),
    ("params objects", "params_objects", lambda v: f"{v:,}"),
    ("params MB", "params_bytes", lambda v: f"{v / 1e6:.2f}"),
    ("policy KB", "policy_bytes", lambda v: f"{sum(v.values()) / 1e3:.1f}"),
    ("stored MB", "stored_bytes", lambda v: f"{v / 1e6:.2f}"),
    ("stored per namespace KB", "per_namespace_bytes", lambda v: f"{v / 1e3:.2f}"),
    ("information MB", "information_bytes", lambda v: f"{v / 1e6:.2f}"),
    ("stored / information", "stored_vs_information", str),
    ("API server RSS MB, none", "apiserver_rss_none_mb", str),
    ("API server RSS MB, compiled", "apiserver_rss_compiled_mb", str),
    ("API server RSS MB, end", "apiserver_rss_end_mb", str),
    ("API server RSS MB, end settled", "apiserver_rss_settled_mb", str),
    ("API server live heap MB, none", "apiserver_heap_none_mb", str),
    ("API server live heap MB, compiled", "apiserver_heap_compiled_mb", str),
    ("API server live heap MB, end", "apiserver_heap_end_mb", str),
    ("compiler peak MB, first", "compiler_peak_first_mb", str),
    ("compiler peak MB, takeover", "compiler_peak_takeover_mb", str),
    ("compiler peak MB, upgrade", "compiler_peak_upgrade_mb", str),
)
EDIT_ROWS = (("p50_s", "p50 s"), ("p99_s", "p99 s"), ("params_rewritten_max", "params rewritten"),
             ("policy_writes_max", "policy writes"), ("settled_s_max", "last write s"),
             ("refused", "writes refused elsewhere"))  # fmt: skip


def table(results: list[dict[str, Any]]) -> str:
    """One column per layout."""
    lines = [f"{'':<40}" + "".join(f"{r['layout']:>16}" for r in results)]
    for label, key, show in ROWS:
        cells = [show(r[key]) if key in r else "-" for r in results]
        lines.append(f"{label:<40}" + "".join(f"{c:>16}" for c in cells))
    for kind in ("clusterrole", "clusterrolebinding", "rolebinding", "crd", "role"):
        for key, label in EDIT_ROWS:
            cells = [str(r.get("edits", {}).get(kind, {}).get(key, "-")) for r in results]
            if any(c != "-" for c in cells):
                lines.append(f"{f'{kind} edit, {label}':<40}" + "".join(f"{c:>16}" for c in cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--namespaces", type=int, default=10_000)
    parser.add_argument("--cluster-grants", type=int, default=200,
                        help="restricted ClusterRoles bound cluster-wide (at least 2)")  # fmt: skip
    parser.add_argument("--baseline-namespaces", type=int, default=1000,
                        help="namespaces of the previous layout's run (0: none)")  # fmt: skip
    parser.add_argument(
        "--baseline-ref",
        default="9d64d26",
        help="the git ref of the previous release (copies in every namespace)",
    )
    parser.add_argument("--edits", type=int, default=20, help="edits of each kind measured")
    parser.add_argument("--baseline-edits", type=int, default=2,
                        help="of each cluster kind in the previous layout (each rewrites every "
                        "namespace there) and of RoleBindings")  # fmt: skip
    parser.add_argument("--clients", type=int, default=8, help="parallel clients building")
    parser.add_argument(
        "--quiet",
        type=float,
        default=3.0,
        help="seconds without a write (and the compiler idle) that mean done",
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--keep", action="store_true", help="keep the logs (printed: where)")
    parser.add_argument("--profiles", type=Path,
                        help="a directory: the API server's heap profiles, with no compiled path "
                        "and after the first compile, and its CPU profiles of the first compile "
                        "and of the cluster edits, per layout")  # fmt: skip
    parser.add_argument("--profile-seconds", type=int, default=30,
                        help="the seconds each CPU profile covers from the start of its "
                        "phase")  # fmt: skip
    parser.add_argument("--settle", type=float, default=60.0,
                        help="seconds from a forced garbage collection to reading the API "
                        "server's settled RSS (with no compiled path, and at the end)")  # fmt: skip
    args = parser.parse_args(argv)
    profiles = None
    if args.profiles is not None:
        args.profiles.mkdir(parents=True, exist_ok=True)
        profiles = Profiles(args.profiles, args.profile_seconds)
    if args.cluster_grants < 2:
        parser.error("--cluster-grants must be at least 2 (one edited role, one edited binding)")
    workdir = Path(tempfile.mkdtemp(prefix="bench-layout-"))
    results: list[dict[str, Any]] = []

    def done(found: dict[str, Any]) -> None:
        results.append(found)
        if args.json:
            args.json.write_text(json.dumps(results, indent=2) + "\n")

    try:
        this = Layout("this", ROOT, args.namespaces, args.cluster_grants, args.edits)
        done(measure(this, workdir / "this", args.clients, args.quiet, None, profiles,
                     args.settle))  # fmt: skip
        if args.baseline_namespaces:
            previous = checkout(args.baseline_ref, workdir / "previous-release")
            if previous is None:
                print(f"{args.baseline_ref} is not available: no baseline", flush=True)
            else:
                try:
                    base = Layout("previous", previous, args.baseline_namespaces,
                                  args.cluster_grants, args.baseline_edits)  # fmt: skip
                    done(measure(base, workdir / "previous", args.clients, args.quiet, ROOT,
                                 profiles, args.settle))  # fmt: skip
                finally:
                    remove_checkout(previous)
    finally:
        if args.keep:
            print(f"logs kept in {workdir}", flush=True)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
