"""The compiled policies and their manifests: the policies as the compiler writes them
(``policy``), wired to the parameter kind and covering what the compiler compiles and nothing the
webhook keeps; the shipped files generated from the code, binding each policy no wider than it
matches, and shipping none of the policies the compiler writes."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml

from app.compiled.admission_policy import (
    ACTIONS,
    COMPILED_ENTRY,
    COMPILER,
    GUARD,
    JUDGED,
    LABEL_ENTRY,
    MARKS,
    POLICY,
    PROBE_LABEL,
    PROBE_MESSAGE,
    SUBRESOURCE_GUARD,
    SUBRESOURCES,
    Install,
    compiled_rules,
    fast_allowed,
    manifests,
    mode_manifests,
    policy,
    render_yaml,
    shipped_webhook,
    subresource_policy,
    unjudged_of,
    webhook_patch,
)
from app.engine.model import ENFORCE
from app.engine.params import (
    API_VERSION,
    KIND,
    MARK,
    MAX_CHUNKS,
    NAME,
    PLURAL,
    SOFTENED_MARK,
    WEBHOOK_RESOURCES,
    ClusterPart,
    cel_literal,
    unjudged_literal,
)
from tests.support import ROOT

COMPILED = ROOT / "manifests" / "compiled"


def documents(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((COMPILED / name).read_text()) if d]


# The compiler's probe of the enforcing policy: its dry run carrying PROBE_LABEL.
PROBED = (
    f"request.userInfo.username == '{COMPILER}' && request.dryRun == true && "
    f"object.metadata.?labels[?'{PROBE_LABEL}'].orValue('') == 'true'"
)


def policies() -> list[dict[str, Any]]:
    """The policies the compiler writes, as it writes them without a ClusterRoleBinding."""
    return [policy(name) for name in ACTIONS]


def shipped() -> list[dict[str, Any]]:
    """What manifests/compiled and its modes component ship."""
    return documents("policy.yaml") + documents("modes/policy.yaml")


def every() -> list[dict[str, Any]]:
    """The policies the compiler writes, and every shipped policy and binding."""
    return policies() + shipped()


def test_the_shipped_policies_are_the_generated_ones() -> None:
    assert (COMPILED / "policy.yaml").read_text() == render_yaml()
    assert (COMPILED / "modes" / "policy.yaml").read_text() == render_yaml("--modes")
    assert (COMPILED / "split" / "webhook.yaml").read_text() == render_yaml("--webhook")
    assert documents("policy.yaml") == manifests()
    assert documents("modes/policy.yaml") == mode_manifests()


@pytest.mark.parametrize(
    "directory",
    [COMPILED, COMPILED / "modes", COMPILED / "split"],
    ids=["compiled", "modes", "split"],
)
def test_each_component_ships_every_file(directory: Path) -> None:
    (kustomization,) = yaml.safe_load_all((directory / "kustomization.yaml").read_text())
    assert kustomization["kind"] == "Component"
    files = {p.name for p in directory.glob("*.yaml")} - {"kustomization.yaml"}
    patches = {patch["path"] for patch in kustomization.get("patches", ()) if "path" in patch}
    assert set(kustomization.get("resources", ())) | patches == files


def test_the_crd_serves_the_kind_the_policies_read() -> None:
    (crd,) = documents("crd.yaml")
    group, version = API_VERSION.split("/")
    assert crd["spec"]["group"] == group
    assert crd["spec"]["names"]["kind"] == KIND
    assert crd["spec"]["names"]["plural"] == PLURAL
    assert crd["spec"]["scope"] == "Namespaced"
    assert [v["name"] for v in crd["spec"]["versions"] if v["served"]] == [version]
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    # One managed-fields entry per map of the index, however many subjects it holds.
    for field in ("users", "groups", "clusterUsers", "clusterGroups", "roles", "grants"):
        assert spec["properties"][field]["x-kubernetes-map-type"] == "atomic", field


def test_each_mode_has_its_policy_binding_and_action() -> None:
    """Each policy the compiler writes has its shipped binding, with the mode's action and the
    policy's own matchConstraints as matchResources: a policy rewritten (by the compiler, or
    whoever holds its rights) reaches nothing its binding does not select. The policies
    themselves are not shipped: the compiler writes them, with the ClusterRoleBindings' part."""
    bindings = {
        d["metadata"]["name"]: d
        for d in shipped()
        if d["kind"] == "ValidatingAdmissionPolicyBinding"
    }
    shipped_policies = {
        d["metadata"]["name"] for d in shipped() if d["kind"] == "ValidatingAdmissionPolicy"
    }
    assert shipped_policies.isdisjoint(ACTIONS)
    for name, (_, action) in ACTIONS.items():
        written = policy(name)
        assert written["metadata"]["name"] == name
        assert written["spec"]["paramKind"] == {"apiVersion": API_VERSION, "kind": KIND}
        assert written["spec"]["failurePolicy"] == "Fail"
        assert bindings[name]["spec"]["policyName"] == name
        assert bindings[name]["spec"]["validationActions"] == [action]
        assert bindings[name]["spec"]["matchResources"] == written["spec"]["matchConstraints"]
        # Without parameters the policies stand aside: a namespace being deleted loses them
        # (tests/kube/test_namespace_deletion.py), and the webhook judges one never compiled.
        assert bindings[name]["spec"]["paramRef"] == {
            "name": NAME,
            "parameterNotFoundAction": "Allow",
        }
    assert "paramRef" not in bindings[GUARD]["spec"]


