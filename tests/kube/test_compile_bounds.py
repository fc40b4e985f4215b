"""The compiler against what one tenant or an outage can do, through a real kube-apiserver.

``manifests/enforce-compiled`` is installed with the webhook and one compiler (a 6 s lease):

- a Role listing tens of thousands of ``resourceNames`` leaves its namespace to the webhook
  (status, Event, log) while the other namespaces are still compiled promptly and the lease is
  kept;
- with the webhook down, the compiler's writes still go through (the shipped registration skips
  them), even where an annotation restricts ``*``; where a registration does send them, each
  failing namespace is retried after a growing backoff and the log says it a few times, not a
  thousand;
- a namespace deleted (the namespace controller deleting its parameters, which the guard lets it
  do only while the namespace is terminating) and created again gets its parameters back.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest

from app.engine.params import MARK
from tests.kube.cluster import Compilers, LabelRbacCluster
from tests.kube.conftest import require_control_plane, wait_for
from tests.kube.controlplane import ADMIN, COMPILER_USER, DEFAULT_USERS, service_account
from tests.support import binding, role, rule

NAMESPACE_CONTROLLER = service_account("kube-system", "namespace-controller")
LEASE_SECONDS = 6.0
PARAMS = "/apis/labelrbac.io/v1alpha1/namespaces/{ns}/labelrbacparams/label-rbac"
LEASE = "/apis/coordination.k8s.io/v1/namespaces/label-rbac/leases/label-rbac-compiler"
RESOURCES = "configmaps secrets services persistentvolumeclaims"
# 60,000 names over 600 rules, on four restricted resources: about 1.4 million units of work,
# over the default budget of 1,000,000 (each name is carried per resource and operation). Before
# rendering was linear (every name tested against every rule) this took hours.
NAMES, RULES = 60_000, 600


def rbac(*items: tuple[str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"apiVersion": "rbac.authorization.k8s.io/v1", **obj} for _, obj in items]


TEAM_A = {"team": ["a"]}


def team(namespace: str, user: str = "alice") -> list[dict[str, Any]]:
    return rbac(
        role(
            "team-a", namespace, [rule("*", "configmaps secrets")], {"configmaps": {"team": ["a"]}}
        ),
        binding(f"{user}-a", "team-a", f"User:{user}", namespace=namespace),
    )


def huge_role(namespace: str) -> list[dict[str, Any]]:
    per = NAMES // RULES
    rules = [
        rule("get update delete", RESOURCES, names=" ".join(f"o{r}-{i}" for i in range(per)))
        for r in range(RULES)
    ]
    restricted = {resource: {"team": ["a"]} for resource in RESOURCES.split()}
    return rbac(
        role("named", namespace, rules, restricted),
        binding("alice-named", "named", "User:alice", namespace=namespace),
    )


@pytest.fixture(scope="module")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LabelRbacCluster, Compilers]]:
    require_control_plane()
    workdir = tmp_path_factory.mktemp("compile-bounds")
    users = (*DEFAULT_USERS, COMPILER_USER, NAMESPACE_CONTROLLER)
    with LabelRbacCluster(workdir, users=users, overlay="enforce-compiled") as cluster:
        cp = cluster.control_plane
        for namespace in ("t1", "t2"):
            create_namespace(cluster, namespace)
            cp.apply(ADMIN, team(namespace))
        compilers = Compilers(cp, workdir)
        compilers.start("compiler", "--lease-seconds", str(LEASE_SECONDS))
        try:
            wait_for(lambda: marked(cluster, "t1") and marked(cluster, "t2"), "compiled", 60)
            yield cluster, compilers
        finally:
            compilers.stop_all()


def create_namespace(kube: LabelRbacCluster, name: str) -> None:
    status, answer = kube.control_plane.request(
        ADMIN, "POST", "/api/v1/namespaces", {"metadata": {"name": name}}
    )
    assert status == 201, answer


def marked(kube: LabelRbacCluster, namespace: str) -> bool:
    _, ns = kube.control_plane.request(ADMIN, "GET", f"/api/v1/namespaces/{namespace}")
    return bool(ns.get("metadata", {}).get("labels", {}).get(MARK) == "true")


def params(kube: LabelRbacCluster, namespace: str) -> dict[str, Any]:
    status, found = kube.control_plane.request(ADMIN, "GET", PARAMS.format(ns=namespace))
    return found if status == 200 else {}


def lists(kube: LabelRbacCluster, namespace: str, user: str) -> bool:
    return user in params(kube, namespace).get("spec", {}).get("users", {})


def holder(kube: LabelRbacCluster) -> tuple[str, int]:
    _, lease = kube.control_plane.request(ADMIN, "GET", LEASE)
    spec = lease.get("spec", {})
    return spec.get("holderIdentity", ""), int(spec.get("leaseTransitions") or 0)


def create_configmap(kube: LabelRbacCluster, namespace: str, team_label: str) -> str:
    """A dry-run create by alice: "" when allowed, else the API server's message."""
    body = {"metadata": {"name": "c", "labels": {"team": team_label}}}
    status, answer = kube.control_plane.request(
        "alice", "POST", f"/api/v1/namespaces/{namespace}/configmaps?dryRun=All", body
    )
    return "" if status < 300 else str(answer.get("message", answer))


