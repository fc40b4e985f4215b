"""kube-controller-manager's controllers that delete a namespace, emulated for the test tier.

The tier runs no controller manager, so the requests these controllers make are made here as they
make them, under the identities they use with ``--use-service-account-credentials`` (as kubeadm
runs them) and the API server's bootstrap RBAC for those identities
(``system:controller:namespace-controller``, ``system:controller:pvc-protection-controller``):

- the namespace controller (``pkg/controller/namespace/deletion``): in each pass, for every
  namespaced resource discovery lists with the ``delete`` verb (preferred versions), a collection
  delete with background propagation (a list and a delete of each object where ``deletecollection``
  is not served), then a list of what remains; a pass with errors or objects left without
  finalizers is an error, one with finalizers left waits; once nothing remains, it removes its
  ``kubernetes`` finalizer through ``namespaces/finalize``, which deletes the Namespace. Its
  resources come from a Go map, so their order differs from pass to pass: ``order`` forces one.
- the PVC-protection controller: removes ``kubernetes.io/pvc-protection`` from a claim being
  deleted that no pod uses (no pod runs here) with an update of the whole claim;
- a custom finalizer's controller: removes its finalizer from the objects being deleted with an
  update, as a controller-runtime reconciler does.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tests.kube.controlplane import ADMIN, ControlPlane, User, service_account

NAMESPACE_CONTROLLER = service_account("kube-system", "namespace-controller")
PVC_PROTECTION = service_account("kube-system", "pvc-protection-controller")
PVC_FINALIZER = "kubernetes.io/pvc-protection"
BACKGROUND = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}


@dataclass(frozen=True)
class Resource:
    """A namespaced resource as discovery lists it: its collection's path prefix and verbs."""

    name: str
    group_version: str
    verbs: frozenset[str]

    @property
    def key(self) -> str:
        group = self.group_version.rpartition("/")[0]
        return self.name + (f".{group}" if group else "")

    def collection(self, namespace: str) -> str:
        root = "/api" if self.group_version == "v1" else "/apis"
        return f"{root}/{self.group_version}/namespaces/{namespace}/{self.name}"


def deletable(cp: ControlPlane, user: str) -> list[Resource]:
    """The namespaced resources of the preferred versions that can be deleted, as the namespace
    controller discovers them."""
    versions = ["v1"]
    _, groups = cp.request(user, "GET", "/apis")
    versions += [g["preferredVersion"]["groupVersion"] for g in groups["groups"]]
    found = []
    for version in versions:
        root = "/api" if version == "v1" else "/apis"
        status, listing = cp.request(user, "GET", f"{root}/{version}")
        assert status == 200, (version, listing)
        for item in listing["resources"]:
            verbs = frozenset(item.get("verbs", ()))
            if item["namespaced"] and "/" not in item["name"] and "delete" in verbs:
                found.append(Resource(item["name"], version, verbs))
    return found


@dataclass
class NamespaceController:
    """The namespace controller's deletion of one namespace, pass by pass."""

    cp: ControlPlane
    user: str = NAMESPACE_CONTROLLER.name
    errors: list[str] = field(default_factory=list)

    def sweep(self, namespace: str, resources: Sequence[Resource]) -> bool:
        """One pass over ``resources``, in that order; whether it found the namespace empty."""
        clean = True
        for resource in resources:
            failed = self._delete_all(namespace, resource)
            if failed:
                self.errors.append(f"{resource.key}: {failed}")
                clean = False
                continue
            status, remaining = self.cp.request(self.user, "GET", resource.collection(namespace))
            if status != 200:
                self.errors.append(f"{resource.key}: list {status}")
                clean = False
            elif remaining["items"]:
                clean = False
        return clean

    def _delete_all(self, namespace: str, resource: Resource) -> str:
        path = resource.collection(namespace)
        if "deletecollection" in resource.verbs:
            status, answer = self.cp.request(self.user, "DELETE", path, BACKGROUND)
            return "" if status < 300 else _message(status, answer)
        status, listed = self.cp.request(self.user, "GET", path)
        if status != 200:
            return _message(status, listed)
        for item in listed["items"]:
            status, answer = self.cp.request(
                self.user, "DELETE", f"{path}/{item['metadata']['name']}", BACKGROUND
            )
            if status >= 300 and status != 404:
                return _message(status, answer)
        return ""

    def finalize(self, namespace: str) -> bool:
        """Remove the ``kubernetes`` finalizer: the Namespace is deleted with it."""
        status, ns = self.cp.request(self.user, "GET", f"/api/v1/namespaces/{namespace}")
        if status == 404:
            return True
        ns["spec"]["finalizers"] = [
            f for f in ns["spec"].get("finalizers", []) if f != "kubernetes"
        ]
        status, answer = self.cp.request(
            self.user, "PUT", f"/api/v1/namespaces/{namespace}/finalize", ns
        )
        if status >= 300:
            self.errors.append(f"finalize: {_message(status, answer)}")
            return False
        return True


