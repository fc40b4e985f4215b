"""Engine benchmark: decision throughput of the engine, as ratios to baselines.

Run with ``.venv/bin/python -m bench engine``; the HTTP figures are ``python -m bench http``'s
and the scale figures ``python -m bench scale``'s.
Every figure is reported next to a baseline measured in the same run, because absolute numbers
on a shared machine mean little:

- engine: ``evaluate`` against ``json.loads`` of the same review (the work no webhook can skip),
  and the indexed ``Snapshot`` against a linear scan of every binding (what a webhook without
  indexes does, e.g. one that lists RoleBindings per request);
- node rules: a non-node request with and without the node check in the pipeline;
- node authorizer (``--node-graph``): graph updates per pod event against ``json.loads`` of the
  pod (the work every watch event costs anyway), decisions against ``json.loads`` of the
  SubjectAccessReview, reads while a writer churns the graph, and the memory kept per pod;
- workload rules: every request with and without them, in CPU time of alternating rounds (a
  Deployment or Pod of a restricted tenant reads its Secret's labels from a warm metadata cache);
- placement (``--placement``): a tenant's pinned Pod and Deployment decided with the tenants'
  roles carrying a placement against the same decision with roles that carry none, in CPU time
  of alternating rounds;
- reverse questions (``--reverse``): ``audit`` per existing object and ``who-can`` against one
  admission decision about the same object (what a loop of ``check`` would cost);
- reads: ``authorize`` (SubjectAccessReviews) against ``json.loads`` of the same review, and a
  whole SubjectAccessReview (parse, decide, build, serialize) against a whole AdmissionReview.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from app.engine.authorize import authorize
from app.engine.context import Context, ObjectRef, Options
from app.engine.decide import PRE_CHECKS, evaluate
from app.engine.kinds import snapshot_from_objects
from app.engine.model import Access, Request, Resource, UserInfo
from app.engine.nodeauthz import check_node_read
from app.engine.nodegraph import NodeGraph, compile_pod
from app.engine.rbac import Binding, CompiledRole, Compiler, Snapshot
from app.engine.selectors import Requirement
from app.source.static import read_manifests
from app.webhook.wire import build_response, parse_review
from app.webhook.wire_sar import build_access_response, parse_access_review
from bench.core.processes import ROOT
from bench.core.stats import cost, rate
from tests.support import API, make_access_review, make_review


class LinearSnapshot(Snapshot):
    """Baseline: finds bindings by scanning all of them, as an unindexed webhook would."""

    def roles_for(self, user: UserInfo, namespace: str) -> Iterator[tuple[Binding, CompiledRole]]:
        keys = {("User", user.username), *(("Group", g) for g in user.groups)}
        seen: set[int] = set()
        for found in self.bindings.values():
            for binding, role in found:
                if binding.namespace not in (namespace, "") or id(binding) in seen:
                    continue
                if keys.intersection(binding.subjects):
                    seen.add(id(binding))
                    yield binding, role


POOL = "node-restriction.kubernetes.io/pool"


def placement(team: str) -> dict[str, str]:
    """The annotation placing team ``team``'s pods on pool ``team`` (and its taint)."""
    toleration = {"key": "pool", "values": [team], "effects": ["NoSchedule"]}
    return {
        "labelrbac.io/placement": json.dumps(
            {"nodeLabels": {POOL: [team]}, "tolerations": [toleration]}
        )
    }


