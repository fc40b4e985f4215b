"""``label-rbac compile`` through a real kube-apiserver: two replicas, one writer, and handover.

The shipped component (manifests/compiled: CRD, policies, the compiler's RBAC) is installed in a
loopback control plane and two compiler processes run as the compiler's ServiceAccount. Tests
watch what a tenant sees: a denial naming the roles once the parameters are written, the
retryable denial of a just-bound subject until they are, and the same after the leader is killed;
and what the compiler's RBAC lets it do to the policies it writes: create and update them by name,
watch them by name, nothing else.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import yaml

from app.compiled.admission_policy import ACTIONS, COMPILER, policy, unjudged_of
from app.compiled.admission_policy import POLICY as ENFORCING
from app.compiled.admission_policy import binding as policy_binding
from app.compiled.compiler import FIELD_MANAGER
from app.engine.params import MARK, SOFTENED_MARK, ClusterPart
from tests.kube.cluster import Compilers
from tests.kube.conftest import require_control_plane, wait_for
from tests.kube.controlplane import ADMIN, ControlPlane, User
from tests.support import ROOT, binding, role, rule

COMPILED = ROOT / "manifests" / "compiled"
NS = "t1"
LEASE_SECONDS = 3.0
LEASE = ("--lease-seconds", str(LEASE_SECONDS))
USERS = (
    User(ADMIN, ("system:masters",)),
    User(COMPILER, ("system:serviceaccounts", "system:serviceaccounts:label-rbac")),
    User("alice", ("tenants",)),
    User("bob", ("tenants",)),
    User("carol", ("tenants",)),
)


def rbac(item: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", **item[1]}


TEAM_A = role("team-a", NS, [rule("*", "configmaps")], {"configmaps": {"team": ["a"]}})


def documents(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((COMPILED / name).read_text()) if d]


def create(cp: ControlPlane, user: str, team: str) -> str:
    """A dry-run create of a configmap labeled ``team``: "" when allowed, else the message."""
    body = {"metadata": {"name": "c", "labels": {"team": team}}, "data": {}}
    status, answer = cp.request(
        user, "POST", f"/api/v1/namespaces/{NS}/configmaps?dryRun=All", body
    )
    return "" if status < 300 else str(answer.get("message", answer))


def label_denial(user: str) -> str:
    return (
        f'user "{user}" may not create configmaps "c" in namespace "{NS}": '
        'label team="b" is not permitted (role t1/team-a allows team in [a])'
    )


def holder(cp: ControlPlane) -> str:
    path = "/apis/coordination.k8s.io/v1/namespaces/label-rbac/leases/label-rbac-compiler"
    status, lease = cp.request(ADMIN, "GET", path)
    return lease["spec"]["holderIdentity"] if status == 200 else ""


def install_compiled(cp: ControlPlane, *namespaces: str) -> None:
    """The compiled component's CRD, policies and RBAC as shipped, and ``namespaces``."""
    for namespace in ("label-rbac", *namespaces):
        cp.request(ADMIN, "POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
    cp.apply(ADMIN, documents("crd.yaml"))
    wait_for(
        lambda: cp.request(ADMIN, "GET", "/apis/labelrbac.io/v1alpha1/labelrbacparams")[0] == 200,
        "the CRD",
    )
    cp.apply(ADMIN, documents("policy.yaml") + documents("rbac.yaml"))


@contextmanager
def control_plane(
    factory: pytest.TempPathFactory, name: str, users: tuple[User, ...], *namespaces: str
) -> Iterator[tuple[ControlPlane, Compilers]]:
    """A control plane with the compiled component installed (``install_compiled``) and no
    compiler running yet; every compiler started is stopped with it."""
    require_control_plane()
    workdir = factory.mktemp(name)
    cp = ControlPlane(workdir, users=users)
    cp.start()
    compilers = Compilers(cp, workdir)
    try:
        install_compiled(cp, *namespaces)
        yield cp, compilers
    finally:
        compilers.stop_all()
        cp.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ControlPlane, Compilers]]:
    with control_plane(tmp_path_factory, "compile", USERS, NS) as (cp, compilers):
        cp.apply(
            ADMIN, [rbac(TEAM_A), rbac(binding("alice-a", "team-a", "User:alice", namespace=NS))]
        )
        compilers.start("one", *LEASE)
        wait_for(lambda: holder(cp) == "one", "the first replica to lead")
        compilers.start("two", *LEASE)
        yield cp, compilers