@pytest.mark.parametrize("name", [pytest.param(name, id=name) for name in ACTIONS])
def test_a_write_the_policy_allows_ends_at_its_match_condition(name: str) -> None:
    """The condition spells out what the validation reads (the API server refuses variables in
    a match condition), tries the key lookups of ``fast_allowed`` first, reads ``granting``
    once per operation judged, and judges a kubelet as anyone (the node rules the webhook
    applies to what the policy judges, the compiled entry sends it too)."""
    written = policy(name)
    (condition,) = written["spec"]["matchConditions"]
    # (The enforcing policy's first validation refuses the compiler's probe alone.)
    validation = written["spec"]["validations"][-1]
    assert "variables." not in condition["expression"]
    assert "variables.denied" in validation["expression"]
    # Once for the write, once for the delete a change of owner references or finalizers
    # stands for.
    assert condition["expression"].count("].map(granting, ") == 2
    assert f"!({fast_allowed()}) && " in condition["expression"]
    assert "system:nodes" not in condition["expression"]


@pytest.mark.parametrize(
    "keys",
    [
        pytest.param((), id="none"),
        pytest.param(("secrets",), id="one"),
        pytest.param(("secrets", "widgets.example.com", 'odd"name\\'), id="escaped"),
    ],
)
def test_what_a_policy_lets_pass_is_read_back_as_written(keys: tuple[str, ...]) -> None:
    """``unjudged_of`` reads the constant ``policy`` writes from ``unjudged_literal``."""
    part = ClusterPart((), 0, False, unjudged=keys)
    assert unjudged_of(policy(POLICY, part)) == frozenset(keys)
    variable = {"name": "unjudged", "expression": unjudged_literal(keys)}
    assert unjudged_of({"spec": {"variables": [variable]}}) == frozenset(keys)


@pytest.mark.parametrize(
    "expression",
    [
        pytest.param('["secrets"]', id="a-list"),
        pytest.param("{1: true}", id="not-json"),
        pytest.param('{"secrets": true', id="cut-short"),
        pytest.param("7", id="a-number"),
        pytest.param(None, id="no-expression"),
    ],
)
def test_a_constant_not_written_as_a_map_of_resources_is_refused(expression: str | None) -> None:
    """Read back, anything but a map of resources raises, rather than letting pass what it
    happens to hold."""
    with pytest.raises(ValueError, match="not a map"):
        unjudged_of({"spec": {"variables": [{"name": "unjudged", "expression": expression}]}})


def test_a_policy_without_the_constant_lets_nothing_known_pass() -> None:
    """A policy of a release before 0.3.4 holds no constant: None, not an empty set."""
    assert unjudged_of({"spec": {"variables": [{"name": "other", "expression": "{}"}]}}) is None
    assert unjudged_of({}) is None


