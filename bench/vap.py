"""Tenant creates through a real kube-apiserver: the compiled policy, the webhook, no admission.

The compiled label rule is measured against no admission, a trivial ValidatingAdmissionPolicy,
the same rule written by hand as one expression and label-rbac's webhook, in the same run.

A loopback control plane (tests/kube/controlplane.py: etcd and kube-apiserver) holds a tenant,
alice, bound to a Role restricting configmaps to ``team=a``, and N RoleBindings in her namespace
(other users bound to ten label-restricted Roles). For each N, wrk POSTs ConfigMaps labeled
``team=a`` as alice (each a new object: ``generateName``) at each concurrency, under

- ``none``: no policy bound (RBAC only);
- ``trivial``: one policy matching the same writes, one constant expression (the floor of any
  policy);
- ``rule``: the same rule written by hand for alice alone, one expression and no parameters: the
  cost the compiled path is held to;
- ``compiled``: manifests/compiled/policy.yaml with the parameters ``label-rbac compile`` writes;
- ``params`` (only with ``--setups``): the compiled policy judging nothing (no match condition,
  its validation one constant expression), to tell its parameters' cost from its expressions';
  ``granting``, ``unlisted``, ``denied``: no match condition, its validation one expression
  reading only that variable (and what it depends on), to tell what each part costs;
- ``file`` (only with ``--policy FILE``): the policies of FILE (an earlier release's
  ``policy.yaml``, say) on the same parameters, to compare two shapes of the policy in one run;
- ``webhook``: label-rbac's ``/validate`` registered as ``manifests/enforce`` registers it (the
  ValidatingWebhookConfiguration pointed at loopback, as tests/kube/cluster.py installs it),
  served by the real ``python -m app serve`` process watching this API server;
- ``full``: ``manifests/enforce-compiled`` as shipped: its policies and the split registration
  (``manifests/compiled/split``) with the conditions the compiler keeps in it, the compiler
  (``python -m app compile``, which also marks the namespace compiled) and the webhook running;
- its parts and options (only with ``--setups``): ``split``, that registration alone (no
  policy); ``modes``, the policy and the warn and audit policies of the optional
  ``manifests/compiled/modes``, without the split; ``full-modes``, the shipped install with that
  component added.

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
own label values) bound cluster-wide, each to a user of its own, and measures each size: the
compiled policy (``compiled``) then reads them copied into the namespace's parameters, as
shipped. ``constant`` (only with ``--setups``) is the layout that stores each grant once: the
namespace's parameters (``label-rbac-own``) hold only its own RoleBindings' part, and the
cluster-wide part (subjects, roles, grants) is one CEL constant in the policy's variables,
which every judged write reads (match conditions cannot read variables: the one that decides
whether a write may be refused binds the constant again for itself): what such a constant
costs each write as K grows. ``literal`` and ``flat-literal`` are the trivial policy reading that
constant on every write, as ``constant`` writes it (every value ``dyn``: the API server's CEL
refuses a literal mixing types) or flattened to one map of strings to lists of strings: whether
the API server builds the constant again on every call (it does not). The API server refuses
an expression of more than 100,000 code points, so the constant holds about 170 of these grants
at most (the run stops there).

``--globs N`` binds alice to one more Role, first in binding order, restricting configmaps by N
value globs spread over ``--glob-keys`` label keys (``--glob-shape general``: none a literal, a
prefix or a suffix, the shape the policy can only test with a regular expression; ``prefix``:
``e7-*``), and every create carries those labels
with values only each key's last glob matches: the policy (and the webhook) try every glob of
that role on every write before the next role permits it. It is what a role another tenant
writes and binds to alice costs her writes.

    python -m bench vap --bindings 10,5000 --connections 1,8 --seconds 5 --rounds 5
    python -m bench vap --bindings 10 --setups compiled,constant --cluster-grants 0,50,100

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

from app.compiled.admission_policy import COMPILER, _bind
from app.compiled.registration import COMPILED_ENTRY, CONDITION
from app.engine.context import Options
from app.engine.kinds import snapshot_from_objects
from app.engine.model import Resource
from app.engine.params import MARK, Target, render, spec_text
from app.settings import Settings
from bench.core.kube import Webhook, documents, kustomize, start_compiler, webhook_configuration
from bench.core.processes import process_cpu
from tests.kube.controlplane import ADMIN, COMPILER_USER, WEBHOOK_USER, ControlPlane, User
from tests.process import stop

NS = "t1"
ALICE = User("alice", ("tenants",))
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
# ``--cluster-grants``: the trivial policy reading the cluster-wide part as one constant, as the
# ``constant`` setup writes it (every value ``dyn``) or flattened to strings only (one type).
LITERALS = ("literal", "flat-literal")
EXTRA = (*PARTS, "split", *MODES, "constant", *LITERALS)
# The setups that register the split webhook configuration, and those the compiler's mark and
# conditions are waited for.
SPLIT = ("split", "full", "full-modes")
# The setups a write of a forbidden label is refused under.
REFUSING = ("rule", "compiled", "webhook", "denied", "file", *MODES, "full", "constant")
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

# ``rule``: the same rule written by hand for alice alone, one expression and no parameters: what
# the compiled path is held to (its CPU added over ``none``, ``cpu_vs_rule``).
RULE = copy.deepcopy(TRIVIAL)
RULE[0]["metadata"]["name"] = RULE[1]["metadata"]["name"] = RULE[1]["spec"]["policyName"] = (
    "bench-rule"
)
RULE[0]["spec"]["validations"] = [
    {
        "expression": "request.userInfo.username != 'alice' || request.operation == 'DELETE'"
        " || object.metadata.?labels[?'team'].orValue('') == 'a'",
        "reason": "Forbidden",
    }
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


# ``--cluster-grants``: the resources each ClusterRole restricts (and the API server serves).
CLUSTER_RESOURCES = ("configmaps", "secrets", "services", "endpoints", "persistentvolumeclaims",
                     "limitranges", "resourcequotas")  # fmt: skip
# ``constant``: the parameters of the namespace's own part, beside the shipped ones.
OWN = "label-rbac-own"


def cluster_grant(index: int) -> list[dict[str, Any]]:
    """A ClusterRole restricting CLUSTER_RESOURCES by label values of its own, bound
    cluster-wide to a user of its own."""
    name = f"bench-cluster-{index}"
    # One label rule for all seven: one grant, as a role restricting a set of resources alike.
    permissions = {r: {"team": [f"c{index}"], "tier": [f"t{index}-*"]} for r in CLUSTER_RESOURCES}
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": name,
                         "annotations": {"labelrbac.io/permissions": json.dumps(permissions)}},
            "rules": [{"apiGroups": [""], "resources": list(CLUSTER_RESOURCES), "verbs": ["*"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": name},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                          "name": f"cluster-user-{index}"}],
        },
    ]  # fmt: skip


def split_cluster_part(spec: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``spec`` as (the namespace's own part, the cluster-wide part): the ClusterRoleBindings'
    subjects and the roles and grants only they refer to."""
    cluster_roles = {i for key in ("clusterUsers", "clusterGroups")
                     for ids in spec[key].values() for i in ids}  # fmt: skip
    own_roles = {i for key in ("users", "groups") for ids in spec[key].values() for i in ids}
    roles = cluster_roles - own_roles

    def grants_of(ids: set[str]) -> set[str]:
        return {g for i in ids for ops in spec["roles"][i].values() for g in ops.values()}

    grants = grants_of(roles) - grants_of(own_roles)
    cluster = {
        "clusterUsers": spec["clusterUsers"],
        "clusterGroups": spec["clusterGroups"],
        "roles": {i: spec["roles"][i] for i in sorted(roles)},
        "grants": {g: spec["grants"][g] for g in sorted(grants)},
    }
    own = {**spec, "clusterUsers": {}, "clusterGroups": {},
           "roles": {i: r for i, r in spec["roles"].items() if i not in roles},
           "grants": {g: v for g, v in spec["grants"].items() if g not in grants}}  # fmt: skip
    return own, cluster


