"""Tenant creates through a real kube-apiserver: the compiled policy, the webhook, no admission.

The compiled label rule is measured against no admission, a trivial ValidatingAdmissionPolicy,
the same rule written by hand as one expression and label-rbac's webhook, in the same run.

A loopback control plane (tests/kube/controlplane.py: etcd and kube-apiserver) holds a tenant,
alice, bound to a Role restricting configmaps to ``team=a``, and N RoleBindings in her namespace
(other users bound to ten label-restricted Roles). For each N, wrk POSTs ConfigMaps labeled
``team=a`` as alice (each a new object: ``generateName``; carol with ``--writer cluster``) at
each concurrency, under

- ``none``: no policy bound (RBAC only);
- ``trivial``: one policy matching the same writes, one constant expression (the floor of any
  policy);
- ``rule``: the same rule written by hand for alice alone, one expression and no parameters: the
  cost the compiled path is held to;
- ``compiled``: the enforcing policy as the compiler writes it (``admission_policy.policy``
  holding the ClusterRoleBindings' part that ``render_cluster`` renders), under a name of its
  own, with manifests/compiled/policy.yaml's guards and the parameters ``label-rbac compile``
  writes (rendered and written here, as the compiler);
- ``params`` (only with ``--setups``): the compiled policy judging nothing (no match condition,
  its validation one constant expression), to tell its parameters' cost from its expressions';
  ``granting``, ``unlisted``, ``denied``: no match condition, its validation one expression
  reading only that variable (and what it depends on), to tell what each part costs;
- ``file`` (only with ``--policy FILE``): the policies of FILE (an earlier release's
  ``policy.yaml``, say) on the same parameters, to compare two shapes of the policy in one run;
- ``webhook``: label-rbac's ``/validate`` registered as ``manifests/enforce`` registers it (the
  ValidatingWebhookConfiguration pointed at loopback, as tests/kube/cluster.py installs it),
  served by the real ``python -m app serve`` process watching this API server;
- ``full``: ``manifests/enforce-compiled`` as shipped: its bindings and guards and the split
  registration (``manifests/compiled/split``) with the conditions the compiler keeps in it, the
  compiler (``python -m app compile``, which writes the policy ``label-rbac`` with its
  constants, the parameters, and marks the namespace compiled) and the webhook running;
- its parts and options (only with ``--setups``): ``split``, that registration alone (no
  policy); ``modes``, ``compiled`` with the warn and audit policies and the bindings of the
  optional ``manifests/compiled/modes``, without the split; ``full-modes``, the shipped install
  with that component added (the compiler run with ``--compile-softened``, which writes those
  policies). Nothing is softened in the namespace, so it is not labeled
  ``labelrbac.io/softened`` and those bindings do not select it: what the component costs the
  writes of every namespace where no mode softens a denial.

Setups alternate within each round, every other round in reverse order, and every figure is the
median of the rounds. Per setup: p50 latency and throughput, the p50 added over ``none`` and the
throughput ratio to ``none``, and the API server's CPU time per create (from /proc, which a
busy machine inflates far less than latency; for the webhook, its own process's CPU per create
too). What a setup costs the API server is its CPU per create added over ``none``
(``added_cpu_ms``), and held against the hand-written rule's (``cpu_vs_rule``: the ratio of the
two increments); ``cpu_vs_trivial`` divides whole CPU figures, and the ratio of added p50s,
``added_vs_trivial``, is kept too but divides two small differences of noisy figures. The load
average is printed with each size; ``--json FILE`` writes the rows.

``--cluster-grants K[,K...]`` adds K restricted ClusterRoles (seven resources each, each its
own label values) bound cluster-wide, each to a user of its own, and measures each size. The
ClusterRoleBindings' part is stored once, in the policy's constants (``cluster0..N``, each at
most 90,000 code points: the API server refuses an expression over 100,000), so the
namespace's parameters do not grow with K, the policy does: each size prints both, and the
number of constants. ``--writer cluster`` measures the writes of carol instead of alice: her
grant (configmaps and the six others, ``team=a``) comes only from a restricted ClusterRole bound
cluster-wide (``bench-writer``, bound after the K others), so no role of the namespace permits
her writes and the policy's match condition, which cannot read its constants, sends every one
of them to the validation, which finds her grant there. The baselines then name carol.

``--globs N`` binds alice to one more Role, first in binding order, restricting configmaps by N
value globs spread over ``--glob-keys`` label keys (``--glob-shape general``: none a literal, a
prefix or a suffix, the shape the policy can only test with a regular expression; ``prefix``:
``e7-*``), and every create carries those labels
with values only each key's last glob matches: the policy (and the webhook) try every glob of
that role on every write before the next role permits it. It is what a role another tenant
writes and binds to alice costs her writes.

    python -m bench vap --bindings 10,5000 --connections 1,8 --seconds 5 --rounds 5
    python -m bench vap --bindings 10,5000 --setups full --cluster-grants 0,200 --writer cluster

``--namespaces N`` makes the cluster hold N namespaces: t1 and N - 1 tenant namespaces of
``bench layout``'s shape (two annotated Roles, a plain Role, three RoleBindings each), created
before the compiler starts (so it needs a setup that runs it: ``full``). The compiler's first
compile of all of them is waited for and timed; then every setup, the baselines too, runs
against an API server holding N namespaces' parameters (and, with ``--cluster-grants``, the
policy's constants): what a write costs in a large cluster, against baselines measured there.

    python -m bench vap --namespaces 10000 --cluster-grants 200 --bindings 10,5000 --setups full

``--profile DIR`` writes the API server's CPU profile of each setup's first run
(``go tool pprof -top DIR/full-10-c8.pprof``): what to look at before changing the policy.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from app.compiled.admission_policy import ACTIONS, CHUNKS, COMPILER, POLICY, binding, policy
from app.compiled.registration import COMPILED_ENTRY, CONDITION
from app.engine.context import Options
from app.engine.kinds import snapshot_from_objects
from app.engine.model import Resource
from app.engine.params import MARK, ClusterPart, Target, render, render_cluster
from app.settings import Settings
from bench.core.kube import (
    Client,
    Webhook,
    compiler_idle,
    documents,
    kustomize,
    profiling,
    start_compiler,
    webhook_configuration,
)
from bench.core.layout import CLUSTER_RESOURCES, cluster_grant, cluster_role
from bench.core.processes import process_cpu
from bench.core.tenants import TENANT, build
from tests.kube.controlplane import ADMIN, COMPILER_USER, WEBHOOK_USER, ControlPlane, User
from tests.process import free_port, stop

NS = "t1"
ALICE = User("alice", ("tenants",))
# ``--writer cluster``: a tenant granted only by a restricted ClusterRole bound cluster-wide.
CAROL = User("carol", ("tenants",))
WRITERS = {"namespace": ALICE, "cluster": CAROL}
SETUPS = ("none", "trivial", "rule", "compiled", "webhook", "full")
# Always measured: the baselines every other setup is compared with.
BASELINES = ("none", "trivial", "rule")
MODES = ("modes", "full-modes")
# Not measured unless asked for (``--setups``): the compiled policy with its validations replaced
# by one expression reading some of its variables, which CEL evaluates lazily, once per request:
# what its parameters' plumbing costs (paramKind, paramRef, matchConditions) without the rule
# (``params``), and what each part of the rule adds.
PARTS = {
    "params": "true",
    "granting": "variables.granting.size() >= 0",
    "unlisted": "!variables.unlisted",
    "denied": "!variables.denied",
}
EXTRA = (*PARTS, "split", *MODES)
# The setups that register the split webhook configuration, and those the compiler's mark and
# conditions are waited for.
SPLIT = ("split", "full", "full-modes")
# The setups a write of a forbidden label is refused under.
REFUSING = ("rule", "compiled", "webhook", "denied", "file", *MODES, "full")
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


def rule(writer: str) -> list[dict[str, Any]]:
    """``rule``: the same rule written by hand for ``writer`` alone, one expression and no
    parameters: what the compiled path is held to (its CPU added over ``none``,
    ``cpu_vs_rule``)."""
    docs = copy.deepcopy(TRIVIAL)
    docs[0]["metadata"]["name"] = docs[1]["metadata"]["name"] = "bench-rule"
    docs[1]["spec"]["policyName"] = "bench-rule"
    docs[0]["spec"]["validations"] = [
        {
            "expression": f"request.userInfo.username != '{writer}' || "
            "request.operation == 'DELETE' || object.metadata.?labels[?'team'].orValue('') == 'a'",
            "reason": "Forbidden",
        }
    ]
    return docs


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


# ``--glob-shape``: globs only a regular expression tests, or the everyday prefix ``team-*``.
SHAPES = {"general": "e{i}?x*", "prefix": "e{i}-*"}


def glob_values(
    count: int, keys: int, shape: str = "general"
) -> tuple[dict[str, list[str]], dict[str, str]]:
    """``count`` globs over ``keys`` label keys (``--globs``), and labels only each key's last
    glob matches."""
    per_key = -(-count // keys)
    pattern = SHAPES[shape]
    globs = {f"env{k}": [pattern.format(i=i) for i in range(per_key)] for k in range(keys)}
    last = pattern.format(i=per_key - 1).replace("?", "a").replace("*", "xy")
    return globs, {key: last for key in globs}


def glob_role(count: int, keys: int, shape: str) -> dict[str, Any]:
    found = role("globs", "")
    found["metadata"]["annotations"]["labelrbac.io/permissions"] = json.dumps(
        {"configmaps": glob_values(count, keys, shape)[0]}
    )
    return found


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


# ``compiled``: the name the enforcing policy and its binding take when the benchmark writes them,
# apart from the compiler's own (``full``), which it never touches.
COMPILED = "bench-compiled"


# ``--writer cluster``: carol's grant, bound after every ``bench-cluster-*`` (binding-name order),
# so the policy finds it in the last of its constants.
WRITER_GRANT = cluster_role("bench-writer", {"team": ["a"]}, CAROL.name)


def compiled_policies(part: ClusterPart, names: tuple[str, ...] = (POLICY,)) -> list[Any]:
    """The policies ``names`` as the compiler writes them, holding the cluster ``part``, and their
    bindings, renamed (``COMPILED``: the enforcing one) apart from the compiler's own, with
    manifests/compiled/policy.yaml's guards."""
    docs: list[Any] = []
    for name in names:
        renamed = COMPILED + name.removeprefix(POLICY)
        found, bound = policy(name, part), binding(name)
        found["metadata"]["name"] = bound["metadata"]["name"] = renamed
        bound["spec"]["policyName"] = renamed
        docs += [found, bound]
    shipped = documents("policy.yaml")
    return docs + [d for d in shipped if d["metadata"]["name"] not in ACTIONS]


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