@pytest.mark.parametrize(
    ("constants", "copied"),
    [pytest.param(n, c, id=f"{n}-constants") for n, c in ((0, 0), (1, 1), (6, 6), (7, 5), (12, 0))],
)
def test_the_cluster_conditions_copy_constants_while_the_policy_keeps_its_size(
    constants: int, copied: int
) -> None:
    """The enforcing policy holds a match condition per constant of the cluster part, each with
    its constant again, while constants and copies stay within ``MAX_CHUNKS``: the policy never
    outgrows what it could hold before. The other policies have none."""
    chunks = tuple(cel_literal({"users": {f"user-{i}": ["0"]}}) for i in range(constants))
    part = ClusterPart(chunks, 0, False)
    enforcing = next(n for n, (mode, _) in ACTIONS.items() if mode == "enforce")
    conditions = policy(enforcing, part)["spec"]["matchConditions"]
    assert conditions[0]["name"] == "may-refuse"
    assert [c["name"] for c in conditions[1:]] == [f"cluster-{i}" for i in range(copied)]
    for condition, chunk in zip(conditions[1:], chunks, strict=False):
        assert chunk in condition["expression"]
    assert constants + copied <= MAX_CHUNKS
    for name in ACTIONS:
        if name != enforcing:
            assert len(policy(name, part)["spec"]["matchConditions"]) == 1


def test_the_policies_leave_what_the_webhook_keeps_and_the_parameters_themselves() -> None:
    """Each policy leaves out what the webhook keeps, and the parameters' group: the enforcing
    one matches that group only for the compiler's probe, which it alone refuses."""
    group = API_VERSION.split("/")[0]
    for name in ACTIONS:
        written = policy(name)
        excluded = {
            (g, r)
            for rule in written["spec"]["matchConstraints"]["excludeResourceRules"]
            for g in rule["apiGroups"]
            for r in rule["resources"]
        }
        own = {(group, "*")} if name != POLICY else set()
        assert excluded == {*WEBHOOK_RESOURCES, *own}
        if name == POLICY:
            (condition,) = written["spec"]["matchConditions"]
            own_group = f"request.resource.group == '{group}'"
            assert condition["expression"].startswith(f"{own_group} ? {PROBED} : ")
            probe, judged = written["spec"]["validations"]
            assert probe == {"expression": f"!({PROBED})", "message": PROBE_MESSAGE,
                             "reason": "Forbidden"}  # fmt: skip
            assert judged["expression"].startswith(f"{own_group} || ")
        (matched,) = written["spec"]["matchConstraints"]["resourceRules"]
        assert matched["scope"] == "Namespaced" and matched["resources"] == ["*"]


TERMINATING = {"metadata": {"name": "t1", "deletionTimestamp": "2026-01-01T00:00:00Z"}}
ACTIVE = {"metadata": {"name": "t1"}}
CLEANER = "system:serviceaccount:kube-system:namespace-controller"


@pytest.mark.parametrize(
    ("user", "operation", "namespace", "passes"),
    [
        pytest.param(COMPILER, "CREATE", ACTIVE, True, id="compiler-writes"),
        pytest.param(COMPILER, "DELETE", ACTIVE, True, id="compiler-deletes"),
        pytest.param("admin", "UPDATE", ACTIVE, False, id="admin-refused"),
        pytest.param("admin", "DELETE", TERMINATING, False, id="admin-delete-terminating"),
        pytest.param(CLEANER, "DELETE", TERMINATING, True, id="cleaner-deletes-terminating"),
        pytest.param(
            "system:kube-controller-manager", "DELETE", TERMINATING, True, id="kcm-deletes"
        ),
        pytest.param(CLEANER, "DELETE", ACTIVE, False, id="cleaner-delete-active-refused"),
        pytest.param(CLEANER, "UPDATE", TERMINATING, False, id="cleaner-update-refused"),
    ],
)
def test_only_the_compiler_writes_parameters_and_the_namespace_controller_deletes_them(
    user: str, operation: str, namespace: dict[str, Any], passes: bool
) -> None:
    (guard,) = [
        d for d in manifests() if d["metadata"]["name"] == GUARD and "validations" in d["spec"]
    ]
    (validation,) = guard["spec"]["validations"]
    env = celpy.Environment()
    activation = {
        "request": celpy.json_to_cel({"userInfo": {"username": user}, "operation": operation}),
        "namespaceObject": celpy.json_to_cel(namespace),
    }
    # cel-python cannot compare a map with null; the namespace is present in every row here
    # (the API server's own evaluation, null included: tests/kube/test_compile_bounds.py).
    expression = validation["expression"].replace("namespaceObject != null", "true")
    program = env.program(env.compile(expression))
    assert bool(program.evaluate(activation)) is passes