def test_a_role_with_tens_of_thousands_of_names_is_left_to_the_webhook_and_slows_no_one(
    kube: tuple[LabelRbacCluster, Compilers],
) -> None:
    cluster, compilers = kube
    cp = cluster.control_plane
    before = holder(cluster)
    create_namespace(cluster, "big")
    cp.apply(ADMIN, team("big"))
    wait_for(lambda: marked(cluster, "big"), "big compiled")
    for obj in huge_role("big"):  # created, not applied: too large for kubectl's annotation
        plural = "roles" if obj["kind"] == "Role" else "rolebindings"
        path = f"/apis/rbac.authorization.k8s.io/v1/namespaces/big/{plural}"

        def created(path: str = path, obj: dict[str, Any] = obj) -> bool:
            status, answer = cp.request(ADMIN, "POST", path, obj, timeout=60)
            # The binding hands out restrictions of resources the parameters still list as
            # needing no judging: the fence refuses it until they are written again.
            assert status == 201 or "retry in a moment" in str(answer), answer
            return status == 201

        wait_for(created, f"{obj['kind']} created", 30)
    # Meanwhile, a binding in t1 is compiled as promptly as ever.
    started = time.monotonic()
    cp.apply(ADMIN, rbac(binding("bob-a", "team-a", "User:bob", namespace="t1")))
    wait_for(lambda: lists(cluster, "t1", "bob"), "bob in t1's parameters", 10)
    took = time.monotonic() - started
    wait_for(lambda: "delegated" in params(cluster, "big").get("spec", {}), "big delegated", 30)
    found = params(cluster, "big")
    (condition,) = found["status"]["conditions"]
    assert (condition["status"], condition["reason"]) == ("False", "TooComplex")
    assert "units of work" in condition["message"]
    assert not marked(cluster, "big")  # the webhook judges it again
    _, events = cp.request(ADMIN, "GET", "/api/v1/namespaces/big/events")
    reasons = [(e["reason"], e["type"]) for e in events["items"]]
    assert ("TooComplex", "Warning") in reasons
    # The line reaches the log through its writer thread, after the write it reports.
    wait_for(
        lambda: "namespace big is left to the webhook (TooComplex" in compilers.log("compiler"),
        "the delegation logged",
        10,
    )
    # The webhook judges it: alice's own bucket allowed, another refused by her labels.
    assert create_configmap(cluster, "big", "a") == ""
    assert 'label team="b" is not permitted' in create_configmap(cluster, "big", "b")
    # A narrowing change there still takes effect: her binding removed, her writes refused.
    status, _ = cp.request(
        ADMIN,
        "DELETE",
        "/apis/rbac.authorization.k8s.io/v1/namespaces/big/rolebindings/alice-a",
    )
    assert status == 200
    wait_for(lambda: "cannot create resource" in create_configmap(cluster, "big", "a"), "refused")
    # The lease was never lost nor handed over, and other namespaces were not held up.
    assert holder(cluster) == before and "lost the lease" not in compilers.log("compiler")
    assert took < 5.0, took
    print(f"\nt1 compiled {took:.2f}s after a binding, beside the huge role")