def drop_cluster_grants(cp: ControlPlane, kept: int) -> None:
    """Delete the ``cluster_grant`` objects past the first ``kept`` (a size after a larger one):
    an unbound ClusterRole's annotation still adds its resources to every namespace's index."""
    paths = [
        f"{RBAC_API}/{plural}/{item['metadata']['name']}"
        for plural in ("clusterrolebindings", "clusterroles")
        for item in ok(cp, ADMIN, "GET", f"{RBAC_API}/{plural}")["items"]
        if re.fullmatch(r"bench-cluster-\d+", item["metadata"]["name"])
        and int(item["metadata"]["name"].rsplit("-", 1)[1]) >= kept
    ]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda path: ok(cp, ADMIN, "DELETE", path), paths))


def write_params(cp: ControlPlane, served: tuple[str, ...] = ("configmaps",)) -> Written:
    """Compile every namespace but the tenants as the compiler does and write its parameters as
    the compiler; the measured namespace's bytes, and the ClusterRoleBindings' part the policy
    holds."""
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
    target = Target.of([Resource("", r) for r in served], Options())
    cluster = render_cluster(snapshot, target)
    if cluster.delegated is not None:
        raise RuntimeError(f"every namespace left to the webhook: {cluster.delegated}")
    size = 0
    for namespace in sorted(snapshot.namespaces):
        if namespace.startswith(TENANT):
            continue  # ``--namespaces``: written by the running compiler
        rendered = render(snapshot, namespace, target)
        apply_params(cp, rendered.manifest())
        if namespace == NS:
            size = rendered.size
    return Written(size, cluster)