def cluster_objects(
    tenant_namespaces: int, placed: bool = False
) -> list[tuple[str, dict[str, Any]]]:
    """The bootstrap RBAC of a real cluster plus ``tenant_namespaces`` namespaces of two teams
    (``placed``: each team's role places its pods on the team's pool of Nodes)."""
    objects: list[tuple[str, Any]] = []
    if placed:
        for team in ("a", "b"):
            labels = {POOL: team}
            objects.append(("Node", {"metadata": {"name": f"node-{team}", "labels": labels}}))
    for name in ("roles", "clusterroles", "rolebindings", "clusterrolebindings", "namespaces"):
        objects += read_manifests(API / f"list-{name}.json")
    objects += read_manifests(ROOT / "manifests" / "examples")
    for i in range(tenant_namespaces):
        ns = f"tenant-{i}"
        objects.append(("Namespace", {"metadata": {"name": ns}}))
        for team in ("a", "b"):
            objects.append(
                (
                    "Role",
                    {
                        "metadata": {
                            "name": f"team-{team}",
                            "namespace": ns,
                            "annotations": {
                                "labelrbac.io/permissions": json.dumps(
                                    {
                                        "configmaps": {"team": [team]},
                                        "secrets": {"team": [team]},
                                        "pods": {"team": [team]},
                                        "deployments.apps": {"team": [team]},
                                    }
                                ),
                                **(placement(team) if placed else {}),
                            },
                        },
                        "rules": [
                            {
                                "apiGroups": [""],
                                "resources": ["configmaps", "secrets"],
                                "verbs": ["*"],
                            },
                            {
                                "apiGroups": ["", "apps"],
                                "resources": ["pods", "deployments"],
                                "verbs": ["*"],
                            },
                        ],
                    },
                )
            )
            objects.append(("RoleBinding", {
                "metadata": {"name": f"team-{team}", "namespace": ns},
                "roleRef": {"kind": "Role", "name": f"team-{team}"},
                "subjects": [{"kind": "User", "name": f"user-{i}-{team}-{u}"} for u in range(5)],
            }))  # fmt: skip
    return objects


def reviews(tenant_namespaces: int) -> dict[str, dict[str, Any]]:
    ns = f"tenant-{tenant_namespaces // 2}"
    user_a = f"user-{tenant_namespaces // 2}-a-0"
    return {
        "tenant-allowed": make_review(
            user_a, "CREATE", "configmaps", namespace=ns, labels={"team": "a"}, groups=("t",)
        ),
        "tenant-denied": make_review(
            user_a, "CREATE", "configmaps", namespace=ns, labels={"team": "b"}, groups=("t",)
        ),
        "tenant-update": make_review(
            user_a, "UPDATE", "configmaps", namespace=ns,
            labels={"team": "a", "v": "2"}, old_labels={"team": "a"}, groups=("t",),
        ),
        "admin": make_review(
            "admin", "CREATE", "configmaps", namespace=ns, labels={}, groups=("system:masters",)
        ),
        "deploy-tenant": workload_review(user_a, ns, ("t",)),
        "deploy-admin": workload_review("admin", ns, ("system:masters",)),
        "pod-tenant": workload_review(user_a, ns, ("t",), pod=True),
    }  # fmt: skip


def workload_review(
    user: str, ns: str, groups: tuple[str, ...], pod: bool = False, pinned: bool = False
) -> Any:
    """A Deployment (or a Pod) in bucket team=a that mounts the Secret ``s-a`` (``pinned``: on
    pool a, by nodeSelector and required affinity, tolerating pool a's taint)."""
    secret = {"secretRef": {"name": "s-a"}}
    spec: dict[str, Any] = {
        "containers": [{"name": "c", "image": "nginx", "envFrom": [secret]}],
        "volumes": [{"name": "s", "secret": {"secretName": "s-a"}}],
    }
    if pinned:
        term = {"matchExpressions": [{"key": POOL, "operator": "In", "values": ["a"]}]}
        required = {"nodeSelectorTerms": [term]}
        spec |= {
            "nodeSelector": {POOL: "a"},
            "affinity": {
                "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}
            },
            "tolerations": [
                {"key": "pool", "operator": "Equal", "value": "a", "effect": "NoSchedule"},
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                 "effect": "NoExecute", "tolerationSeconds": 300},
            ],
        }  # fmt: skip
    labels = {"team": "a"}
    if pod:
        return make_review(
            user,
            "CREATE",
            "pods",
            namespace=ns,
            labels=labels,
            kind="Pod",
            groups=groups,
            extra_object={"spec": spec},
        )
    selector = {"matchLabels": {"team": "a", "app": "web"}}
    template = {"metadata": {"labels": {"team": "a", "app": "web"}}, "spec": spec}
    return make_review(
        user, "CREATE", "deployments.apps", namespace=ns, labels=labels, kind="Deployment",
        groups=groups, extra_object={"spec": {"selector": selector, "template": template}},
    )  # fmt: skip


def cached_metadata(ref: ObjectRef) -> Mapping[str, Any]:
    """What a warm metadata cache answers: every referenced object is in bucket team=a."""
    return {"metadata": {"name": ref.name, "namespace": ref.namespace, "labels": {"team": "a"}}}