def restart_compiler(compilers: Compilers, identity: str) -> None:
    """The running compiler killed, another started: it leads once the lease has run out, and
    writes every namespace whose stored parameters differ from RBAC."""
    for running in list(compilers.processes):
        if compilers.processes[running].poll() is None:
            compilers.kill(running)
    compilers.start(identity, "--lease-seconds", str(LEASE_SECONDS))


def stop_webhook(kube: LabelRbacCluster) -> None:
    assert kube.webhook is not None
    kube.webhook.process.terminate()
    kube.webhook.process.wait(30)


def test_with_the_webhook_down_the_compilers_writes_go_through_even_under_a_star_pattern(
    kube: tuple[LabelRbacCluster, Compilers],
) -> None:
    """RBAC writes fail closed with the webhook down (rbac.labelrbac.io), so the change is made
    before, and a compiler started after writes it: its writes never wait for the webhook."""
    cluster, compilers = kube
    cp = cluster.control_plane
    star = role("everything", "t2", [rule("*", "configmaps")], {"*": {"team": ["a"]}})
    cp.apply(ADMIN, rbac(star))
    wait_for(
        lambda: json.loads(registration(cluster)["metadata"]["annotations"][UNJUDGED]) == [],
        "nothing skipped: '*' restricts every resource, the parameters included",
    )
    compilers.kill("compiler")
    cp.apply(ADMIN, rbac(binding("carol-star", "everything", "User:carol", namespace="t2")))
    stop_webhook(cluster)
    try:
        restart_compiler(compilers, "compiler-2")
        wait_for(lambda: lists(cluster, "t2", "carol"), "carol in t2's parameters", 30)
    finally:
        cluster.restart_webhook()
    assert "could not write the parameters" not in compilers.log("compiler-2")


UNJUDGED = "labelrbac.io/unjudged"


def registration(kube: LabelRbacCluster) -> dict[str, Any]:
    path = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/label-rbac"
    status, found = kube.control_plane.request(ADMIN, "GET", path)
    assert status == 200, found
    return dict(found)


# The conditions that let the compiler's writes past the webhook: its own in the shipped entry,
# and the compiled entry's one condition for the shipped entry's skips.
COMPILER_SKIPS = {"skip-compiler", "shipped-skips"}


def without_skip_compiler(config: dict[str, Any]) -> dict[str, Any]:
    for hook in config["webhooks"]:
        hook["matchConditions"] = [
            c for c in hook.get("matchConditions", ()) if c["name"] not in COMPILER_SKIPS
        ]
    return config


def compiler_writes(kube: LabelRbacCluster, namespace: str, since: float) -> int:
    """The compiler's attempts at writing ``namespace``'s parameters since ``since`` (epoch
    seconds), from the API server's audit log."""
    count = 0
    for event in kube.control_plane.audit_events():
        if (
            event.get("stage") == "ResponseComplete"
            and event.get("user", {}).get("username") == COMPILER_USER.name
            and event.get("verb") == "patch"
            and event.get("objectRef", {}).get("resource") == "labelrbacparams"
            and event.get("objectRef", {}).get("namespace") == namespace
            and _epoch(event["requestReceivedTimestamp"]) >= since
        ):
            count += 1
    return count