@dataclass(frozen=True)
class Written:
    """What ``write_params`` wrote: the measured namespace's parameters' bytes, and the
    ClusterRoleBindings' part the policy holds (``chunks``, of ``size`` code points)."""

    size: int
    cluster: ClusterPart


def apply_params(cp: ControlPlane, manifest: dict[str, Any]) -> None:
    """Server-side apply ``manifest`` as the compiler."""
    body = yaml.safe_dump(manifest)
    done = cp.kubectl(COMPILER, "apply", "--server-side", "--force-conflicts",
                      "--field-manager=label-rbac-compiler", "-f", "-", input=body)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"apply {manifest['metadata']}: {done.stderr}")


def part_of_policy(expression: str, part: ClusterPart) -> list[dict[str, Any]]:
    """``compiled``, its validations the one ``expression`` and no match condition."""
    docs = compiled_policies(part)
    docs[0]["spec"]["validations"] = [{"expression": expression, "reason": "Forbidden"}]
    docs[0]["spec"].pop("matchConditions", None)
    return docs


POLICIES = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"


def clear(cp: ControlPlane) -> None:
    """No admission of ours: no policy bound, no webhook registered. The policies the compiler
    writes and keeps (``ACTIONS``) stay, unbound: the API server evaluates a policy only
    through a binding."""
    cp.kubectl(ADMIN, "delete", "validatingadmissionpolicybindings", "--all", "--wait=true")
    names = [p["metadata"]["name"] for p in ok(cp, ADMIN, "GET", POLICIES)["items"]]
    unkept = [name for name in names if name not in ACTIONS]
    if unkept:
        cp.kubectl(ADMIN, "delete", "validatingadmissionpolicies", *unkept, "--wait=true")
    cp.kubectl(ADMIN, "delete", "validatingwebhookconfigurations", "--all", "--wait=true")