def test_the_policies_judge_the_namespaces_the_webhook_judges() -> None:
    """The policies reading parameters, and their bindings, select what the webhook's entry
    selects; the warn and audit policies only those namespaces labeled softened."""
    (labels,) = [w for w in shipped_webhook()["webhooks"] if w["name"] == LABEL_ENTRY]
    assert labels["namespaceSelector"] == JUDGED
    softened = {"key": SOFTENED_MARK, "operator": "In", "values": ["true"]}
    checked = set()
    for doc in every():
        spec = doc["spec"]
        name = doc["metadata"]["name"] if "paramKind" in spec else spec.get("policyName")
        match = spec.get("matchConstraints") or spec.get("matchResources")
        if "paramKind" not in spec and name not in ACTIONS:
            continue
        expected = copy.deepcopy(dict(JUDGED))
        if name in ACTIONS and ACTIONS[name][0] != ENFORCE:
            expected["matchExpressions"] = [*JUDGED["matchExpressions"], softened]
        assert match["namespaceSelector"] == expected, doc["kind"] + " " + name
        checked.add(name)
    assert set(ACTIONS) < checked


@pytest.mark.parametrize(
    ("install", "unjudged"),
    [
        pytest.param(Install(), {"label-rbac", "kube-system"}, id="shipped"),
        pytest.param(Install("acme", "acme-system"), {"acme-system", "kube-system"}, id="renamed"),
        pytest.param(Install("acme"), {"label-rbac", "kube-system"}, id="renamed-in-label-rbac"),
    ],
)
def test_an_install_never_judges_by_name_kube_system_and_its_own_namespace(
    install: Install, unjudged: set[str]
) -> None:
    """What the compiler keeps out of its proofs is what the policies it writes leave out."""
    assert install.unjudged == unjudged
    for name in ACTIONS:
        selector = install.document(policy(name))["spec"]["matchConstraints"]["namespaceSelector"]
        (by_name,) = [
            e for e in selector["matchExpressions"] if e["key"] == "kubernetes.io/metadata.name"
        ]
        assert by_name["operator"] == "NotIn" and set(by_name["values"]) == unjudged


def test_the_split_sends_marked_namespaces_only_what_the_policy_leaves() -> None:
    shipped = shipped_webhook()
    (labels,) = [w for w in shipped["webhooks"] if w["name"] == LABEL_ENTRY]
    unmarked, marked = webhook_patch(shipped)["webhooks"]
    mark = {"key": MARK, "values": ["true"]}
    assert unmarked == {
        "name": LABEL_ENTRY,
        "namespaceSelector": {"matchExpressions": [*JUDGED["matchExpressions"],
                                                   {**mark, "operator": "NotIn"}]},
    }  # fmt: skip
    assert marked["namespaceSelector"]["matchExpressions"][-1] == {**mark, "operator": "In"}
    assert marked["failurePolicy"] == "Fail"
    # Otherwise the shipped entry: its client, its own skips (as one condition: each is a
    # program the API server runs on every request the entry matches), and rules of its own,
    # so that no condition runs on the writes the policy judges.
    (skips,) = marked["matchConditions"]
    assert skips == {
        "name": "shipped-skips",
        "expression": " && ".join(f"({c['expression']})" for c in labels["matchConditions"]),
    }
    assert len(labels["matchConditions"]) > 1
    assert marked["rules"] == compiled_rules() != labels["rules"]
    same = {
        k: v
        for k, v in marked.items()
        if k not in ("name", "failurePolicy", "namespaceSelector", "matchConditions", "rules")
    }
    assert same == {k: labels[k] for k in same} and set(labels) - set(marked) == set()
    assert marked["name"] == COMPILED_ENTRY


def _matches(rules: list[dict[str, Any]], group: str, resource: str, sub: str, op: str) -> bool:
    """Whether a request matches one of ``rules``, as the API server's rule matcher reads them
    ("*": every resource, no subresource; "x/*": every subresource of x, and x itself)."""
    for rule in rules:
        if rule["operations"] != ["*"] and op not in rule["operations"]:
            continue
        if "*" not in rule["apiGroups"] and group not in rule["apiGroups"]:
            continue
        for text in rule["resources"]:
            res, _, wanted = text.partition("/")
            if res in ("*", resource) and wanted in ("*", sub):
                return True
    return False


def _judges(group: str, resource: str, sub: str, op: str) -> list[str]:
    """Who in a compiled namespace the rules and selectors send a request to."""
    found = []
    for document in [policy(POLICY), *subresource_policy()]:
        if document["kind"] != "ValidatingAdmissionPolicy":
            continue
        match = document["spec"]["matchConstraints"]
        if _matches(match["resourceRules"], group, resource, sub, op) and not _matches(
            match.get("excludeResourceRules", []), group, resource, sub, op
        ):
            found.append(document["metadata"]["name"])
    if _matches(compiled_rules(), group, resource, sub, op):
        found.append(COMPILED_ENTRY)
    return found