def whole_review(body: str, ctx: Context) -> bytes:
    """What the webhook does with an AdmissionReview: parse, decide, build, serialize."""
    rev = parse_review(json.loads(body))
    out = build_response(rev.api_version, rev.request.uid, evaluate(rev.request, ctx))
    return json.dumps(out).encode()


def engine_bench(tenant_namespaces: int, seconds: float) -> None:
    compiler = Compiler(("labelrbac.io/permissions",))
    objects = cluster_objects(tenant_namespaces)
    started = time.perf_counter()
    indexed = snapshot_from_objects(objects, compiler)
    build_ms = (time.perf_counter() - started) * 1000
    linear = LinearSnapshot(indexed.roles, indexed.bindings, indexed.namespaces, indexed.nodes)
    options = Options(compiler=compiler)
    ctx = Context(indexed, options, metadata=cached_metadata)
    linear_ctx = Context(linear, options, metadata=cached_metadata)
    no_node = tuple(c for c in PRE_CHECKS if c.__name__ != "check_node")
    n_bindings = sum(len(v) for v in indexed.bindings.values())
    print(f"snapshot: {len(objects)} objects, {len(indexed.roles)} roles, "
          f"{n_bindings} binding index entries, built in {build_ms:.0f} ms")  # fmt: skip
    header = (
        f"{'request':16} {'decisions/s':>12} {'json.loads/s':>13} {'decide/parse':>13} "
        f"{'linear/s':>10} {'index speedup':>14} {'node-check cost':>16} "
        f"{'workload-rule cost':>19} {'full review/s':>14}"
    )
    print(header)
    for name, review in reviews(tenant_namespaces).items():
        body = json.dumps(review)
        request: Request = parse_review(review).request
        decision = evaluate(request, ctx)
        assert decision == evaluate(request, linear_ctx), name
        decide = rate(lambda r=request: evaluate(r, ctx), seconds)
        parse = rate(lambda b=body: json.loads(b), seconds)
        scan = rate(lambda r=request: evaluate(r, linear_ctx), seconds)
        without_node = rate(lambda r=request: evaluate(r, ctx, no_node), seconds)
        workload_cost = cost(
            lambda r=request: evaluate(r, ctx),
            lambda r=request: evaluate(r, ctx, PRE_CHECKS, ()),
            seconds,
        )

        whole = rate(lambda b=body: whole_review(b, ctx), seconds)
        print(
            f"{name:16} {decide:12,.0f} {parse:13,.0f} {decide / parse:13.2f} "
            f"{scan:10,.0f} {decide / scan:13.0f}x {without_node / decide - 1:15.1%} "
            f"{workload_cost:18.1%} {whole:14,.0f}"
        )


def fastest_rounds(
    fn: Callable[[], object], baseline: Callable[[], object], seconds: float, calls: int = 50
) -> float:
    """CPU time of ``fn`` over ``baseline`` in their fastest rounds: alternating rounds of
    ``calls`` (ABBA), each side's fastest kept, so that rounds another process's load slowed
    (two cores shared with other work) weigh on neither."""
    fastest = {fn: float("inf"), baseline: float("inf")}
    deadline, rounds = time.perf_counter() + seconds, 0
    while time.perf_counter() < deadline or rounds < 4:
        for f in (fn, baseline) if rounds % 2 == 0 else (baseline, fn):
            start = time.process_time()
            for _ in range(calls):
                f()
            fastest[f] = min(fastest[f], time.process_time() - start)
        rounds += 1
    return fastest[fn] / fastest[baseline]