@functools.cache
def shipped_policies() -> list[dict[str, Any]]:
    """The ValidatingAdmissionPolicies and bindings ``manifests/enforce-compiled`` installs (the
    compiler writes the policies reading the parameters)."""
    kinds = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
    return [d for d in kustomize("enforce-compiled") if d["kind"] in kinds]


def compilers_constants(cp: ControlPlane, timeout: float = 120) -> tuple[str, ...]:
    """The constants of the enforcing policy the running compiler wrote, once it holds
    ``CHUNKS``."""
    deadline = time.monotonic() + timeout
    while True:
        status, found = cp.request(ADMIN, "GET", f"{POLICIES}/{POLICY}")
        if status == 200:
            variables = found["spec"].get("variables", [])
            if any(v["name"] == CHUNKS for v in variables):
                return tuple(v["expression"] for v in variables
                             if re.fullmatch(r"cluster\d+", v["name"]))  # fmt: skip
        if time.monotonic() > deadline:
            raise RuntimeError(f"the compiler wrote no policy {POLICY} in time: {status}")
        time.sleep(1)


def installed_registration(cp: ControlPlane, webhook: Webhook, timeout: float = 120) -> Any:
    """The split registration (``manifests/enforce-compiled``'s) as the running compiler keeps
    it: registered, then read back once the compiler has written its conditions and marked the
    namespace compiled (which it does once the policy it writes is bound and refuses its
    probe: the shipped install's policies are applied meanwhile)."""
    config = webhook_configuration(kustomize("enforce-compiled"), webhook.server.base_url,
                                   webhook.tls.ca.read_bytes())  # fmt: skip
    cp.apply(ADMIN, [config, *shipped_policies()])
    name = config["metadata"]["name"]
    path = f"/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/{name}"
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        live = ok(cp, ADMIN, "GET", path)
        namespace = ok(cp, ADMIN, "GET", f"/api/v1/namespaces/{NS}")
        marked = namespace["metadata"].get("labels", {}).get(MARK) == "true"
        if marked and any(c["name"] == CONDITION for c in conditions(live)):
            live["metadata"] = {"name": name}
            return live
        time.sleep(1)
    raise RuntimeError("the compiler did not write its conditions or mark in time")