def _message(status: int, answer: Any) -> str:
    return f"{status} {answer.get('message', answer) if isinstance(answer, dict) else answer}"


@dataclass
class FinalizerController:
    """A controller removing ``finalizer`` from the objects of ``resource`` being deleted, with
    an update of the whole object (the PVC-protection controller, a custom one)."""

    cp: ControlPlane
    user: User
    resource: str
    finalizer: str
    errors: list[str] = field(default_factory=list)

    def release(self, namespace: str) -> None:
        path = f"/api/v1/namespaces/{namespace}/{self.resource}"
        status, listed = self.cp.request(self.user.name, "GET", path)
        if status != 200:
            self.errors.append(f"list {_message(status, listed)}")
            return
        for item in listed["items"]:
            meta = item["metadata"]
            if "deletionTimestamp" not in meta or self.finalizer not in meta.get("finalizers", []):
                continue
            meta["finalizers"] = [f for f in meta["finalizers"] if f != self.finalizer]
            status, answer = self.cp.request(self.user.name, "PUT", f"{path}/{meta['name']}", item)
            if status >= 300:
                self.errors.append(f"{meta['name']}: {_message(status, answer)}")


def params_at(resources: Sequence[Resource], where: str) -> list[Resource]:
    """``resources`` sorted by name, the compiled parameters moved ``first`` or ``last`` (in
    ``middle``, their place by name: after configmaps, before claims and secrets)."""
    ordered = sorted(resources, key=lambda r: r.key)
    params = [r for r in ordered if r.name == "labelrbacparams"]
    rest = [r for r in ordered if r.name != "labelrbacparams"]
    assert params, "the parameters' resource is not served"
    return {"first": params + rest, "last": rest + params, "middle": ordered}[where]


def delete_namespace(
    cp: ControlPlane,
    namespace: str,
    order: Sequence[Resource],
    finalizers: Sequence[FinalizerController] = (),
    timeout: float = 30,
    between: Callable[[int], None] = lambda _: None,
) -> NamespaceController:
    """Delete ``namespace`` as an administrator does, then ``run_deletion``."""
    status, answer = cp.request(ADMIN, "DELETE", f"/api/v1/namespaces/{namespace}")
    assert status == 200, answer
    return run_deletion(cp, namespace, order, finalizers, timeout, between)


def run_deletion(
    cp: ControlPlane,
    namespace: str,
    order: Sequence[Resource],
    finalizers: Sequence[FinalizerController] = (),
    timeout: float = 30,
    between: Callable[[int], None] = lambda _: None,
) -> NamespaceController:
    """Run the controllers on ``namespace``, being deleted, until the namespace controller has
    finalized it (``between(n)`` after pass ``n``). Raises AssertionError with what each
    controller was refused when it does not end in ``timeout``."""
    controller = NamespaceController(cp)
    deadline = time.monotonic() + timeout
    passes = 0
    while True:
        empty = controller.sweep(namespace, order)
        for other in finalizers:
            other.release(namespace)
        if empty and controller.finalize(namespace):
            gone = cp.request(ADMIN, "GET", f"/api/v1/namespaces/{namespace}")[0] == 404
            if gone:
                return controller
        passes += 1
        between(passes)
        if time.monotonic() > deadline:
            refused = [*controller.errors[-5:], *(e for f in finalizers for e in f.errors[-3:])]
            raise AssertionError(
                f"namespace {namespace} still there after {passes} passes: " + "; ".join(refused)
            )
        time.sleep(0.2)