def test_the_leader_writes_the_parameters_and_the_other_replica_does_not(
    cluster: tuple[ControlPlane, Compilers],
) -> None:
    cp, compilers = cluster
    wait_for(lambda: create(cp, "alice", "b").endswith(label_denial("alice")), "enforcement")
    assert create(cp, "alice", "a") == ""
    path = f"/apis/labelrbac.io/v1alpha1/namespaces/{NS}/labelrbacparams/label-rbac"
    status, params = cp.request(ADMIN, "GET", path)
    assert status == 200
    assert params["status"]["conditions"][0]["status"] == "True"
    grants = params["spec"]["grants"]
    assert params["status"]["grants"] == len(grants)
    assert "role t1/team-a" in {g["role"] for g in grants.values()}
    assert {m["manager"] for m in params["metadata"]["managedFields"]} == {"label-rbac-compiler"}
    time.sleep(LEASE_SECONDS)  # several renewal periods: the follower stays a follower
    assert holder(cp) == "one"
    assert "wrote the parameters" not in compilers.log("two")


def test_a_new_binding_is_refused_until_compiled_then_judged(
    cluster: tuple[ControlPlane, Compilers],
) -> None:
    cp, _ = cluster
    cp.apply(ADMIN, [rbac(binding("bob-a", "team-a", "User:bob", namespace=NS))])
    # Never allowed in between: refused as not yet listed, then judged on its labels.
    seen: set[str] = set()

    def judged() -> bool:
        message = create(cp, "bob", "b")
        assert message, "a just-bound subject was let through unchecked"
        seen.add("listed" if message.endswith(label_denial("bob")) else "pending")
        return "listed" in seen

    lag = wait_for(judged, "the new binding to be compiled", timeout=10)
    print(f"RBAC change -> enforced by the policy: {lag * 1000:.0f} ms")
    assert create(cp, "bob", "a") == ""


TEAM_X = role("team-x", "", [rule("*", "configmaps")], {"configmaps": {"team": ["x"]}})
POLICY = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/label-rbac"


def stored_versions(cp: ControlPlane) -> dict[str, str]:
    """The resourceVersion of every namespace's parameters."""
    _, listing = cp.request(ADMIN, "GET", "/apis/labelrbac.io/v1alpha1/labelrbacparams")
    return {i["metadata"]["namespace"]: i["metadata"]["resourceVersion"] for i in listing["items"]}


def test_a_cluster_binding_is_one_write_of_the_policy_and_none_of_a_namespace(
    cluster: tuple[ControlPlane, Compilers],
) -> None:
    """The ClusterRoleBindings' part is stored once, in the policy the compiler writes: binding
    a restricted ClusterRole cluster-wide, then editing it, rewrites no namespace's parameters,
    and the policy judges by the union of both parts (bob: team a in t1, team x everywhere)."""
    cp, _ = cluster
    before, generation = stored_versions(cp), cp.request(ADMIN, "GET", POLICY)[1]["metadata"]
    assert 'label team="x" is not permitted (role t1/team-a allows team in [a])' in create(
        cp, "bob", "x"
    )
    cp.apply(ADMIN, [rbac(TEAM_X), rbac(binding("bob-x", "team-x", "User:bob"))])
    wait_for(lambda: create(cp, "bob", "x") == "", "the cluster binding to be compiled")
    assert create(cp, "bob", "z").endswith(
        "(role t1/team-a allows team in [a]; clusterrole team-x allows team in [x])"
    )
    edited = role("team-x", "", [rule("*", "configmaps")], {"configmaps": {"team": ["x", "z"]}})
    cp.apply(ADMIN, [rbac(edited)])
    wait_for(lambda: create(cp, "bob", "z") == "", "the ClusterRole edit to be compiled")
    assert stored_versions(cp) == before
    _, written = cp.request(ADMIN, "GET", POLICY)
    assert written["metadata"]["generation"] >= generation["generation"] + 2
    managers = {m["manager"] for m in written["metadata"]["managedFields"]}
    assert managers == {"label-rbac-compiler"}