def cel_literal(value: Any) -> str:
    """``value`` (JSON) as a CEL literal: every map value and list element ``dyn``, since the
    API server's CEL refuses a literal mixing types (a grant's strings, lists and booleans)."""
    if isinstance(value, dict):
        items = ",".join(f"{json.dumps(k)}:dyn({cel_literal(v)})" for k, v in value.items())
        return "{" + items + "}"
    if isinstance(value, list):
        return "[" + ",".join(f"dyn({cel_literal(v)})" for v in value) + "]"
    return json.dumps(value)


def either_part(expression: str, cluster: str) -> str:
    """``expression`` reading a role or grant id that ``params`` lacks from ``cluster`` (a CEL
    map of the cluster-wide part), and the subjects of ClusterRoleBindings only from there."""
    for key in ("clusterUsers", "clusterGroups"):
        expression = expression.replace(f"params.spec.?{key}", f"{cluster}.?{key}")
    for field in ("roles", "grants"):
        found, at = [], 0
        lookup = f"params.spec.{field}["
        while (start := expression.find(lookup, at)) >= 0:
            found.append(expression[at:start])
            depth, end = 1, start + len(lookup)
            while depth:  # the lookup's closing bracket
                depth += {"[": 1, "]": -1}.get(expression[end], 0)
                end += 1
            key = either_part(expression[start + len(lookup) : end - 1], cluster)
            bare = key.removeprefix("?")
            either = f"(({bare}) in params.spec.{field} ? params.spec.{field} : {cluster}.{field})"
            found.append(f"{either}[{key}]")
            at = end
        expression = "".join(found) + expression[at:]
    return expression


