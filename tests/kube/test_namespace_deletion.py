"""Deleting a namespace with the compiled policies installed, through a real kube-apiserver.

``manifests/enforce-compiled`` is installed with the webhook and a compiler. Each test fills a
namespace the compiler has compiled (a ``kube-root-ca.crt`` ConfigMap as every namespace has, a
Secret, a Service, its ``default`` ServiceAccount; with finalizers, a claim the PVC-protection
admission plugin gives its finalizer and a ConfigMap held by a custom finalizer), deletes it as an
administrator does, and runs the namespace controller, the PVC-protection controller and the
custom finalizer's controller as they run (``tests/kube/controllers.py``), the namespace
controller's order of resources forced: the parameters first, in the middle or last. Deletion must
end whatever the order, the compiler stopped, the webhook down and back, in a namespace the
compiler delegates to the webhook; and a tenant still cannot change labels there.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import pytest

from app.compiled.admission_policy import COMPILER, MARK_OWNER, TERMINATING
from app.engine.params import MARK
from tests.kube.cluster import Compilers, LabelRbacCluster
from tests.kube.conftest import require_control_plane, wait_for
from tests.kube.controllers import (
    NAMESPACE_CONTROLLER,
    PVC_FINALIZER,
    PVC_PROTECTION,
    FinalizerController,
    NamespaceController,
    Resource,
    deletable,
    delete_namespace,
    params_at,
    run_deletion,
)
from tests.kube.controlplane import ADMIN, COMPILER_USER, DEFAULT_USERS, service_account
from tests.support import binding, role, rule

CLEANUP = service_account("ops", "cleanup-controller")
CLEANUP_FINALIZER = "example.com/cleanup"
PARAMS = "/apis/labelrbac.io/v1alpha1/namespaces/{ns}/labelrbacparams/label-rbac"
LEASE = ("--lease-seconds", "3")
USERS = (*DEFAULT_USERS, COMPILER_USER, NAMESPACE_CONTROLLER, PVC_PROTECTION, CLEANUP)


def rbac(*items: tuple[str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"apiVersion": "rbac.authorization.k8s.io/v1", **obj} for _, obj in items]


# The custom finalizer's controller: a ClusterRole of its own, bound cluster-wide.
CLEANUP_RBAC = rbac(
    role("cleanup-controller", "", [rule("get list watch update patch", "configmaps")]),
    binding("cleanup-controller", "cleanup-controller", "ServiceAccount:ops:cleanup-controller"),
)


@pytest.fixture(scope="module")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LabelRbacCluster, Compilers]]:
    require_control_plane()
    workdir = tmp_path_factory.mktemp("namespace-deletion")
    with LabelRbacCluster(workdir, users=USERS, overlay="enforce-compiled") as cluster:
        cluster.control_plane.apply(ADMIN, CLEANUP_RBAC)
        compilers = Compilers(cluster.control_plane, workdir)
        compilers.start("compiler", *LEASE)
        try:
            # A namespace kept throughout, so that configmaps stay restricted somewhere and the
            # registration keeps sending them (a namespace's roles never wait for the fence).
            compiled_namespace(cluster, finalizers=False)
            yield cluster, compilers
        finally:
            compilers.stop_all()


@pytest.fixture(scope="module")
def resources(kube: tuple[LabelRbacCluster, Compilers]) -> list[Resource]:
    cluster, _ = kube
    return deletable(cluster.control_plane, NAMESPACE_CONTROLLER.name)


def tenants(namespace: str, mode: str | None = None) -> list[dict[str, Any]]:
    """alice writes configmaps of team a (``mode``: the role's), claims and secrets freely."""
    team = role(
        "team-a",
        namespace,
        [rule("*", "configmaps secrets persistentvolumeclaims")],
        {"configmaps": {"team": ["a"]}},
        mode=mode,
    )
    return rbac(team, binding("alice-a", "team-a", "User:alice", namespace=namespace))


def request(cluster: LabelRbacCluster, user: str, method: str, path: str, body: Any = None,
            content_type: str = "application/json") -> tuple[int, str]:  # fmt: skip
    """(status, message) of one request."""
    status, answer = cluster.control_plane.request(
        user, method, path, body, content_type=content_type
    )
    return status, str(answer.get("message", "")) if isinstance(answer, dict) else str(answer)


def create(cluster: LabelRbacCluster, path: str, body: dict[str, Any]) -> None:
    status, message = request(cluster, ADMIN, "POST", path, body)
    assert status == 201, (path, message)


def compiled_namespace(cluster: LabelRbacCluster, finalizers: bool, mode: str | None = None) -> str:
    """A new namespace with content, once the compiler has written its parameters (and marked
    it, unless ``mode`` softens a role there: then it is delegated to the webhook)."""
    cp = cluster.control_plane
    name = f"d-{secrets.token_hex(4)}"
    create(cluster, "/api/v1/namespaces", {"metadata": {"name": name}})
    # The first Role restricting configmaps waits for the registration to cover them (the
    # fence): its binding is refused until then.
    wait_for(lambda: applied(cluster, tenants(name, mode)), f"{name}'s roles", 30, 0.5)

    def ready() -> bool:
        status, found = cp.request(ADMIN, "GET", PARAMS.format(ns=name))
        if status != 200:
            return False
        if mode is not None:  # delegated: written without its subjects
            return bool(found.get("status", {}).get("conditions", [{}])[0].get("status") == "False")
        return "alice" in found["spec"].get("users", {}) and marked(cluster, name)

    wait_for(ready, f"{name} compiled", 60)
    api = f"/api/v1/namespaces/{name}"
    create(cluster, f"{api}/serviceaccounts", {"metadata": {"name": "default"}})
    # As the root CA publisher writes it in every namespace.
    create(cluster, f"{api}/configmaps",
           {"metadata": {"name": "kube-root-ca.crt"}, "data": {"ca.crt": "x"}})  # fmt: skip
    create(cluster, f"{api}/secrets", {"metadata": {"name": "s"}})
    create(cluster, f"{api}/services",
           {"metadata": {"name": "svc"}, "spec": {"ports": [{"port": 80}]}})  # fmt: skip
    if finalizers:
        claim = {"metadata": {"name": "claim", "labels": {"team": "a"}},
                 "spec": {"accessModes": ["ReadWriteOnce"],
                          "resources": {"requests": {"storage": "1Gi"}}}}  # fmt: skip
        create(cluster, f"{api}/persistentvolumeclaims", claim)
        held = {"metadata": {"name": "held", "labels": {"team": "a"},
                             "finalizers": [CLEANUP_FINALIZER]}}  # fmt: skip
        create(cluster, f"{api}/configmaps", held)
        _, claim = cp.request(ADMIN, "GET", f"{api}/persistentvolumeclaims/claim")
        assert PVC_FINALIZER in claim["metadata"]["finalizers"]  # the admission plugin's
    return name


def applied(cluster: LabelRbacCluster, documents: list[dict[str, Any]]) -> bool:
    try:
        cluster.control_plane.apply(ADMIN, documents)
    except RuntimeError as exc:
        assert "cannot be written yet" in str(exc), exc
        return False
    return True


def marked(cluster: LabelRbacCluster, namespace: str) -> bool:
    _, ns = cluster.control_plane.request(ADMIN, "GET", f"/api/v1/namespaces/{namespace}")
    return bool(ns.get("metadata", {}).get("labels", {}).get(MARK) == "true")


def controllers(cluster: LabelRbacCluster) -> list[FinalizerController]:
    cp = cluster.control_plane
    return [
        FinalizerController(cp, PVC_PROTECTION, "persistentvolumeclaims", PVC_FINALIZER),
        FinalizerController(cp, CLEANUP, "configmaps", CLEANUP_FINALIZER),
    ]


ORDERS = ("first", "middle", "last")


@pytest.mark.parametrize("finalizers", [pytest.param(False, id="no-finalizers"),
                                        pytest.param(True, id="finalizers")])  # fmt: skip
@pytest.mark.parametrize("where", ORDERS, ids=[f"params-{w}" for w in ORDERS])
def test_a_compiled_namespace_is_deleted_in_every_order(
    kube: tuple[LabelRbacCluster, Compilers],
    resources: list[Resource],
    where: str,
    finalizers: bool,
) -> None:
    cluster, _ = kube
    namespace = compiled_namespace(cluster, finalizers)
    delete_namespace(
        cluster.control_plane, namespace, params_at(resources, where), controllers(cluster)
    )


def test_a_compiled_namespace_is_deleted_with_the_compiler_stopped(
    kube: tuple[LabelRbacCluster, Compilers], resources: list[Resource]
) -> None:
    cluster, compilers = kube
    namespace = compiled_namespace(cluster, finalizers=True)
    compilers.kill("compiler")
    try:
        delete_namespace(
            cluster.control_plane, namespace, params_at(resources, "first"), controllers(cluster)
        )
    finally:
        compilers.start("compiler", *LEASE)


def test_a_compiled_namespace_is_deleted_once_the_webhook_is_back(
    kube: tuple[LabelRbacCluster, Compilers], resources: list[Resource]
) -> None:
    """With the webhook down, what it judges there (the ServiceAccount, claims) fails closed;
    once it is back, the deletion ends."""
    cluster, _ = kube
    namespace = compiled_namespace(cluster, finalizers=True)
    assert cluster.webhook is not None
    cluster.webhook.process.terminate()
    cluster.webhook.process.wait(30)

    def back_after_three(passes: int) -> None:
        if passes == 3:
            path = f"/api/v1/namespaces/{namespace}"
            status, _ = cluster.control_plane.request(ADMIN, "GET", path)
            assert status == 200, "deleted while the webhook that judges its accounts was down"
            cluster.restart_webhook()

    try:
        controller = delete_namespace(
            cluster.control_plane,
            namespace,
            params_at(resources, "first"),
            controllers(cluster),
            timeout=60,
            between=back_after_three,
        )
    finally:
        if cluster.webhook is None or cluster.webhook.process.poll() is not None:
            cluster.restart_webhook()
    assert any("failed calling webhook" in e for e in controller.errors), controller.errors


def test_a_delegated_namespace_is_deleted(
    kube: tuple[LabelRbacCluster, Compilers], resources: list[Resource]
) -> None:
    """A warn-mode role leaves the namespace to the webhook (not marked), its parameters exist
    all the same: the policy stands aside once they are deleted, the webhook judges the rest."""
    cluster, _ = kube
    namespace = compiled_namespace(cluster, finalizers=True, mode="warn")
    assert not marked(cluster, namespace)
    delete_namespace(
        cluster.control_plane, namespace, params_at(resources, "first"), controllers(cluster)
    )


def relabel(cluster: LabelRbacCluster, namespace: str, name: str, team: str) -> tuple[int, str]:
    return request(
        cluster,
        "alice",
        "PATCH",
        f"/api/v1/namespaces/{namespace}/configmaps/{name}",
        {"metadata": {"labels": {"team": team}}},
        "application/merge-patch+json",
    )


def test_a_tenant_cannot_relabel_into_another_bucket_in_a_namespace_being_deleted(
    kube: tuple[LabelRbacCluster, Compilers], resources: list[Resource]
) -> None:
    cluster, _ = kube
    cp = cluster.control_plane
    namespace = compiled_namespace(cluster, finalizers=False)
    api = f"/api/v1/namespaces/{namespace}/configmaps"
    for name, team in (("mine", "a"), ("theirs", "b")):
        held = {"metadata": {"name": name, "labels": {"team": team},
                             "finalizers": [CLEANUP_FINALIZER]}}  # fmt: skip
        create(cluster, api, held)
    assert relabel(cluster, namespace, "mine", "b")[0] == 403  # the policy, as anywhere
    status, message = request(cluster, ADMIN, "DELETE", f"/api/v1/namespaces/{namespace}")
    assert status == 200, message
    # The namespace controller has reached the parameters, not the rest yet.
    (params,) = [r for r in resources if r.name == "labelrbacparams"]
    NamespaceController(cp).sweep(namespace, [params])
    assert cp.request(ADMIN, "GET", PARAMS.format(ns=namespace))[0] == 404
    refusal = (
        f'may not change the labels of configmaps "{{name}}" in namespace "{namespace}": the '
        "namespace is being deleted, and its compiled label permissions, deleted with it, no "
        "longer judge a change of labels there"
    )
    for name, team in (("mine", "b"), ("theirs", "a"), ("mine", "a2")):
        status, message = relabel(cluster, namespace, name, team)
        assert status == 403 and refusal.format(name=name) in message, message
        assert f"ValidatingAdmissionPolicy '{TERMINATING}'" in message
    # What the deletion needs passes, for anyone RBAC lets: a write that keeps the labels, here
    # alice's of another team's object (docs/security.md says so: the namespace controller is
    # deleting it anyway, and nothing can be created in its place).
    status, message = request(
        cluster, "alice", "PATCH", f"{api}/theirs", {"data": {"k": "v"}},
        "application/merge-patch+json",
    )  # fmt: skip
    assert status == 200, message
    # And the custom controller lets its objects go.
    cleanup = FinalizerController(cp, CLEANUP, "configmaps", CLEANUP_FINALIZER)
    cleanup.release(namespace)
    assert not cleanup.errors
    run_deletion(cp, namespace, params_at(resources, "middle"), [cleanup])


def test_a_namespace_not_being_deleted_still_fails_closed_without_parameters(
    kube: tuple[LabelRbacCluster, Compilers],
) -> None:
    """With the compiler stopped, a new namespace has no parameters and no mark: the webhook
    judges its writes, and no one but the compiler may mark it compiled."""
    cluster, compilers = kube
    compilers.kill("compiler")
    try:
        name = f"n-{secrets.token_hex(4)}"
        create(cluster, "/api/v1/namespaces", {"metadata": {"name": name}})
        cluster.control_plane.apply(ADMIN, tenants(name))
        body = {"metadata": {"name": "c", "labels": {"team": "b"}}}
        path = f"/api/v1/namespaces/{name}/configmaps?dryRun=All"
        wait_for(lambda: request(cluster, "alice", "POST", path, body)[0] == 403, "the webhook")
        _, message = request(cluster, "alice", "POST", path, body)
        assert 'admission webhook "labels.labelrbac.io" denied' in message, message
        assert cluster.control_plane.request(ADMIN, "GET", PARAMS.format(ns=name))[0] == 404
        status, message = request(
            cluster, ADMIN, "PATCH", f"/api/v1/namespaces/{name}",
            {"metadata": {"labels": {MARK: "true"}}}, "application/merge-patch+json",
        )  # fmt: skip
        assert status == 403 and f"ValidatingAdmissionPolicy '{MARK_OWNER}'" in message, message
        assert f"only the compiler ({COMPILER}) does" in message
        marked_ns = {"metadata": {"name": f"{name}-m", "labels": {MARK: "true"}}}
        status, message = request(cluster, ADMIN, "POST", "/api/v1/namespaces", marked_ns)
        assert status == 403 and MARK_OWNER in message, message
    finally:
        compilers.start("compiler", *LEASE)


def test_a_tenant_cannot_switch_judging_off_by_deleting_the_parameters(
    kube: tuple[LabelRbacCluster, Compilers],
) -> None:
    """Where there are none the policy stands aside: the guard refuses their deletion whatever
    RBAC grants (here every resource of the namespace)."""
    cluster, _ = kube
    name = compiled_namespace(cluster, finalizers=False)
    everything = role("everything", name, [rule("*", "*", "*")])
    cluster.control_plane.apply(
        ADMIN, rbac(everything, binding("dana-all", "everything", "User:dana", namespace=name))
    )
    wait_for(
        lambda: (
            "label-rbac-params" in request(cluster, "dana", "DELETE", PARAMS.format(ns=name))[1]
        ),
        "RBAC to let dana reach the guard",
    )
    status, message = request(cluster, "dana", "DELETE", PARAMS.format(ns=name))
    assert status == 403 and "ValidatingAdmissionPolicy 'label-rbac-params'" in message, message
    assert cluster.control_plane.request(ADMIN, "GET", PARAMS.format(ns=name))[0] == 200


@pytest.mark.parametrize(
    ("controller", "verbs", "resource"),
    [
        pytest.param(NAMESPACE_CONTROLLER, {"delete", "deletecollection"}, "*", id="namespaces"),
        pytest.param(PVC_PROTECTION, {"update"}, "persistentvolumeclaims", id="pvc-protection"),
    ],
)
def test_the_emulated_controllers_hold_their_bootstrap_roles(
    kube: tuple[LabelRbacCluster, Compilers], controller: Any, verbs: set[str], resource: str
) -> None:
    """The identities the controllers are run under here are the ones the API server's
    bootstrap RBAC binds ``system:controller:<name>`` to, with what they do here."""
    cluster, _ = kube
    name = controller.name.rsplit(":", 1)[1]
    path = f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/system:controller:{name}"
    status, bound = cluster.control_plane.request(ADMIN, "GET", path)
    assert status == 200, bound
    assert {"kind": "ServiceAccount", "name": name, "namespace": "kube-system"} in bound["subjects"]
    _, granted = cluster.control_plane.request(ADMIN, "GET", path.replace("bindings", "s"))
    assert any(
        verbs <= set(r["verbs"]) and resource in r.get("resources", ()) for r in granted["rules"]
    ), granted["rules"]