def test_the_policy_changed_or_deleted_by_someone_else_is_written_again(
    cluster: tuple[ControlPlane, Compilers],
) -> None:
    cp, _ = cluster
    patch = {"spec": {"failurePolicy": "Ignore"}}
    cp.request(ADMIN, "PATCH", POLICY, patch, content_type="application/merge-patch+json")
    wait_for(
        lambda: cp.request(ADMIN, "GET", POLICY)[1]["spec"]["failurePolicy"] == "Fail",
        "the compiler to write its policy again",
    )
    assert cp.request(ADMIN, "DELETE", POLICY)[0] == 200
    took = wait_for(lambda: cp.request(ADMIN, "GET", POLICY)[0] == 200, "the policy again")
    print(f"policy deleted -> written again: {took * 1000:.0f} ms")
    wait_for(lambda: create(cp, "alice", "b").endswith(label_denial("alice")), "enforcement")


def test_when_the_leader_dies_the_other_takes_over_within_the_lease_and_loses_nothing(
    cluster: tuple[ControlPlane, Compilers],
) -> None:
    cp, compilers = cluster
    compilers.kill(holder(cp))
    # A change made while no replica leads is written by the next leader.
    cp.apply(ADMIN, [rbac(binding("carol-a", "team-a", "User:carol", namespace=NS))])
    took = wait_for(lambda: holder(cp) == "two", "the other replica to lead", timeout=30)
    print(f"leader killed -> the other replica leads: {took:.1f} s (lease {LEASE_SECONDS} s)")
    # The lease runs out on the follower's clock, then its next try (a sixth of the lease), with
    # room for a loaded machine's API latency.
    assert took <= LEASE_SECONDS + 2.0
    wait_for(lambda: create(cp, "carol", "b").endswith(label_denial("carol")), "carol compiled")
    # Log lines reach the file through a writer thread, a moment after the fact.
    wait_for(lambda: "leading" in compilers.log("two"), "the new leader to log it", timeout=5)
    assert create(cp, "carol", "a") == ""


POLICIES = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
BINDINGS = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"
APPLY = f"?fieldManager={FIELD_MANAGER}&force=true"
# A policy the compiler may write that no binding of this cluster names (the modes component is
# not installed here), so writing it judges nothing.
SOFTENED = f"{ENFORCING}-audit"


def apply_policy(cp: ControlPlane, user: str, document: dict[str, Any]) -> tuple[int, Any]:
    """A server-side apply of ``document`` as ``user``, as the compiler writes its policies."""
    path = f"{POLICIES}/{document['metadata']['name']}{APPLY}"
    return cp.request(user, "PATCH", path, document, content_type="application/apply-patch+yaml")