@pytest.mark.parametrize(
    ("group", "resource", "sub", "op", "judge"),
    [
        pytest.param("", "configmaps", "", "CREATE", "label-rbac", id="a-plain-create"),
        pytest.param("", "secrets", "", "DELETE", "label-rbac", id="a-delete"),
        pytest.param("example.com", "widgets", "", "UPDATE", "label-rbac", id="a-crd-update"),
        pytest.param("", "pods", "", "CREATE", COMPILED_ENTRY, id="pods-whole"),
        pytest.param("", "pods", "status", "UPDATE", COMPILED_ENTRY, id="pod-status"),
        pytest.param("", "pods", "eviction", "CREATE", COMPILED_ENTRY, id="pod-eviction"),
        pytest.param("", "pods", "exec", "CONNECT", COMPILED_ENTRY, id="exec"),
        pytest.param("", "services", "proxy", "CONNECT", COMPILED_ENTRY, id="proxy-connect"),
        pytest.param("", "services", "proxy", "UPDATE", COMPILED_ENTRY, id="proxy-put"),
        pytest.param("", "configmaps", "", "CONNECT", COMPILED_ENTRY, id="connect-no-sub"),
        pytest.param("", "serviceaccounts", "token", "CREATE", COMPILED_ENTRY, id="token"),
        pytest.param("apps", "deployments", "scale", "UPDATE", COMPILED_ENTRY, id="deploy-scale"),
        pytest.param("example.com", "widgets", "status", "UPDATE", COMPILED_ENTRY, id="crd-status"),
        pytest.param("example.com", "widgets", "scale", "UPDATE", COMPILED_ENTRY, id="crd-scale"),
        # The policy only for the compiler's probe of it (a dry run).
        pytest.param(
            "labelrbac.io",
            "labelrbacparams",
            "",
            "CREATE",
            f"label-rbac {COMPILED_ENTRY}",
            id="params",
        ),
        pytest.param("batch", "jobs", "", "DELETE", COMPILED_ENTRY, id="a-workload"),
        pytest.param("kubevirt.io", "vms", "start", "UPDATE", SUBRESOURCE_GUARD, id="unknown-sub"),
        pytest.param("", "pods", "newsub", "UPDATE", COMPILED_ENTRY, id="unknown-pod-sub"),
        pytest.param(
            "", "persistentvolumeclaims", "", "CREATE", f"label-rbac {COMPILED_ENTRY}", id="pvc"
        ),
    ],
)
def test_every_request_of_a_marked_namespace_has_a_judge(
    group: str, resource: str, sub: str, op: str, judge: str
) -> None:
    """The policy, the compiled entry's rules and the subresource policy share out the requests
    of a compiled namespace (tests/kube/test_split.py asks the API server): nothing is judged
    by no one, and no write the policy judges costs the entry a condition, but those the node
    rules decide too (a kubelet may not write a claim)."""
    assert _judges(group, resource, sub, op) == judge.split()


def test_the_split_subresources_are_every_one_served_but_the_webhook_resources() -> None:
    """``SUBRESOURCES`` names every subresource kube-apiserver v1.36 serves on a namespaced
    resource the policy judges (its discovery, as listed by tests/kube/test_split.py)."""
    served = {"attach", "binding", "ephemeralcontainers", "eviction", "exec", "log",
              "portforward", "proxy", "resize", "scale", "status", "token"}  # fmt: skip
    of_pods_or_tokens = {"attach", "binding", "ephemeralcontainers", "eviction", "exec", "log",
                         "portforward", "resize", "token"}  # fmt: skip
    assert set(SUBRESOURCES) == served - of_pods_or_tokens
    assert {("", "pods"), ("", "serviceaccounts")} <= WEBHOOK_RESOURCES


def test_the_compiler_may_change_only_the_mark_on_a_namespace() -> None:
    (policy,) = [d for d in manifests() if d["metadata"]["name"] == MARKS
                 and d["kind"] == "ValidatingAdmissionPolicy"]  # fmt: skip
    (condition,) = policy["spec"]["matchConditions"]
    assert condition["expression"] == f"request.userInfo.username == '{COMPILER}'"
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert (rule["apiGroups"], rule["resources"]) == ([""], ["namespaces"])