def all_marked(cp: ControlPlane, names: set[str], started: float, timeout: float) -> float:
    """Seconds from ``started`` until the Namespaces ``names`` are all marked compiled."""
    path = f"/api/v1/namespaces?labelSelector={MARK}%3Dtrue"
    while time.monotonic() - started < timeout:
        if names <= {n["metadata"]["name"] for n in ok(cp, ADMIN, "GET", path)["items"]}:
            return time.monotonic() - started
        time.sleep(2)
    raise RuntimeError(f"the compiler did not mark {len(names)} namespaces in {timeout:.0f} s")


def conditions(configuration: Any) -> list[Any]:
    """The match conditions of the registration's entry for compiled namespaces."""
    (entry,) = [w for w in configuration["webhooks"] if w["name"] == COMPILED_ENTRY]
    return list(entry.get("matchConditions", []))


@dataclass(frozen=True)
class Installed:
    """What the setups install beside the parameters: the webhook, the YAML of ``--policy``,
    the split registration as the compiler keeps it, the cluster part the policy holds
    (``compiled``), and the user writing."""

    webhook: Webhook
    other: str | None
    registration: Any
    part: ClusterPart
    writer: str


def configure(cp: ControlPlane, setup: str, installed: Installed) -> None:
    """Admit with exactly ``setup``; wait until the API server applies it: the writer's label
    is allowed, another refused where ``setup`` refuses it."""
    clear(cp)
    if setup == "trivial":
        cp.apply(ADMIN, TRIVIAL)
    elif setup == "rule":
        cp.apply(ADMIN, rule(installed.writer))
    elif setup == "compiled":
        cp.apply(ADMIN, compiled_policies(installed.part))
    elif setup in ("full", "full-modes"):
        compilers_constants(cp)
        modes = documents("modes/policy.yaml") if setup == "full-modes" else []
        cp.apply(ADMIN, shipped_policies() + modes)
    elif setup == "modes":
        cp.apply(ADMIN, compiled_policies(installed.part, tuple(ACTIONS)))
    elif setup in PARTS:
        cp.apply(ADMIN, part_of_policy(PARTS[setup], installed.part))
    elif setup == "file" and installed.other is not None:
        cp.apply(ADMIN, installed.other)
    elif setup == "webhook":
        cp.apply(ADMIN, [installed.webhook.config])
    if setup in SPLIT:
        cp.apply(ADMIN, [installed.registration])
    # The policy informer picks bindings up within a second or two, and compiles a policy's
    # expressions first: longer on a loaded machine.
    path = f"/api/v1/namespaces/{NS}/configmaps?dryRun=All"
    allowed = {"metadata": {"generateName": "p-", "labels": {"team": "a"}}}
    refused = {"metadata": {"generateName": "p-", "labels": {"team": "b"}}}
    deadline = time.monotonic() + 30
    while True:
        time.sleep(1)
        status, _ = cp.request(installed.writer, "POST", path, refused)
        if (status == 403) == (setup in REFUSING):
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"{setup}: the probe answered {status}")
    status, answer = cp.request(installed.writer, "POST", path, allowed)
    if status != 201:
        raise RuntimeError(f"{setup}: {installed.writer}'s own label answered {status} {answer}")
    time.sleep(2)  # every replica of the informer's view settled