def bare(name: str) -> dict[str, Any]:
    """A policy ``name`` matching nothing: small, since the API server refuses a write RBAC
    does not authorize before reading its body (and may close the connection while a large
    one is still being sent)."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {"validations": [{"expression": "true"}]},
    }


def test_the_compilers_rbac_writes_its_policies_by_name_and_nothing_else(
    cluster: tuple[ControlPlane, Compilers],
) -> None:
    """manifests/compiled/rbac.yaml: the compiler's identity creates one of its policies by a
    server-side apply (``patch`` by name, no ``create``), updates it, reads it and watches it by
    name; any other policy, an unnamed list or watch, a plain create, a delete and every write
    of a binding are refused by RBAC."""
    cp, _ = cluster
    assert set(ACTIONS) == {ENFORCING, f"{ENFORCING}-warn", SOFTENED}
    cp.request(ADMIN, "DELETE", f"{POLICIES}/{SOFTENED}")
    status, created = apply_policy(cp, COMPILER, policy(SOFTENED))
    assert status == 201, created["message"]
    managers = {m["manager"] for m in created["metadata"]["managedFields"]}
    assert managers == {FIELD_MANAGER}
    chunks = ("{'users': {}, 'groups': {}, 'roles': {}, 'grants': {}}",)
    status, updated = apply_policy(cp, COMPILER, policy(SOFTENED, ClusterPart(chunks, 0, False)))
    assert status == 200, updated
    names = [v["name"] for v in updated["spec"]["variables"]]
    assert names[:2] == ["cluster0", "clusterChunks"]
    assert cp.request(COMPILER, "GET", f"{POLICIES}/{SOFTENED}")[0] == 200
    by_name = f"fieldSelector=metadata.name%3D{SOFTENED}"
    status, listing = cp.request(COMPILER, "GET", f"{POLICIES}?{by_name}")
    assert status == 200, listing
    assert [i["metadata"]["name"] for i in listing["items"]] == [SOFTENED]
    # A watch by name: the object as it stands, as the first event.
    status, stream = cp.request(
        COMPILER, "GET", f"{POLICIES}?watch=true&{by_name}&timeoutSeconds=1"
    )
    assert status == 200, stream
    # One JSON event a line (one event alone decodes whole).
    events = (
        [stream]
        if isinstance(stream, dict)
        else [json.loads(line) for line in stream.splitlines() if line.strip()]
    )
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", SOFTENED)]
    refused = {
        "another policy's apply": apply_policy(cp, COMPILER, bare("other")),
        "a guard's apply": apply_policy(cp, COMPILER, bare(f"{ENFORCING}-params")),
        "a plain create": cp.request(COMPILER, "POST", POLICIES, bare("new")),
        "a delete": cp.request(COMPILER, "DELETE", f"{POLICIES}/{SOFTENED}"),
        "a list of every policy": cp.request(COMPILER, "GET", POLICIES),
        "a watch of every policy": cp.request(COMPILER, "GET", f"{POLICIES}?watch=true"),
        "a binding's apply": cp.request(
            COMPILER, "PATCH", f"{BINDINGS}/{SOFTENED}{APPLY}", policy_binding(SOFTENED),
            content_type="application/apply-patch+yaml",
        ),
        "a binding's create": cp.request(COMPILER, "POST", BINDINGS, policy_binding(SOFTENED)),
        "a binding's read": cp.request(COMPILER, "GET", f"{BINDINGS}/{ENFORCING}"),
    }  # fmt: skip
    assert {what: status for what, (status, _) in refused.items()} == {
        what: 403 for what in refused
    }
    assert cp.request(ADMIN, "GET", f"{POLICIES}/other")[0] == 404
    assert cp.request(ADMIN, "GET", f"{BINDINGS}/{SOFTENED}")[0] == 404
    assert cp.request(ADMIN, "DELETE", f"{POLICIES}/{SOFTENED}")[0] == 200


# --- with the warn and audit policies (manifests/compiled/modes, ``--compile-softened``) -------

ERIN = User("erin", ("tenants",))
SOFT_NS = "t2"


def team_a(mode: str) -> tuple[str, dict[str, Any]]:
    """A Role of ``SOFT_NS`` restricting configmaps to team a, in ``mode``."""
    permissions = {"configmaps": {"team": ["a"]}}
    return role("team-a", SOFT_NS, [rule("*", "configmaps")], permissions, mode=mode)


@pytest.fixture(scope="module")
def softened(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """The compiled component with its modes component, one compiler compiling softened
    namespaces; erin bound in ``SOFT_NS`` to a Role in warn mode, alice in ``NS`` as above."""
    users = (*USERS, ERIN)
    with control_plane(tmp_path_factory, "softened", users, NS, SOFT_NS) as (cp, compilers):
        cp.apply(ADMIN, documents("modes/policy.yaml"))
        erin = binding("erin-a", "team-a", "User:erin", namespace=SOFT_NS)
        alice = binding("alice-a", "team-a", "User:alice", namespace=NS)
        cp.apply(ADMIN, [rbac(TEAM_A), rbac(alice), rbac(team_a("warn")), rbac(erin)])
        compilers.start("one", "--compile-softened", *LEASE)
        yield cp


def marks(cp: ControlPlane, namespace: str) -> set[str]:
    """The compiler's labels ``namespace`` carries (set to true)."""
    _, found = cp.request(ADMIN, "GET", f"/api/v1/namespaces/{namespace}")
    labels = found["metadata"].get("labels", {})
    return {key for key in (MARK, SOFTENED_MARK) if labels.get(key) == "true"}