def placement_bench(tenant_namespaces: int, seconds: float) -> None:
    """The same pinned pod (and Deployment) decided with placed and with unplaced roles."""
    compiler = Compiler(("labelrbac.io/permissions",))
    options = Options(compiler=compiler)
    placed, unplaced = (
        Context(snapshot_from_objects(cluster_objects(tenant_namespaces, p), compiler), options,
                metadata=cached_metadata)
        for p in (True, False)
    )  # fmt: skip
    ns, user = f"tenant-{tenant_namespaces // 2}", f"user-{tenant_namespaces // 2}-a-0"
    print(f"{'placement':16} {'placed/s':>12} {'unplaced/s':>12} {'placed/unplaced':>16} "
          f"{'(all rounds)':>13}")  # fmt: skip
    for name, pod in (("pinned-pod", True), ("pinned-deploy", False)):
        request = parse_review(workload_review(user, ns, ("t",), pod=pod, pinned=True)).request
        assert evaluate(request, placed).allowed and evaluate(request, unplaced).allowed, name
        ratio = fastest_rounds(lambda r=request: evaluate(r, placed),
                               lambda r=request: evaluate(r, unplaced), seconds)  # fmt: skip
        extra = cost(lambda r=request: evaluate(r, placed),
                     lambda r=request: evaluate(r, unplaced), seconds)  # fmt: skip
        with_placement = rate(lambda r=request: evaluate(r, placed), seconds)
        without = rate(lambda r=request: evaluate(r, unplaced), seconds)
        print(f"{name:16} {with_placement:12,.0f} {without:12,.0f} {ratio:15.3f}x "
              f"{1 + extra:12.3f}x")  # fmt: skip


def bench_pod(i: int, nodes: int, node: int | None = None) -> dict[str, Any]:
    """A pod as a Deployment's replica is stored: service account, a secret volume, env from a
    configmap, the projected kube-root-ca.crt every pod gets; one in ten mounts a claim."""
    ns = f"ns-{i % 100}"
    volumes: list[dict[str, Any]] = [
        {"name": "creds", "secret": {"secretName": f"creds-{i % 50}"}},
        {"name": "token", "projected": {"sources": [
            {"serviceAccountToken": {"path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt"}},
        ]}},
    ]  # fmt: skip
    if i % 10 == 0:
        volumes.append({"name": "data", "persistentVolumeClaim": {"claimName": f"data-{i}"}})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"web-{i}", "namespace": ns, "uid": f"uid-{i}",
                     "labels": {"app": "web", "team": "a"}},
        "spec": {
            "nodeName": f"node-{(i if node is None else node) % nodes}",
            "serviceAccountName": "web",
            "containers": [{"name": "c", "image": "nginx:1.27", "envFrom": [
                {"configMapRef": {"name": f"settings-{i % 20}"}}]}],
            "volumes": volumes,
        },
        "status": {"phase": "Running", "podIP": "10.0.0.1"},
    }  # fmt: skip