def wrk(
    cp: ControlPlane,
    connections: int,
    seconds: int,
    script: Path,
    webhook: Webhook | None,
    profile: Path | None = None,
) -> dict[str, float]:
    """p50 ms, requests/s and CPU seconds per create (the API server's; the webhook's when
    given) of the script's POSTs; with ``profile``, the API server's CPU profile meanwhile."""
    url = f"{cp.url}/api/v1/namespaces/{NS}/configmaps"
    assert cp.apiserver is not None
    profiler = profiling(cp, max(1, seconds - 1), profile)
    server_cpu = process_cpu(cp.apiserver.pid)
    webhook_cpu = webhook.cpu() if webhook else 0.0
    out = subprocess.run(
        ["wrk", "-t", str(min(connections, 2)), "-c", str(connections), "-d", f"{seconds}s",
         "--latency", "-s", str(script), url],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    server_cpu = process_cpu(cp.apiserver.pid) - server_cpu
    webhook_cpu = webhook.cpu() - webhook_cpu if webhook else 0.0
    if profiler is not None and profiler.wait(timeout=30) != 0:
        raise RuntimeError(f"no profile written to {profile}")
    p50 = re.search(r"^\s+50%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
    rate = re.search(r"^Requests/sec:\s+([\d.]+)", out, re.M)
    total = re.search(r"^\s+(\d+) requests in", out, re.M)
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if p50 is None or rate is None or total is None:
        raise RuntimeError(f"cannot read wrk's output:\n{out}")
    if non2xx:
        raise RuntimeError(f"{non2xx.group(1)} creates failed:\n{out}")
    scale = {"us": 0.001, "ms": 1.0, "s": 1000.0}[p50.group(2)]
    # Keep etcd small. (A collection delete is admitted object by object: allow it time.)
    status, answer = cp.request(ADMIN, "DELETE", f"/api/v1/namespaces/{NS}/configmaps", timeout=300)
    if status >= 300:
        raise RuntimeError(f"deleting the configmaps: {status} {answer}")
    creates = max(1, int(total.group(1)))
    return {
        "p50_ms": float(p50.group(1)) * scale,
        "rps": float(rate.group(1)),
        "cpu_ms": 1000 * server_cpu / creates,
        "webhook_cpu_ms": 1000 * webhook_cpu / creates,
    }


def summarize(
    results: dict[tuple[str, int], list[dict[str, float]]],
    total: int,
    size: int,
    c: int,
    setups: list[str],
) -> list[dict[str, Any]]:
    """One row per setup: medians of the rounds, against ``none``, ``trivial`` and ``rule``."""

    def med(setup: str, key: str) -> float:
        return statistics.median(r[key] for r in results[(setup, c)])

    base_p50, base_rate = med("none", "p50_ms"), med("none", "rps")
    base_cpu = med("none", "cpu_ms")
    rule_cpu = med("rule", "cpu_ms") - base_cpu
    rows = []
    for setup in setups:
        p50, rate = med(setup, "p50_ms"), med(setup, "rps")
        added = p50 - base_p50
        trivial_added = med("trivial", "p50_ms") - base_p50
        rows.append({
            "bindings": total, "params_bytes": size, "connections": c, "setup": setup,
            "p50_ms": round(p50, 3), "rps": round(rate, 1),
            "added_p50_ms": round(added, 3),
            "throughput_ratio": round(rate / base_rate, 3),
            "rps_vs_rule": round(rate / med("rule", "rps"), 3),
            "cpu_ms_per_create": round(med(setup, "cpu_ms"), 4),
            "webhook_cpu_ms_per_create": round(med(setup, "webhook_cpu_ms"), 4),
            "cpu_vs_trivial": round(med(setup, "cpu_ms") / med("trivial", "cpu_ms"), 3),
            "added_cpu_ms": round(med(setup, "cpu_ms") - base_cpu, 4),
            "cpu_vs_rule": round((med(setup, "cpu_ms") - base_cpu) / rule_cpu, 2)
            if rule_cpu > 0 else None,
            "added_vs_trivial": round(added / trivial_added, 2) if trivial_added > 0 else None,
            "load_average": round(os.getloadavg()[0], 2),
        })  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bindings", default="10,5000")
    parser.add_argument("--connections", default="1,8")
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--setups",
        default=",".join(SETUPS),
        help=f"of {', '.join(SETUPS + EXTRA)}; {', '.join(BASELINES)} always",
    )
    parser.add_argument(
        "--policy",
        type=Path,
        help="another policy.yaml (an earlier release's, say), measured as setup file",
    )
    parser.add_argument(
        "--cluster-grants",
        help="numbers K of restricted ClusterRoles bound cluster-wide, measured in turn (0,50,200)",
    )
    parser.add_argument(
        "--writer",
        choices=sorted(WRITERS),
        default="namespace",
        help="who creates: alice, bound in the namespace, or carol, bound only cluster-wide",
    )
    parser.add_argument(
        "--namespaces",
        type=int,
        default=1,
        help="namespaces the cluster holds (t1 and N - 1 of bench layout's tenants), all compiled "
        "by the running compiler before the sizes are measured",
    )
    parser.add_argument("--globs", type=int, default=0, help="value globs of a role bound to alice")
    parser.add_argument("--glob-keys", type=int, default=1, help="label keys they are spread over")
    parser.add_argument("--glob-shape", choices=sorted(SHAPES), default="general")
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--profile",
        type=Path,
        help="a directory: the API server's CPU profile of each setup's first run, per size",
    )
    args = parser.parse_args(argv)
    if shutil.which("wrk") is None:
        print("python -m bench vap: wrk is not installed", file=sys.stderr)
        return 2
    asked = [name for name in args.setups.split(",") if name]
    unknown = set(asked) - set(SETUPS + EXTRA)
    if unknown:
        parser.error(f"unknown setups: {', '.join(sorted(unknown))}")
    if args.globs and args.writer != "namespace":
        parser.error("--globs binds its role in the namespace: to alice, --writer namespace")
    setups = [*BASELINES, *(name for name in asked if name not in BASELINES)]
    if args.namespaces > 1 and not set(SPLIT) & set(setups):
        parser.error("--namespaces: the running compiler writes their parameters; add full")
    other = None
    if args.policy is not None:
        other = args.policy.read_text()  # read once; kubectl parses it at each apply
        setups.append("file")
    writer = WRITERS[args.writer]
    workdir = Path(tempfile.mkdtemp(prefix="bench-vap-"))
    users = (User(ADMIN, ("system:masters",)), ALICE, CAROL, COMPILER_USER, WEBHOOK_USER)
    cp = ControlPlane(workdir, users=users)
    cp.start()
    webhook: Webhook | None = None
    compiler: subprocess.Popen[bytes] | None = None
    rows: list[dict[str, Any]] = []
    connections = [int(n) for n in args.connections.split(",")]
    try:
        script = workdir / "post.lua"
        lua = LUA
        if args.globs:
            body = copy.deepcopy(BODY)
            labels = glob_values(args.globs, args.glob_keys, args.glob_shape)[1]
            body["metadata"]["labels"].update(labels)
            lua = LUA.replace(json.dumps(BODY, separators=(",", ":")), json.dumps(body))
        script.write_text(lua.replace("TOKEN", cp.users[writer.name].token))
        for namespace in (NS, "label-rbac"):
            ok(cp, ADMIN, "POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
        cp.apply(ADMIN, documents("crd.yaml"))
        time.sleep(3)
        cp.apply(ADMIN, documents("rbac.yaml"))
        cp.apply(ADMIN, [role(f"team-{i}", str(i)) for i in range(10)] + [role("team-a", "a")])
        cp.apply(ADMIN, [role_binding("alice", "team-a", "alice")])
        if writer is CAROL:
            cp.apply(ADMIN, WRITER_GRANT)
        if args.globs:  # bound before team-a (binding-name order): tried first on every write
            cp.apply(ADMIN, [glob_role(args.globs, args.glob_keys, args.glob_shape)])
            cp.apply(ADMIN, [role_binding("0-globs", "globs", "alice")])
        if args.namespaces > 1:
            admin = Client(cp.url, cp.ca, cp.users[ADMIN].token)
            objects, seconds = build(admin, args.namespaces - 1, 0, 8)
            print(f"namespaces={args.namespaces}: {objects} objects in {seconds:.0f} s", flush=True)
        webhook = Webhook(cp, workdir, full_compiler=True)
        registration = None
        probes = free_port()
        if set(SPLIT) & set(setups):
            softened = ("--compile-softened",) if "full-modes" in setups else ()
            started = time.monotonic()
            compiler = start_compiler(cp, workdir, *softened, "--probe-bind", f"127.0.0.1:{probes}")
            # A namespace is marked once the policies are bound: t1 may come last of many.
            wait = 120 + args.namespaces / 20
            registration = installed_registration(cp, webhook, wait)
            if args.namespaces > 1:
                tenants = {f"{TENANT}{i}" for i in range(args.namespaces - 1)}
                seconds = all_marked(cp, {NS, *tenants}, started, wait)
                print(f"  the compiler marked every namespace after {seconds:.0f} s", flush=True)
        clustered = args.cluster_grants or writer is CAROL
        served = CLUSTER_RESOURCES if clustered else ("configmaps",)
        grants = [int(k) for k in (args.cluster_grants or "0").split(",")]
        sizes = [(int(n), k) for n in args.bindings.split(",") for k in grants]
        for total, k in sizes:
            clear(cp)
            grow_bindings(cp, total)
            if k:
                cp.apply(ADMIN, [o for i in range(k) for o in cluster_grant(i)])
            drop_cluster_grants(cp, k)
            written = write_params(cp, served)
            part = written.cluster
            print(f"bindings={total} cluster grants={k}: params {written.size} B per namespace, "
                  f"policy constants {part.size} code points in {len(part.chunks)}; load "
                  f"average {os.getloadavg()[0]:.2f}", flush=True)  # fmt: skip
            if compiler is not None:
                print(f"  the compiler's: {compared(cp, part.chunks)}", flush=True)
                # Measured with the compiler idle: a resource the new size restricts for the
                # first time has it write every namespace again.
                waited = compiler_idle(compiler, probes, 5, 600 + args.namespaces / 5)
                print(f"  the compiler was idle after {waited:.0f} s", flush=True)
            installed = Installed(webhook, other, registration, part, writer.name)
            results: dict[tuple[str, int], list[dict[str, float]]] = {}
            for n in range(args.rounds):
                # Every other round in reverse order, so that no setup always runs first.
                for setup in setups if n % 2 == 0 else setups[::-1]:
                    configure(cp, setup, installed)
                    for c in connections:
                        profile = None
                        if args.profile is not None and n == 0:
                            args.profile.mkdir(parents=True, exist_ok=True)
                            profile = args.profile / f"{setup}-{total}-c{c}.pprof"
                        run = wrk(cp, c, args.seconds, script, webhook, profile)
                        results.setdefault((setup, c), []).append(run)
            for c in connections:
                for row in summarize(results, total, written.size, c, setups):
                    row.update(cluster_grants=k, writer=writer.name, namespaces=args.namespaces,
                               constant_code_points=part.size, chunks=len(part.chunks))  # fmt: skip
                    rows.append(row)
                    extra = (f" + webhook {row['webhook_cpu_ms_per_create']:.2f}"
                             if row["setup"] in ("webhook", *SPLIT) else "")  # fmt: skip
                    print(
                        f"bindings={total:<5} K={k:<4} {writer.name} C={c}  "
                        f"{row['setup']:<8} "
                        f"p50 {row['p50_ms']:6.2f} ms (+{row['added_p50_ms']:5.2f})  "
                        f"{row['rps']:7.0f} req/s ({row['throughput_ratio']:.2f}x, "
                        f"{row['rps_vs_rule']:.2f}x rule's)  "
                        f"API server CPU/create {row['cpu_ms_per_create']:.3f} ms{extra} "
                        f"(+{row['added_cpu_ms']:.3f}: {row['cpu_vs_rule']}x rule's)",
                        flush=True,
                    )
    finally:
        if compiler is not None:
            stop(compiler)
        if webhook is not None:
            webhook.stop()
        cp.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


def compared(cp: ControlPlane, chunks: tuple[str, ...], timeout: float = 60) -> str:
    """Whether the running compiler's policy holds ``chunks`` (what ``compiled`` installs):
    waited for, since it writes the policy once it has seen the last ClusterRoleBinding."""
    deadline = time.monotonic() + timeout
    while (live := compilers_constants(cp)) != chunks and time.monotonic() < deadline:
        time.sleep(1)
    if live == chunks:
        return f"the same {len(live)} constants"
    return (
        f"{len(live)} constants of {sum(map(len, live))} code points, not these (its index "
        "differs: a resource restricted a moment ago stays indexed 10 minutes)"
    )


if __name__ == "__main__":
    sys.exit(main())