def erins_write(cp: ControlPlane) -> tuple[int, str]:
    """erin's dry-run create of a team=b configmap through kubectl: (exit code, stderr)."""
    document = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": "c", "namespace": SOFT_NS, "labels": {"team": "b"}}}  # fmt: skip
    done = cp.kubectl(
        ERIN.name, "create", "--dry-run=server", "-f", "-", input=json.dumps(document)
    )
    return done.returncode, done.stderr


def test_a_namespace_whose_roles_soften_a_denial_is_labeled_and_warned_by_the_warn_policy(
    softened: ControlPlane,
) -> None:
    """The warn and audit policies select only namespaces the compiler labels softened: the
    namespace of a warn-mode Role is, the other is not; erin's write is let through with the
    warn policy's warning; the Role enforced again, the label goes and the write is refused;
    in warn mode again, it is labeled and warned again."""
    cp = softened
    wait_for(lambda: marks(cp, SOFT_NS) == {MARK, SOFTENED_MARK}, "the softened label")
    wait_for(lambda: marks(cp, NS) == {MARK}, "the other namespace compiled")
    warning = "(not enforced: warn mode)"
    wait_for(lambda: erins_write(cp)[0] == 0 and warning in erins_write(cp)[1], "the warning")
    cp.apply(ADMIN, [rbac(team_a("enforce"))])
    wait_for(lambda: marks(cp, SOFT_NS) == {MARK}, "the softened label taken off")
    code, stderr = erins_write(cp)
    assert code != 0 and 'label team="b" is not permitted' in stderr, stderr
    cp.apply(ADMIN, [rbac(team_a("warn"))])
    wait_for(lambda: marks(cp, SOFT_NS) == {MARK, SOFTENED_MARK}, "the softened label again")
    wait_for(lambda: warning in erins_write(cp)[1], "the warning again")


SECRETS_A = role("secrets-a", "a", [rule("*", "secrets")], {"secrets": {"team": ["a"]}})
SECRET_WRITER = role("secret-writer", "", [rule("*", "secrets")])
# Refuses every write of the parameters of namespace zz: its write in a pass fails and is
# retried, so the pass stays unfinished for as long as this policy is bound. And the ConfigMap
# ``hold-probe``, whose refusal says the API server has loaded it.
HOLD = "hold-zz"
HOLD_POLICY = {
    "apiVersion": "admissionregistration.k8s.io/v1",
    "kind": "ValidatingAdmissionPolicy",
    "metadata": {"name": HOLD},
    "spec": {
        "failurePolicy": "Fail",
        "matchConstraints": {
            "resourceRules": [
                {
                    "apiGroups": ["labelrbac.io"],
                    "apiVersions": ["*"],
                    "operations": ["UPDATE"],
                    "resources": ["labelrbacparams"],
                },
                {
                    "apiGroups": [""],
                    "apiVersions": ["*"],
                    "operations": ["CREATE"],
                    "resources": ["configmaps"],
                },
            ]
        },
        "validations": [
            {
                "expression": "request.resource.resource == 'configmaps' "
                "&& object.metadata.name != 'hold-probe'",
                "message": "held",
            }
        ],
    },
}
HOLD_BINDING = {
    "apiVersion": "admissionregistration.k8s.io/v1",
    "kind": "ValidatingAdmissionPolicyBinding",
    "metadata": {"name": HOLD},
    "spec": {
        "policyName": HOLD,
        "validationActions": ["Deny"],
        "matchResources": {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "zz"}}
        },
    },
}