def flat(value: Any, path: str = "") -> dict[str, list[str]]:
    """``value`` (JSON) as one map of strings to lists of strings: its leaves by path."""
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in flat(item, f"{path}/{key}").items()}
    if isinstance(value, list):
        return {k: v for i, item in enumerate(value) for k, v in flat(item, f"{path}/{i}").items()}
    return {path: [json.dumps(value)]}


def literal_policy(literal: str) -> list[dict[str, Any]]:
    """The trivial policy, its validation reading ``literal`` (a map) on every write."""
    docs = copy.deepcopy(TRIVIAL)
    docs[0]["spec"]["variables"] = [{"name": "cluster", "expression": literal}]
    docs[0]["spec"]["validations"] = [
        {"expression": "!(request.userInfo.username in variables.cluster)"}
    ]
    return docs


def constant_policy(cluster: dict[str, Any]) -> list[dict[str, Any]]:
    """The compiled policy reading the cluster-wide part from one constant of its variables
    and the namespace's own part from ``OWN``. Match conditions cannot read variables: each
    binds the constant for itself."""
    docs = documents("policy.yaml")
    literal = cel_literal(cluster)
    for doc in docs:
        if doc["kind"] == "ValidatingAdmissionPolicy" and doc["metadata"]["name"] == "label-rbac":
            for condition in doc["spec"].get("matchConditions", []):
                changed = either_part(condition["expression"], "lrc")
                if changed != condition["expression"]:
                    condition["expression"] = _bind("lrc", literal, changed)
            for part in doc["spec"]["variables"] + doc["spec"]["validations"]:
                for field in ("expression", "messageExpression"):
                    if field in part:
                        part[field] = either_part(part[field], "variables.cluster")
            doc["spec"]["variables"].insert(0, {"name": "cluster", "expression": literal})
        if (
            doc["kind"] == "ValidatingAdmissionPolicyBinding"
            and doc["spec"]["policyName"] == "label-rbac"
        ):
            doc["spec"]["paramRef"]["name"] = OWN
    return docs


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


def write_params(cp: ControlPlane, served: tuple[str, ...] = ("configmaps",)) -> Written:
    """Compile the namespace as the compiler does and write it as the compiler, and its own
    part apart (``OWN``); its bytes, and the cluster-wide part."""
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
    written = Written(0, 0, {})
    for namespace in sorted(snapshot.namespaces):
        rendered = render(snapshot, namespace, target)
        if namespace != NS:
            apply_params(cp, rendered.manifest())
            continue
        own, cluster = split_cluster_part(dict(rendered.spec))
        apply_params(cp, rendered.manifest())
        apply_params(cp, {**rendered.manifest(), "spec": own,
                          "metadata": {"name": OWN, "namespace": NS}})  # fmt: skip
        written = Written(rendered.size, len(spec_text(own).encode()), cluster)
    return written


@dataclass(frozen=True)
class Written:
    """What ``write_params`` wrote in the measured namespace: the parameters' bytes as shipped,
    the bytes of its own part alone, and the cluster-wide part."""

    size: int
    own_size: int
    cluster: dict[str, Any]


def apply_params(cp: ControlPlane, manifest: dict[str, Any]) -> None:
    """Server-side apply ``manifest`` as the compiler."""
    body = yaml.safe_dump(manifest)
    done = cp.kubectl(COMPILER, "apply", "--server-side", "--force-conflicts",
                      "--field-manager=label-rbac-compiler", "-f", "-", input=body)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"apply {manifest['metadata']}: {done.stderr}")