def node_graph_bench(pods: int, nodes: int, seconds: float) -> None:
    import threading
    import tracemalloc

    bodies = [json.dumps(bench_pod(i, nodes)) for i in range(pods)]
    tracemalloc.start()
    graph = NodeGraph()
    bindings = []
    for body in bodies:  # what the informer keeps: the binding, never the pod
        binding = compile_pod(json.loads(body))
        bindings.append(binding)
        graph.update_pod(None, binding)
    kept, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(f"node graph: {pods} pods on {nodes} nodes, {len(graph)} objects reached, "
          f"{kept / pods:,.0f} bytes kept per pod (bindings + graph)")  # fmt: skip

    sample = bodies[pods // 2]
    parse = rate(lambda: json.loads(sample), seconds)
    compiled = rate(lambda: compile_pod(json.loads(sample)), seconds)
    one = bindings[pods // 2]
    moved = compile_pod(bench_pod(pods // 2, nodes, node=pods // 2 + 1))

    def churn() -> None:  # a pod moves to another node and back: four count updates per ref
        graph.update_pod(one, moved)
        graph.update_pod(moved, one)

    updates = rate(churn, seconds) * 2
    print(f"{'pod event':24} {'events/s':>12} {'json.loads/s':>13} {'cost/parse':>11}")
    for label, events in (("compile (parse+reduce)", compiled), ("graph update", updates)):
        print(f"{label:24} {events:12,.0f} {parse:13,.0f} {parse / events:11.2f}")

    node = f"node-{(pods // 2) % nodes}"
    ns = f"ns-{(pods // 2) % 100}"
    user = UserInfo(f"system:node:{node}", ("system:nodes", "system:authenticated"))
    other = UserInfo("system:node:node-x", ("system:nodes", "system:authenticated"))
    own_pods = (Requirement("spec.nodeName", "In", (node,)),)
    accesses = {
        "get secret (related)": Access(user, "get", Resource("", "secrets"), "v1", ns,
                                       f"creds-{(pods // 2) % 50}"),
        "get secret (unrelated)": Access(other, "get", Resource("", "secrets"), "v1", ns,
                                         f"creds-{(pods // 2) % 50}"),
        "get mounted pvc": Access(user, "get", Resource("", "persistentvolumeclaims"), "v1", ns,
                                  f"data-{pods // 2}"),
        "list own pods": Access(user, "list", Resource("", "pods"), "v1", fields=own_pods),
    }  # fmt: skip
    ctx = Context(snapshot_from_objects([], Compiler(("labelrbac.io/permissions",))), nodes=graph)
    attributes = {"verb": "get", "resource": "secrets", "namespace": ns, "name": "creds-0"}
    sar = json.dumps({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                      "spec": {"user": user.username, "groups": list(user.groups),
                               "resourceAttributes": attributes}})  # fmt: skip
    sar_parse = rate(lambda: json.loads(sar), seconds)
    print(f"{'node request':24} {'decisions/s':>12} {'json.loads/s':>13} {'decide/parse':>13}")
    for name, access in accesses.items():
        decision = check_node_read(access, ctx)
        assert decision is not None, name
        decided = rate(lambda a=access: check_node_read(a, ctx), seconds)
        print(f"{name:24} {decided:12,.0f} {sar_parse:13,.0f} {decided / sar_parse:13.2f}"
              f"   ({decision.verdict.value})")  # fmt: skip

    # Readers never wait for the writer: decisions per second with a writer churning alongside.
    related = accesses["get secret (related)"]
    stop = threading.Event()
    writes = [0]

    def writer() -> None:
        while not stop.is_set():
            churn()
            writes[0] += 2

    thread = threading.Thread(target=writer)
    thread.start()
    started = time.perf_counter()
    under_churn = rate(lambda: check_node_read(related, ctx), seconds)
    stop.set()
    thread.join()
    elapsed = time.perf_counter() - started
    alone = rate(lambda: check_node_read(related, ctx), seconds)
    print(f"reads with a writer churning: {under_churn:,.0f}/s ({under_churn / alone:.0%} of "
          f"{alone:,.0f}/s alone; one interpreter, so they share it) while "
          f"{writes[0] / elapsed:,.0f} updates/s went in")  # fmt: skip


def reverse_bench(tenant_namespaces: int, per_namespace: int) -> None:
    from app.engine.reverse import Existing, audit, who_can

    compiler = Compiler(("labelrbac.io/permissions",))
    snapshot = snapshot_from_objects(cluster_objects(tenant_namespaces), compiler)
    ctx = Context(snapshot, Options(compiler=compiler))
    cm = Resource("", "configmaps")
    # Nine in ten objects in one of the two buckets, one in ten labelled for no bucket.
    existing = [
        Existing(cm, f"tenant-{i}", f"c{j}", {"team": "z" if j % 10 == 9 else "ab"[j % 2]})
        for i in range(tenant_namespaces)
        for j in range(per_namespace)
    ]
    started = time.perf_counter()
    report = audit(snapshot, existing)
    audit_s = time.perf_counter() - started
    sample = existing[len(existing) // 2]
    obj = {"kind": "ConfigMap", "metadata": {"name": sample.name, "namespace": sample.namespace,
                                             "labels": dict(sample.labels)}}  # fmt: skip
    request = Request("b", "UPDATE", UserInfo(f"user-{tenant_namespaces // 2}-a-0"), cm,
                      "ConfigMap", sample.namespace, sample.name, obj, obj)  # fmt: skip
    decide = rate(lambda: evaluate(request, ctx), 1.0)
    started = time.perf_counter()
    holders = who_can(snapshot, "update", cm, sample.namespace, dict(sample.labels))
    who_s = time.perf_counter() - started
    per_object = audit_s / len(existing)
    print(f"audit: {len(existing)} configmaps in {audit_s:.2f} s ({per_object * 1e6:,.0f} us "
          f"per object, {per_object * decide:.1f}x one admission decision), "
          f"{len(report.orphans)} orphans")  # fmt: skip
    print(
        f"who-can: {len(holders)} subjects in {who_s * 1000:.0f} ms "
        f"({who_s * decide:,.0f}x one admission decision)"
    )
    reports_bench(snapshot, existing, decide)


def reports_bench(snapshot: Snapshot, existing: list[Any], decide: float) -> None:
    """One pass of ``label-rbac report``: audit, findings, every report rendered and serialised
    (what a pass does besides the writes of the reports that changed)."""
    from app.engine.reverse import AuditCache, audit
    from app.reports.render import Scope, count_passes, findings, reports

    cache = AuditCache()  # kept from pass to pass, as the controller keeps it
    cpu = time.process_time()
    report = audit(snapshot, existing, with_buckets=False, cache=cache)
    scopes = findings(snapshot, report, lambda key: 0)
    count_passes(existing, report, scopes, lambda key: 0)
    scopes.setdefault("", Scope())
    rendered = [r for ns, scope in scopes.items() for r in reports(ns, scope)]
    sizes = [len(json.dumps(r)) for r in rendered]
    cpu = time.process_time() - cpu
    print(
        f"report pass: {len(existing)} objects, {len(rendered)} reports in {cpu:.2f} s CPU "
        f"({cpu * decide:,.0f} admission decisions' worth); report bytes: total "
        f"{sum(sizes):,}, largest {max(sizes):,}, median {sorted(sizes)[len(sizes) // 2]:,}"
    )
    # A later pass after a label change in one namespace: its objects only (the controller keeps
    # the other namespaces' findings and reports, and the answers of the unchanged RBAC).
    namespace = existing[len(existing) // 2].namespace
    one = [obj for obj in existing if obj.namespace == namespace]
    cpu = time.process_time()
    report = audit(snapshot, one, with_buckets=False, cache=cache)
    scopes = findings(snapshot, report, lambda key: 0)
    count_passes(one, report, scopes, lambda key: 0)
    touched = [json.dumps(r) for r in reports(namespace, scopes[namespace])]
    cpu = time.process_time() - cpu
    print(
        f"report pass after a label change in one namespace: {len(one)} objects, "
        f"{len(touched)} report in {cpu * 1000:.1f} ms CPU ({cpu * decide:,.0f} admission "
        "decisions' worth)"
    )
    # After an RBAC change the snapshot is new: the answers are computed again.
    cpu = time.process_time()
    report = audit(snapshot, one, with_buckets=False, cache=AuditCache())
    scopes = findings(snapshot, report, lambda key: 0)
    count_passes(one, report, scopes, lambda key: 0)
    touched = [json.dumps(r) for r in reports(namespace, scopes[namespace])]
    cpu = time.process_time() - cpu
    print(
        f"report pass after an RBAC change in one namespace: {len(one)} objects, "
        f"{len(touched)} report in {cpu * 1000:.0f} ms CPU ({cpu * decide:,.0f} admission "
        "decisions' worth)"
    )


def access_reviews(tenant_namespaces: int) -> dict[str, dict[str, Any]]:
    ns = f"tenant-{tenant_namespaces // 2}"
    user = f"user-{tenant_namespaces // 2}-a-0"
    own = [("team", "In", ["a"])]
    return {
        "list-own-bucket": make_access_review(user, "list", "configmaps", namespace=ns,
                                              selector=own),
        "list-denied": make_access_review(user, "list", "configmaps", namespace=ns),
        "get-by-name": make_access_review(user, "get", "configmaps", namespace=ns, name="cm-a"),
        "list-two-buckets": make_access_review(user, "list", "configmaps", namespace=ns,
                                               selector=[("team", "In", ["a", "b"])]),
        "admin": make_access_review("admin", "list", "configmaps", namespace=ns,
                                    groups=("system:masters",)),
    }  # fmt: skip


def authorize_bench(tenant_namespaces: int, seconds: float) -> None:
    """SubjectAccessReviews: decisions/s, and a whole review against a whole AdmissionReview."""
    compiler = Compiler(("labelrbac.io/permissions",))
    snapshot = snapshot_from_objects(cluster_objects(tenant_namespaces), compiler)
    labels = {"metadata": {"name": "cm-a", "labels": {"team": "a"}}}

    def metadata(ref: ObjectRef) -> dict[str, Any]:
        return labels  # what the metadata watch holds: a dictionary read

    ctx = Context(snapshot, Options(compiler=compiler), metadata=metadata)
    admission = json.dumps(reviews(tenant_namespaces)["tenant-allowed"])

    baseline = rate(lambda: whole_review(admission, ctx), seconds)
    print(f"{'read request':16} {'decisions/s':>12} {'json.loads/s':>13} {'decide/parse':>13} "
          f"{'full review/s':>14} {'vs admission':>13}  verdict")  # fmt: skip
    for name, document in access_reviews(tenant_namespaces).items():
        body = json.dumps(document)
        access = parse_access_review(document).access
        assert access is not None
        decision = authorize(access, ctx)
        decide = rate(lambda a=access: authorize(a, ctx), seconds)
        parse = rate(lambda b=body: json.loads(b), seconds)

        def full(b: str = body) -> bytes:
            review = parse_access_review(json.loads(b))
            assert review.access is not None
            out = build_access_response(review.api_version, authorize(review.access, ctx))
            return json.dumps(out).encode()

        whole = rate(full, seconds)
        print(
            f"{name:16} {decide:12,.0f} {parse:13,.0f} {decide / parse:13.2f} "
            f"{whole:14,.0f} {whole / baseline:12.2f}x  {decision.verdict.value}"
        )
    print(f"(a whole tenant AdmissionReview: {baseline:,.0f}/s in the same run)")


def log_bench(seconds: float, threads: int = 4) -> None:
    """Decision logging from ``threads`` request threads into a pipe (as a container's stdout).

    Baseline: a StreamHandler formatting and writing under its lock in the calling thread.
    Measured: app.logs' queue handler, which only enqueues; one listener thread writes.
    Both write the same JSON lines; the figure is records handed off per second by the callers.
    """
    import logging
    import threading

    from app import logs

    record = {
        "uid": "0f0e0d0c-0000-4000-8000-000000000001",
        "user": "alice",
        "operation": "CREATE",
        "resource": "configmaps",
        "namespace": "t1",
        "name": "c1",
        "dryRun": False,
        "allowed": True,
        "reason": "Allowed",
        "ms": 0.21,
    }

    def run(handler: logging.Handler) -> tuple[float, float]:
        """(records handed off per second by the callers, per second until all are written)"""
        logger = logging.getLogger(f"bench.{id(handler)}")
        logger.handlers[:] = [handler]
        logger.propagate = False
        logger.setLevel(logging.INFO)
        count = [0] * threads
        stop = time.perf_counter() + seconds

        def emit(i: int) -> None:
            n = 0
            while time.perf_counter() < stop:
                for _ in range(50):
                    logger.info("decision", extra={"fields": record})
                n += 50
            count[i] = n

        workers = [threading.Thread(target=emit, args=(i,)) for i in range(threads)]
        started = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        handed = time.perf_counter() - started
        logs.stop()  # waits until the listener has written everything queued
        written = time.perf_counter() - started
        return sum(count) / handed, sum(count) / written

    sink = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    assert sink.stdin is not None
    stream = open(sink.stdin.fileno(), "w", closefd=False)  # noqa: SIM115
    direct = logging.StreamHandler(stream)
    direct.setFormatter(logs.JsonFormatter())
    locked, _ = run(direct)
    queued, queued_written = run(logs.queued_handler(stream))
    stream.close()
    sink.stdin.close()
    sink.wait()
    print(f"decision logging, {threads} threads into a pipe: locked StreamHandler {locked:,.0f}/s; "
          f"queue handler {queued:,.0f}/s handed off ({queued / locked:.2f}x), "
          f"{queued_written:,.0f}/s written ({queued_written / locked:.2f}x)")  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--namespaces", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=1.5, help="per measurement")
    parser.add_argument("--pods", type=int, default=20000, help="pods in the node graph")
    parser.add_argument("--nodes", type=int, default=500, help="nodes the pods spread over")
    parser.add_argument("--reverse", action="store_true", help="only audit and who-can")
    parser.add_argument("--logs-only", action="store_true", help="only the decision-log figure")
    parser.add_argument("--placement", action="store_true", help="only the placement figure")
    args = parser.parse_args(argv)
    if args.placement:
        placement_bench(args.namespaces, args.seconds)
        return
    if args.reverse:
        reverse_bench(args.namespaces, 10)
        return
    if args.logs_only:
        log_bench(args.seconds)
        return
    engine_bench(args.namespaces, args.seconds)
    placement_bench(args.namespaces, args.seconds)
    authorize_bench(args.namespaces, args.seconds)
    node_graph_bench(args.pods, args.nodes, args.seconds)
    log_bench(args.seconds)