def create_secret(cp: ControlPlane, user: str, namespace: str, team: str) -> str:
    """A dry-run create of a secret labeled ``team``: "" when allowed, else the message."""
    body = {"metadata": {"name": "s", "labels": {"team": team}}}
    path = f"/api/v1/namespaces/{namespace}/secrets?dryRun=All"
    status, answer = cp.request(user, "POST", path, body)
    return "" if status < 300 else str(answer.get("message", answer))


def policy_lets_pass(cp: ControlPlane) -> set[str]:
    """The resources the enforcing policy, as stored, lets pass unjudged."""
    found = unjudged_of(cp.request(ADMIN, "GET", POLICY)[1])
    assert found is not None
    return set(found)


def params_path(namespace: str) -> str:
    return f"/apis/labelrbac.io/v1alpha1/namespaces/{namespace}/labelrbacparams/label-rbac"


def test_a_tenant_s_new_restriction_leaves_other_namespaces_writes_of_it_alone(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A Role in namespace a starts restricting secrets, which nothing restricted: every
    namespace indexes them now, a write of each. While namespace zz is not written yet (its
    writes are held here, as a long pass holds the last namespaces), the policy keeps letting
    secrets pass where they are not indexed: bob's writes in zz, which no role restricts, are
    never refused; alice's in a are judged at once. Once zz is written, the policy judges
    secrets everywhere, and bob's writes stay allowed."""
    with control_plane(tmp_path_factory, "settling", USERS, NS, "a", "zz") as (cp, compilers):
        cp.apply(
            ADMIN,
            [
                rbac(TEAM_A),
                rbac(binding("alice-a", "team-a", "User:alice", namespace=NS)),
                rbac(SECRET_WRITER),
                rbac(binding("bob", "secret-writer", "User:bob", namespace="zz",
                             role_kind="ClusterRole")),
            ],
        )  # fmt: skip
        compilers.start("one", *LEASE)
        wait_for(lambda: create(cp, "alice", "b").endswith(label_denial("alice")), "enforcement")
        wait_for(lambda: cp.request(ADMIN, "GET", params_path("zz"))[0] == 200, "zz compiled")
        assert "secrets" in policy_lets_pass(cp)
        cp.apply(ADMIN, [HOLD_POLICY, HOLD_BINDING])
        probe = {"metadata": {"name": "hold-probe"}}

        def holding() -> bool:
            path = "/api/v1/namespaces/zz/configmaps?dryRun=All"
            status, answer = cp.request(ADMIN, "POST", path, probe)
            return status >= 400 and "held" in str(answer)

        wait_for(holding, "the hold on zz's parameters to be loaded")
        cp.apply(
            ADMIN,
            [rbac(SECRETS_A), rbac(binding("alice-s", "secrets-a", "User:alice", namespace="a"))],
        )
        # Namespace a, touched, is written: alice's writes of secrets there are judged.
        wait_for(
            lambda: "secrets" in cp.request(ADMIN, "GET", params_path("a"))[1]["spec"]["indexed"],
            "namespace a to index secrets",
        )
        wait_for(lambda: create_secret(cp, "alice", "a", "b") != "", "alice judged in a")
        assert create_secret(cp, "alice", "a", "a") == ""
        # zz is not: bob's writes there pass, long after a policy refusing them would load.
        deadline = time.monotonic() + 4.0
        while time.monotonic() < deadline:
            assert create_secret(cp, "bob", "zz", "b") == ""
            time.sleep(0.1)
        assert "secrets" in policy_lets_pass(cp)
        assert "secrets" not in cp.request(ADMIN, "GET", params_path("zz"))[1]["spec"]["indexed"]
        # Let go: zz is written, then the policy judges secrets everywhere.
        assert cp.request(ADMIN, "DELETE", f"{BINDINGS}/{HOLD}")[0] == 200
        # zz's write is retried after a backoff of up to 30 s.
        wait_for(
            lambda: "secrets" not in policy_lets_pass(cp), "the policy to judge secrets", timeout=90
        )
        assert "secrets" in cp.request(ADMIN, "GET", params_path("zz"))[1]["spec"]["indexed"]
        assert create_secret(cp, "bob", "zz", "b") == ""
        assert create_secret(cp, "alice", "a", "b") != ""