def part_of_policy(expression: str) -> list[dict[str, Any]]:
    """The compiled policy and its bindings, its validations the one ``expression`` and no
    match condition."""
    docs = documents("policy.yaml")
    for doc in docs:
        if doc["kind"] == "ValidatingAdmissionPolicy" and doc["metadata"]["name"] == "label-rbac":
            doc["spec"]["validations"] = [{"expression": expression, "reason": "Forbidden"}]
            doc["spec"].pop("matchConditions", None)
    return docs


def clear(cp: ControlPlane) -> None:
    """No admission of ours: no policies, no webhook registered."""
    for kind in ("validatingadmissionpolicybindings", "validatingadmissionpolicies"):
        cp.kubectl(ADMIN, "delete", kind, "--all", "--wait=true")
    cp.kubectl(ADMIN, "delete", "validatingwebhookconfigurations", "--all", "--wait=true")


@functools.cache
def shipped_policies() -> list[dict[str, Any]]:
    """The ValidatingAdmissionPolicies and bindings ``manifests/enforce-compiled`` installs."""
    kinds = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
    return [d for d in kustomize("enforce-compiled") if d["kind"] in kinds]


def installed_registration(cp: ControlPlane, webhook: Webhook, timeout: float = 120) -> Any:
    """The split registration (``manifests/enforce-compiled``'s) as the running compiler keeps
    it: registered, then read back once the compiler has written its conditions and marked the
    namespace compiled."""
    config = webhook_configuration(kustomize("enforce-compiled"), webhook.server.base_url,
                                   webhook.tls.ca.read_bytes())  # fmt: skip
    cp.apply(ADMIN, [config])
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


def conditions(configuration: Any) -> list[Any]:
    """The match conditions of the registration's entry for compiled namespaces."""
    (entry,) = [w for w in configuration["webhooks"] if w["name"] == COMPILED_ENTRY]
    return list(entry.get("matchConditions", []))


def configure(
    cp: ControlPlane,
    setup: str,
    webhook: Webhook,
    other: str | None = None,
    registration: Any = None,
    cluster: dict[str, Any] | None = None,
) -> None:
    """Admit with exactly ``setup`` (``file``: the YAML ``other``; ``registration``: the split
    registration as the compiler keeps it; ``cluster``: the constant of ``constant``); wait until
    the API server applies it."""
    clear(cp)
    if setup == "trivial":
        cp.apply(ADMIN, TRIVIAL)
    elif setup == "rule":
        cp.apply(ADMIN, RULE)
    elif setup == "compiled":
        cp.apply(ADMIN, documents("policy.yaml"))
    elif setup == "full":
        cp.apply(ADMIN, shipped_policies())
    elif setup in MODES:
        cp.apply(ADMIN, shipped_policies() + documents("modes/policy.yaml"))
    elif setup in PARTS:
        cp.apply(ADMIN, part_of_policy(PARTS[setup]))
    elif setup == "constant":
        cp.apply(ADMIN, constant_policy(cluster or {}))
    elif setup == "literal":
        cp.apply(ADMIN, literal_policy(cel_literal(cluster or {})))
    elif setup == "flat-literal":
        cp.apply(ADMIN, literal_policy(json.dumps(flat(cluster or {}))))
    elif setup == "file" and other is not None:
        cp.apply(ADMIN, other)
    elif setup == "webhook":
        cp.apply(ADMIN, [webhook.config])
    if setup in SPLIT:
        cp.apply(ADMIN, [registration])
    # The policy informer picks bindings up within a second or two, and compiles a policy's
    # expressions first: longer on a loaded machine.
    probe = {"metadata": {"generateName": "p-", "labels": {"team": "b"}}}
    deadline = time.monotonic() + 30
    while True:
        time.sleep(1)
        path = f"/api/v1/namespaces/{NS}/configmaps?dryRun=All"
        status, _ = cp.request("alice", "POST", path, probe)
        if (status == 403) == (setup in REFUSING):
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"{setup}: the probe answered {status}")
    time.sleep(2)  # every replica of the informer's view settled


def profiling(cp: ControlPlane, seconds: int, into: Path | None) -> subprocess.Popen[bytes] | None:
    """The API server's CPU profile over the next ``seconds`` (``--profile``), written to
    ``into`` (read it with ``go tool pprof -top``), as a running curl; None without ``into``."""
    if into is None:
        return None
    url = f"{cp.url}/debug/pprof/profile?seconds={seconds}"
    token = cp.users[ADMIN].token
    return subprocess.Popen(
        ["curl", "-sf", "--cacert", str(cp.ca), "-H", f"Authorization: Bearer {token}",
         "-o", str(into), url],
    )  # fmt: skip