def _epoch(timestamp: str) -> float:
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def test_where_a_registration_sends_the_compilers_writes_to_a_dead_webhook_it_backs_off(
    kube: tuple[LabelRbacCluster, Compilers],
) -> None:
    """A registration written before ``skip-compiler`` existed: the writes fail while the
    webhook is down, and are retried after a growing delay, logged a few times."""
    cluster, compilers = kube
    cp = cluster.control_plane
    original = registration(cluster)
    cp.apply(ADMIN, [without_skip_compiler(registration(cluster))])
    compilers.kill("compiler-2")
    cp.apply(ADMIN, rbac(binding("dana-star", "everything", "User:dana", namespace="t2")))
    stop_webhook(cluster)
    seconds = 15.0
    try:
        restart_compiler(compilers, "compiler-3")
        wait_for(
            lambda: "could not write the parameters of t2" in compilers.log("compiler-3"),
            "the first refused write",
            30,
        )
        started = time.time() - 1.0
        time.sleep(seconds)
        attempts = compiler_writes(cluster, "t2", started)
        lines = compilers.log("compiler-3").count("could not write the parameters")
        assert not lists(cluster, "t2", "dana")
    finally:
        restored = registration(cluster)
        restored["webhooks"] = original["webhooks"]
        cp.apply(ADMIN, [restored])
        cluster.restart_webhook()
    # 0.25-0.5 s, then doubling: at most 7 tries in 16 s (0.5 + 1 + 2 + 4 + 8 + 16 > 16).
    assert 2 <= attempts <= 7, attempts
    assert 1 <= lines <= 3, lines  # one line per 10 s at most
    print(f"\n{attempts} writes and {lines} log lines in {seconds:.0f}s with the webhook down")
    wait_for(lambda: lists(cluster, "t2", "dana"), "dana in t2's parameters", 40)


def test_a_namespace_deleted_and_created_again_gets_its_parameters_back(
    kube: tuple[LabelRbacCluster, Compilers],
) -> None:
    cluster, _ = kube
    cp = cluster.control_plane
    create_namespace(cluster, "again")
    cp.apply(ADMIN, team("again"))
    wait_for(lambda: marked(cluster, "again"), "again compiled")
    as_controller = NAMESPACE_CONTROLLER.name
    # Outside a namespace being deleted, the namespace controller may not delete them either.
    status, answer = cp.request(as_controller, "DELETE", PARAMS.format(ns="t1"))
    assert status == 403 and "label-rbac-params" in answer["message"], answer
    status, answer = cp.request(ADMIN, "DELETE", "/api/v1/namespaces/again")
    assert status == 200, answer
    # The namespace controller's work, as it does it: the content, then the finalizer.
    for path in (
        "/apis/rbac.authorization.k8s.io/v1/namespaces/again/rolebindings/alice-a",
        "/apis/rbac.authorization.k8s.io/v1/namespaces/again/roles/team-a",
        PARAMS.format(ns="again"),
    ):
        status, answer = cp.request(as_controller, "DELETE", path)
        assert status == 200, (path, answer)
    status, answer = cp.request(ADMIN, "DELETE", PARAMS.format(ns="t1"))
    assert status == 403, answer  # nor anyone else, admins included
    _, namespace = cp.request(ADMIN, "GET", "/api/v1/namespaces/again")
    namespace["spec"]["finalizers"] = []
    status, answer = cp.request(
        as_controller, "PUT", "/api/v1/namespaces/again/finalize", namespace
    )
    assert status == 200, answer
    wait_for(
        lambda: cp.request(ADMIN, "GET", "/api/v1/namespaces/again")[0] == 404, "again deleted"
    )
    # Created again, with the same RBAC: the same parameters as before, written again.
    create_namespace(cluster, "again")
    cp.apply(ADMIN, team("again"))
    # Every namespace indexes configmaps (an annotation restricts them): until alice is listed
    # there, the policy refuses her as "not listed yet", so wait for her, not only the object.
    took = wait_for(lambda: marked(cluster, "again") and lists(cluster, "again", "alice"), "again")
    assert create_configmap(cluster, "again", "a") == ""
    assert 'label team="b" is not permitted' in create_configmap(cluster, "again", "b")
    print(f"\nparameters back {took:.2f}s after the namespace was created again")