def wrk(
    cp: ControlPlane,
    connections: int,
    seconds: int,
    script: Path,
    webhook: Webhook | None,
    profile: Path | None = None,
) -> dict[str, float]:
    """p50 ms, requests/s and CPU seconds per create (the API server's; the webhook's when
    given) of POSTs as alice; with ``profile``, the API server's CPU profile meanwhile."""
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
    """One row per setup: medians of the rounds, against ``none`` and ``trivial``."""

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
    setups = [*BASELINES, *(name for name in asked if name not in BASELINES)]
    other = None
    if args.policy is not None:
        other = args.policy.read_text()  # read once; kubectl parses it at each apply
        setups.append("file")
    workdir = Path(tempfile.mkdtemp(prefix="bench-vap-"))
    users = (User(ADMIN, ("system:masters",)), ALICE, COMPILER_USER, WEBHOOK_USER)
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
        script.write_text(lua.replace("TOKEN", cp.users["alice"].token))
        for namespace in (NS, "label-rbac"):
            ok(cp, ADMIN, "POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
        cp.apply(ADMIN, documents("crd.yaml"))
        time.sleep(3)
        cp.apply(ADMIN, documents("rbac.yaml"))
        cp.apply(ADMIN, [role(f"team-{i}", str(i)) for i in range(10)] + [role("team-a", "a")])
        cp.apply(ADMIN, [role_binding("alice", "team-a", "alice")])
        if args.globs:  # bound before team-a (binding-name order): tried first on every write
            cp.apply(ADMIN, [glob_role(args.globs, args.glob_keys, args.glob_shape)])
            cp.apply(ADMIN, [role_binding("0-globs", "globs", "alice")])
        webhook = Webhook(cp, workdir, full_compiler=True)
        registration = None
        if set(SPLIT) & set(setups):
            compiler = start_compiler(cp, workdir)
            registration = installed_registration(cp, webhook)
        served = CLUSTER_RESOURCES if args.cluster_grants else ("configmaps",)
        grants = [int(k) for k in (args.cluster_grants or "0").split(",")]
        sizes = [(int(n), k) for n in args.bindings.split(",") for k in grants]
        for total, k in sizes:
            clear(cp)
            grow_bindings(cp, total)
            if k:
                cp.apply(ADMIN, [o for i in range(k) for o in cluster_grant(i)])
            for i in range(k, max(grants)):  # fewer than the size before: unbind the rest
                cp.kubectl(ADMIN, "delete", "clusterrolebinding", f"bench-cluster-{i}",
                           "--ignore-not-found")  # fmt: skip
            written = write_params(cp, served)
            size = written.size
            constant = len(json.dumps(written.cluster, separators=(",", ":")))
            print(f"bindings={total} cluster grants={k}: params {size} B, own part "
                  f"{written.own_size} B, cluster part {constant} B; load average "
                  f"{os.getloadavg()[0]:.2f}", flush=True)  # fmt: skip
            results: dict[tuple[str, int], list[dict[str, float]]] = {}
            for n in range(args.rounds):
                # Every other round in reverse order, so that no setup always runs first.
                for setup in setups if n % 2 == 0 else setups[::-1]:
                    configure(cp, setup, webhook, other, registration, written.cluster)
                    for c in connections:
                        profile = None
                        if args.profile is not None and n == 0:
                            args.profile.mkdir(parents=True, exist_ok=True)
                            profile = args.profile / f"{setup}-{total}-c{c}.pprof"
                        run = wrk(cp, c, args.seconds, script, webhook, profile)
                        results.setdefault((setup, c), []).append(run)
            for c in connections:
                for row in summarize(results, total, size, c, setups):
                    row.update(cluster_grants=k, own_params_bytes=written.own_size,
                               constant_bytes=constant)  # fmt: skip
                    rows.append(row)
                    extra = (f" + webhook {row['webhook_cpu_ms_per_create']:.2f}"
                             if row["setup"] in ("webhook", *SPLIT) else "")  # fmt: skip
                    print(
                        f"bindings={total:<5} K={k:<4} params={size:>8} B  C={c}  "
                        f"{row['setup']:<8} "
                        f"p50 {row['p50_ms']:6.2f} ms (+{row['added_p50_ms']:5.2f})  "
                        f"{row['rps']:7.0f} req/s ({row['throughput_ratio']:.2f}x)  "
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


if __name__ == "__main__":
    sys.exit(main())
