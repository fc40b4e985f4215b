"""The Helm chart through a real kube-apiserver: ``helm install``, ``upgrade`` and ``uninstall``.

The official helm binary installs ``charts/label-rbac`` into a loopback control plane as a
platform team would (``--create-namespace --wait``). There is no kubelet or controller manager:
the webhook and the compiler run as processes with the arguments and the identities of the
Deployments the chart rendered, and once they answer the test writes the Deployments' status as
their controller would, which is what ``--wait`` waits for. The registration reaches the webhook
through the chart's ``webhook.url`` and ``certificates.source=existingSecret`` (its CA), as for a
webhook run outside the cluster.

One control plane for the module: the default install, judged, upgraded under load, removed;
then the same cluster gets the compiled path under another name prefix and namespace
(``acme-lr`` in ``policy``), judged by the policy, removed. After each removal an admin and a
tenant write in an existing and in a new namespace, and nothing of label-rbac is left but what
docs/install.md says stays.
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import shlex
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.compiled.compiler import FIELD_MANAGER
from app.compiled.registration import COMPILED_ENTRY
from app.engine.params import SOFTENED_MARK
from app.webhook.certs import CertPaths, generate
from tests import helm
from tests.kube.cluster import Compilers, LabelRbacCluster
from tests.kube.cluster import kustomize as cluster_kustomize
from tests.kube.conftest import require, require_control_plane, wait_for
from tests.kube.controlplane import ADMIN, DEFAULT_USERS, ControlPlane, User, service_account
from tests.kube.support import eventually, example_tenants
from tests.process import Server, free_port, launch, stop
from tests.support import ROOT

RELEASE = "label-rbac"
CHART = helm.CHART
COMPILER = service_account("label-rbac", "label-rbac-compiler")
RENAMED_WEBHOOK = service_account("policy", "acme-lr")
RENAMED_COMPILER = service_account("policy", "acme-lr-compiler")
# The post-install Job's (templates/enforce-hook.yaml).
HOOKS = (
    service_account("label-rbac", "label-rbac-enforce"),
    service_account("policy", "acme-lr-enforce"),
    # The pre-upgrade Job's (templates/keep-policies-hook.yaml).
    service_account("label-rbac", "label-rbac-keep-policies"),
    # The post-delete Job's (templates/remove-policies-hook.yaml).
    service_account("label-rbac", "label-rbac-remove-policies"),
    service_account("policy", "acme-lr-remove-policies"),
)
# The install on a cluster without cert-manager (its own namespace).
BARE_WEBHOOK = service_account("bare", "label-rbac")
BARE_ROTATION = service_account("bare", "label-rbac-certs")
# The `helm test` Pod's (templates/tests/webhook-test.yaml).
TESTER = service_account("label-rbac", "label-rbac-test")
REPORTER = service_account("label-rbac", "label-rbac-reporter")
USERS: tuple[User, ...] = (
    *DEFAULT_USERS, COMPILER, RENAMED_WEBHOOK, RENAMED_COMPILER, *HOOKS, BARE_WEBHOOK,
    BARE_ROTATION, TESTER, REPORTER,
)  # fmt: skip
# The report CRDs (wgpolicyk8s.io), as Policy Reporter's chart installs them.
REPORT_CRDS = ROOT.parent / "shared" / "fixtures" / "policy-reports"
CLUSTER_REPORT = "/apis/wgpolicyk8s.io/v1alpha2/clusterpolicyreports/label-rbac"
# The previous release of the chart (0.2.0), which `helm upgrade --reuse-values` upgrades from.
PREVIOUS_RELEASE = "f764e3fe839dea68aa56ad4845b95ea538e254c2"
POLICIES = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"


@dataclass
class Install:
    """One release of the chart in ``namespace`` under the name prefix ``name``, its webhook and
    compiler as processes."""

    cp: ControlPlane
    workdir: Path
    namespace: str
    name: str
    sets: list[str] = field(default_factory=list)
    webhook: Server | None = None
    compilers: Compilers | None = None
    probes = 0  # the compiler's probe port

    def __post_init__(self) -> None:
        self.port = free_port()
        self.tls: CertPaths = generate(
            self.workdir / f"tls-{self.name}",
            [f"{self.name}.{self.namespace}.svc", "127.0.0.1", "localhost"],
        )
        self.home = self.workdir / "helm-home"

    def values(self) -> list[str]:
        ca = base64.b64encode(self.tls.ca.read_bytes()).decode()
        return [
            f"name={self.name}",
            f"webhook.url=https://127.0.0.1:{self.port}",
            "certificates.source=existingSecret",
            f"certificates.existingSecret.name={self.name}-tls",
            f"certificates.existingSecret.caBundle={ca}",
            *self.sets,
        ]

    def helm(self, *args: str, background: bool = False) -> subprocess.Popen[str]:
        env = {
            **os.environ,
            "KUBECONFIG": str(self.cp.kubeconfig(ADMIN)),
            "HELM_CONFIG_HOME": str(self.home / "config"),
            "HELM_CACHE_HOME": str(self.home / "cache"),
            "HELM_DATA_HOME": str(self.home / "data"),
        }
        command = [str(helm.helm_or_skip()), *args, "--namespace", self.namespace]
        process = subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        if not background:
            finish(process)
        return process

    def install(
        self, *extra: str, background: bool = False, chart: Path = CHART
    ) -> subprocess.Popen[str]:
        sets = [a for v in self.values() for a in ("--set", v)]
        return self.helm(
            "install", RELEASE, str(chart), "--create-namespace", "--wait",
            "--timeout", "120s", *sets, *extra, background=background,
        )  # fmt: skip

    def upgrade(
        self, *extra: str, background: bool = False, chart: Path = CHART
    ) -> subprocess.Popen[str]:
        return self.helm(
            "upgrade", RELEASE, str(chart), "--reuse-values", "--wait",
            "--timeout", "120s", *extra, background=background,
        )  # fmt: skip

    def rolled_out(self, process: subprocess.Popen[str]) -> str:
        """``helm ... --wait`` in ``process`` finished, each new revision of a Deployment
        reported available as its controller would once its pods are ready."""
        deadline = time.monotonic() + 120
        while process.poll() is None and time.monotonic() < deadline:
            # A write of helm's in between (409): again, next round.
            with contextlib.suppress(AssertionError):
                self.mark_ready()
            time.sleep(0.5)
        return finish(process)

    def deployment(self, name: str) -> dict[str, Any]:
        status, found = self.cp.request(
            ADMIN, "GET", f"/apis/apps/v1/namespaces/{self.namespace}/deployments/{name}"
        )
        assert status == 200, found
        return dict(found)

    def args(self, name: str) -> list[str]:
        """The container's arguments as the chart rendered them, for a process."""
        (container,) = self.deployment(name)["spec"]["template"]["spec"]["containers"]
        return [str(a) for a in container["args"]]

    def start(self) -> None:
        """The webhook (and the compiler, if the chart rendered it) as the pods would run."""
        self.start_webhook()
        self.start_compiler()

    def start_webhook(self, wait: bool = True) -> None:
        rendered = self.args(self.name)
        assert rendered[0] == "serve"
        # TLS and the address are the process's own (launch); no drain in a test.
        own = ("--tls-cert=", "--tls-key=", "--bind=", "--drain-seconds=")
        args = [a for a in rendered[1:] if not a.startswith(own)]
        user = f"system:serviceaccount:{self.namespace}:{self.name}"
        self.webhook = launch(
            self.workdir, "--kubeconfig", str(self.cp.kubeconfig(user)), *args,
            tls=(self.tls.ca, self.tls.cert, self.tls.key), port=self.port,
            log_name=f"webhook-{self.name}.log",
        )  # fmt: skip
        if wait:
            self.webhook.wait_ready()

    def start_compiler(self, root: Path = ROOT) -> None:
        """The compiler's replicas as the Deployment's pods (``root``: the tree whose code they
        run, an earlier release's image)."""
        compiler = f"{self.name}-compiler"
        status, _ = self.cp.request(
            ADMIN, "GET", f"/apis/apps/v1/namespaces/{self.namespace}/deployments/{compiler}"
        )
        if status == 200:
            rendered = self.args(compiler)
            assert rendered[0] == "compile"
            identity = "--identity=$(POD_NAME)"
            assert identity in rendered
            # Its probes on a free loopback port rather than the pod's.
            self.probes = free_port()
            args = [a for a in rendered[1:] if a != identity and not a.startswith("--probe-bind=")]
            assert len(args) == len(rendered) - 3, rendered
            user = f"system:serviceaccount:{self.namespace}:{compiler}"
            self.compilers = Compilers(self.cp, self.workdir, user, root)
            self.compilers.start(f"{compiler}-0", *args, f"--probe-bind=127.0.0.1:{self.probes}")

    def mark_ready(self) -> None:
        """Every Deployment of the release available, as the Deployment controller reports it
        once its pods are ready (what ``helm --wait`` waits for)."""
        path = f"/apis/apps/v1/namespaces/{self.namespace}/deployments"
        _, listing = self.cp.request(ADMIN, "GET", path)
        for deployment in listing["items"]:
            replicas = deployment["spec"]["replicas"]
            deployment["status"] = {
                "observedGeneration": deployment["metadata"]["generation"],
                "replicas": replicas,
                "updatedReplicas": replicas,
                "readyReplicas": replicas,
                "availableReplicas": replicas,
                "conditions": [
                    {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"},
                    {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"},
                ],
            }
            name = deployment["metadata"]["name"]
            status, answer = self.cp.request(ADMIN, "PUT", f"{path}/{name}/status", deployment)
            assert status == 200, answer

    def run_hook(self, timeout: float = 60, job: str = "enforce") -> None:
        """A hook's Job (the post-install one, or ``job``), as the Job controller and a kubelet
        would run it: each container in order (kubectl, the rendered arguments) as the Job's
        ServiceAccount, then the Job's status Complete."""
        path = f"/apis/batch/v1/namespaces/{self.namespace}/jobs/{self.name}-{job}"
        wait_for(lambda: self.cp.request(ADMIN, "GET", path)[0] == 200, "the hook", timeout)
        _, job = self.cp.request(ADMIN, "GET", path)
        pod = job["spec"]["template"]["spec"]
        user = f"system:serviceaccount:{self.namespace}:{pod['serviceAccountName']}"
        for container in [*pod.get("initContainers", ()), *pod["containers"]]:
            done = self.cp.kubectl(user, *container["args"], timeout=timeout)
            assert done.returncode == 0, (container["name"], done.stderr)
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        job["status"] = {
            "startTime": now,
            "completionTime": now,
            "succeeded": 1,
            "conditions": [
                {"type": t, "status": "True", "lastTransitionTime": now}
                for t in ("SuccessCriteriaMet", "Complete")
            ],
        }
        status, answer = self.cp.request(ADMIN, "PUT", f"{path}/status", job)
        assert status == 200, answer

    def helm_test(self, timeout: float = 120) -> str:
        """``helm test``, its Pod run as a kubelet would: the init container (kubectl) and the
        container's command (the image's python, here the repository's) in order, as the
        Pod's ServiceAccount, then its phase Succeeded; helm's output."""
        testing = self.helm("test", RELEASE, "--timeout", f"{int(timeout)}s", background=True)
        path = f"/api/v1/namespaces/{self.namespace}/pods/{self.name}-test"
        wait_for(lambda: self.cp.request(ADMIN, "GET", path)[0] == 200, "the test Pod", timeout)
        _, pod = self.cp.request(ADMIN, "GET", path)
        spec = pod["spec"]
        user = f"system:serviceaccount:{self.namespace}:{spec['serviceAccountName']}"
        for init in spec["initContainers"]:
            done = self.cp.kubectl(user, *init["args"], timeout=timeout)
            assert done.returncode == 0, (init["name"], done.stderr)
        (container,) = spec["containers"]
        assert container["command"] == ["/opt/label-rbac/bin/python", "-c"]
        ran = subprocess.run(
            [sys.executable, "-c", *container["args"]],
            capture_output=True, text=True, timeout=timeout,
            env={**os.environ, "KUBECONFIG": str(self.cp.kubeconfig(user))},
        )  # fmt: skip
        assert ran.returncode == 0, ran.stdout + ran.stderr
        pod["status"] = {"phase": "Succeeded"}
        status, answer = self.cp.request(ADMIN, "PUT", f"{path}/status", pod)
        assert status == 200, answer
        return finish(testing) + ran.stdout

    def uninstall(self) -> None:
        """``helm uninstall --wait``, running the post-delete Job of the compiled rule (which
        deletes the policies the compiler wrote) when the chart rendered one."""
        removing = self.helm("uninstall", RELEASE, "--wait", background=True)
        if "compiled.enabled=true" in self.sets:
            self.run_hook(job="remove-policies")
        finish(removing)

    def stop(self) -> None:
        """The pods gone (after ``helm uninstall`` deleted their Deployments)."""
        if self.compilers is not None:
            self.compilers.stop_all()
        if self.webhook is not None:
            stop(self.webhook.process)


FAILING_CLOSED = {
    "labels.labelrbac.io": "Fail",
    "rbac.labelrbac.io": "Fail",
    "nodes.labelrbac.io": "Fail",
    "pod-status.labelrbac.io": "Ignore",
    "node-objects.labelrbac.io": "Ignore",
}


def compiler_policy(cp: ControlPlane, name: str) -> dict[str, Any]:
    """The policy ``name`` as the compiler wrote it: its field manager's apply holds the
    ClusterRoleBindings' part (``clusterChunks``)."""
    status, found = cp.request(ADMIN, "GET", f"{POLICIES}/{name}")
    assert status == 200, found
    applies = [
        m for m in found["metadata"]["managedFields"]
        if m["manager"] == FIELD_MANAGER and m["operation"] == "Apply"
    ]  # fmt: skip
    assert len(applies) == 1, found["metadata"]["managedFields"]
    (applied,) = applies
    variables = applied["fieldsV1"]["f:spec"]["f:variables"]
    assert 'k:{"name":"clusterChunks"}' in variables, variables
    assert "clusterChunks" in [v["name"] for v in found["spec"]["variables"]]
    return dict(found)


def finish(process: subprocess.Popen[str], timeout: float = 180) -> str:
    output, _ = process.communicate(timeout=timeout)
    assert process.returncode == 0, output
    return output


def failure_policies(cp: ControlPlane, name: str) -> dict[str, str]:
    path = f"/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/{name}"
    _, config = cp.request(ADMIN, "GET", path)
    return {w["name"]: w["failurePolicy"] for w in config["webhooks"]}


def configmap(cp: ControlPlane, user: str, namespace: str, labels: dict[str, str]) -> str:
    """A ConfigMap created by ``user`` (a real write): "" when allowed, else the message."""
    body = {"metadata": {"generateName": "w-", "labels": labels}, "data": {"k": "v"}}
    status, answer = cp.request(user, "POST", f"/api/v1/namespaces/{namespace}/configmaps", body)
    return "" if status == 201 else f"{status} {answer.get('message', answer)}"


def new_namespace(cp: ControlPlane, name: str) -> None:
    status, answer = cp.request(ADMIN, "POST", "/api/v1/namespaces", {"metadata": {"name": name}})
    assert status == 201, answer


def tenants(cp: ControlPlane, namespace: str) -> None:
    cp.apply(ADMIN, example_tenants(namespace))


def alice_judged(cp: ControlPlane, namespace: str, by: str = "") -> None:
    """alice (team=a) is refused an unlabeled ConfigMap and allowed a team=a one; ``by``: the
    refusal comes from this policy."""
    refused = configmap(cp, "alice", namespace, {})
    assert refused.startswith("403") and "team in [a]" in refused, refused
    if by:
        assert f"ValidatingAdmissionPolicy '{by}'" in refused, refused
    assert configmap(cp, "alice", namespace, {"team": "a"}) == ""


class Load:
    """bob (team=b) creating labeled ConfigMaps in ``namespace`` as fast as one client does,
    until stopped: the writes that failed, and how many there were. With ``refused``, alice
    creating unlabeled ones instead: the writes that passed."""

    def __init__(self, cp: ControlPlane, namespace: str, refused: bool = False) -> None:
        self.cp, self.namespace, self.refused = cp, namespace, refused
        self.failures: list[str] = []
        self.writes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        user, labels = ("alice", {}) if self.refused else ("bob", {"team": "b"})
        while not self._stop.is_set():
            answer = configmap(self.cp, user, self.namespace, labels)
            self.writes += 1
            if self.refused and not answer.startswith("403"):
                self.failures.append(answer or "allowed")
            elif not self.refused and answer:
                self.failures.append(answer)
            time.sleep(0.02)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def leftovers(cp: ControlPlane) -> dict[str, list[str]]:
    """What of label-rbac is in the cluster: cluster-scoped objects by kind."""
    found: dict[str, list[str]] = {}
    admission = "admissionregistration.k8s.io/v1/"
    for kind, path in (
        ("ValidatingWebhookConfiguration", admission + "validatingwebhookconfigurations"),
        ("ValidatingAdmissionPolicy", admission + "validatingadmissionpolicies"),
        ("ValidatingAdmissionPolicyBinding", admission + "validatingadmissionpolicybindings"),
        ("ClusterRole", "rbac.authorization.k8s.io/v1/clusterroles"),
        ("ClusterRoleBinding", "rbac.authorization.k8s.io/v1/clusterrolebindings"),
        ("PriorityClass", "scheduling.k8s.io/v1/priorityclasses"),
        ("CustomResourceDefinition", "apiextensions.k8s.io/v1/customresourcedefinitions"),
    ):
        _, listing = cp.request(ADMIN, "GET", f"/apis/{path}")
        names = [
            i["metadata"]["name"]
            for i in listing["items"]
            if "label-rbac" in i["metadata"]["name"]
            or "acme-lr" in i["metadata"]["name"]
            or "labelrbac.io" in i["metadata"]["name"]
        ]
        if names:
            found[kind] = sorted(names)
    return found


def removed_cleanly(cp: ControlPlane, existing: str, fresh: str) -> None:
    """After the removal: writes in an existing and a new namespace, by an admin and a tenant
    (unlabeled: nothing judges labels any more), are all accepted."""
    new_namespace(cp, fresh)
    tenants(cp, fresh)
    for namespace in (existing, fresh):
        for user in (ADMIN, "alice"):
            assert configmap(cp, user, namespace, {}) == "", (user, namespace)


@pytest.fixture(scope="module")
def cp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    require_control_plane()
    require(helm.binary, "the Helm chart through the API server")
    plane = ControlPlane(tmp_path_factory.mktemp("chart") / "control-plane", users=USERS)
    plane.start()
    try:
        yield plane
    finally:
        plane.stop()


def test_install_upgrade_uninstall(cp: ControlPlane, tmp_path: Path) -> None:
    new_namespace(cp, "t1")
    tenants(cp, "t1")
    release = Install(cp, tmp_path, "label-rbac", "label-rbac")
    try:
        # helm install --wait: the registration exists at once, failing open while nothing
        # answers, so the tenants' writes pass rather than being refused.
        installing = release.install(background=True)
        wait_for(
            lambda: cp.request(ADMIN, "GET", "/apis/admissionregistration.k8s.io/v1/"
                               "validatingwebhookconfigurations/label-rbac")[0] == 200,
            "the registration",
        )  # fmt: skip
        assert set(failure_policies(cp, "label-rbac").values()) == {"Ignore"}
        assert configmap(cp, "alice", "t1", {}) == ""
        assert installing.poll() is None, "helm install --wait returned before the webhook"
        release.start()
        release.mark_ready()
        # Available: the post-install hook switches the registration to fail closed.
        release.run_hook()
        finish(installing)
        assert failure_policies(cp, "label-rbac") == FAILING_CLOSED
        eventually(lambda: alice_judged(cp, "t1"))

        # The narrowing, without the compiled policies: the compiler (--registration-only)
        # keeps the label-rule entry off what no annotation restricts, so with the webhook
        # down an unrestricted write passes and a restricted one is refused.
        eventually(lambda: skips(cp, "label-rbac", "services"), timeout=30)
        assert release.webhook is not None
        stop(release.webhook.process)
        service = {"metadata": {"generateName": "s-"}, "spec": {"ports": [{"port": 80}]}}
        status, answer = cp.request(ADMIN, "POST", "/api/v1/namespaces/t1/services", service)
        assert status == 201, answer
        refused = configmap(cp, ADMIN, "t1", {})
        assert refused.startswith("500") and "failed calling webhook" in refused, refused
        release.start_webhook()

        # helm upgrade: still failing closed, and no write refused on the way.
        with Load(cp, "t1") as load:
            release.upgrade()
            release.mark_ready()  # the new revision's rollout, done
            release.upgrade("--set", "webhook.timeoutSeconds=4")
        print(f"upgrades under load: {load.writes} writes, {len(load.failures)} refused")
        assert load.writes > 10 and load.failures == [], load.failures
        assert failure_policies(cp, "label-rbac") == FAILING_CLOSED
        # Helm's upgrades leave the compiler's condition in place (its own field manager).
        skips(cp, "label-rbac", "services")
        alice_judged(cp, "t1")

        with Load(cp, "t1") as load:
            release.helm("uninstall", RELEASE, "--wait")
        assert load.failures == [], load.failures
    finally:
        release.stop()
    assert leftovers(cp) == {}
    removed_cleanly(cp, "t1", "t1-after")


def test_renamed_compiled_install(cp: ControlPlane, tmp_path: Path) -> None:
    """The compiled path as ``acme-lr`` in ``policy``, with the warn and audit policies
    (``compiled.modes``): the policy (by its new name) judges the tenants, the guards name the
    renamed compiler; removed, nothing refuses a write."""
    new_namespace(cp, "t2")
    tenants(cp, "t2")
    release = Install(
        cp,
        tmp_path,
        "policy",
        "acme-lr",
        sets=["compiled.enabled=true", "compiled.modes=true"],
    )
    try:
        installing = release.install(background=True)
        wait_for(lambda: release_deployed(cp, release), "the Deployments", timeout=60)
        release.start()
        release.mark_ready()
        release.run_hook()
        finish(installing)
        assert failure_policies(cp, "acme-lr") == {
            **FAILING_CLOSED,
            "labels-compiled.labelrbac.io": "Fail",
        }
        eventually(lambda: alice_judged(cp, "t2", by="acme-lr"), timeout=30)
        # The compiler's probes: leading with a current watch, and what it wrote.
        probes = f"http://127.0.0.1:{release.probes}"
        assert "leading" in probe(probes + "/readyz")

        def reported() -> None:  # (the RBAC changes of the install itself written, too)
            metrics = probe(probes + "/metrics")
            assert "label_rbac_compiler_leader 1.0" in metrics
            written = re.search(r"^label_rbac_compiler_params_written_total (\S+)$", metrics, re.M)
            assert written is not None and float(written.group(1)) >= 1, metrics
            lags = re.search(r"^label_rbac_compiler_lag_seconds_count (\S+)$", metrics, re.M)
            assert lags is not None and float(lags.group(1)) >= 1, metrics

        eventually(reported, timeout=30)
        # The compiler's skip-unjudged in the compiled entry survives a helm upgrade.
        eventually(lambda: skips(cp, "acme-lr", "services", COMPILED_ENTRY), timeout=30)
        release.upgrade()
        release.mark_ready()
        skips(cp, "acme-lr", "services", COMPILED_ENTRY)
        alice_judged(cp, "t2", by="acme-lr")
        # Only the renamed compiler writes parameters: not even an admin.
        status, answer = cp.request(
            ADMIN, "DELETE", "/apis/labelrbac.io/v1alpha1/namespaces/t2/labelrbacparams/label-rbac"
        )
        assert status == 403 and "system:serviceaccount:policy:acme-lr-compiler" in str(answer)
        # The policy its compiler wrote, under the install's name, leaving its namespace out.
        written = compiler_policy(cp, "acme-lr")
        (own, *_) = written["spec"]["matchConstraints"]["namespaceSelector"]["matchExpressions"]
        assert own["values"] == ["policy", "kube-system"]
        assert cp.request(ADMIN, "GET", f"{POLICIES}/label-rbac")[0] == 404
        # The warn and audit policies, written by the renamed compiler, where a denial is softened.
        for mode in ("warn", "audit"):
            mode_policy = compiler_policy(cp, f"acme-lr-{mode}")
            selector = mode_policy["spec"]["matchConstraints"]["namespaceSelector"]
            assert selector["matchExpressions"][-1]["key"] == SOFTENED_MARK
        with Load(cp, "t2") as load:
            release.uninstall()
        assert load.failures == [], load.failures
    finally:
        release.stop()
    # What stays (docs/install.md, "Uninstall"): the CRD, and with it the parameters, which
    # nothing reads any more. (The compiler's policy: deleted by the post-delete Job.)
    assert leftovers(cp) == {"CustomResourceDefinition": ["labelrbacparams.labelrbac.io"]}
    removed_cleanly(cp, "t2", "t2-after")


def skips(cp: ControlPlane, name: str, resource: str, entry: str = "labels.labelrbac.io") -> None:
    """The registration's label-rule ``entry`` skips ``resource`` (the compiler's condition)."""
    path = f"/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/{name}"
    _, config = cp.request(ADMIN, "GET", path)
    (labels,) = [w for w in config["webhooks"] if w["name"] == entry]
    conditions = {c["name"]: c["expression"] for c in labels.get("matchConditions", ())}
    assert f"'{resource}'" in conditions.get("skip-unjudged", ""), conditions


def probe(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as answer:
        return str(answer.read().decode())


def release_deployed(cp: ControlPlane, release: Install) -> bool:
    path = f"/apis/apps/v1/namespaces/{release.namespace}/deployments"
    status, listing = cp.request(ADMIN, "GET", path)
    return status == 200 and len(listing["items"]) == 2


def documented_overlay_removal() -> list[list[str]]:
    """The commands of docs/install.md, "Uninstall the overlays", paths made absolute."""
    page = (ROOT / "docs" / "install.md").read_text()
    section = page.split("### Uninstall the overlays", 1)[1]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    commands = [shlex.split(line, comments=True) for line in block.splitlines()]
    return [
        [str(ROOT / a) if a.startswith("manifests/") else a for a in command[1:]]
        if command[0] == "kubectl"
        else command
        for command in commands
        if command
    ]


def test_overlay_removal(tmp_path: Path) -> None:
    """manifests/enforce-compiled removed as docs/install.md says, under light load: no write
    refused on the way, nothing left refusing writes after, in an existing and a new
    namespace, and nothing of label-rbac left."""
    require_control_plane()
    users = (*DEFAULT_USERS, COMPILER)
    with LabelRbacCluster(tmp_path, users=users, overlay="enforce-compiled") as kube:
        cp = kube.control_plane
        new_namespace(cp, "t1")
        tenants(cp, "t1")
        compilers = Compilers(cp, tmp_path)
        compilers.start("compiler-0")
        try:
            eventually(lambda: alice_judged(cp, "t1", by="label-rbac"), timeout=30)
            commands = documented_overlay_removal()
            assert [c[:2] for c in commands] == [["delete", "validatingwebhookconfiguration"],
                                                 ["delete", "clusterrolebinding"],
                                                 ["delete", "validatingadmissionpolicybinding,"
                                                  "validatingadmissionpolicy"],
                                                 ["sleep", "5"],
                                                 ["delete", "-k"]]  # fmt: skip
            with Load(cp, "t1") as load:
                for command in commands:
                    if command[0] == "sleep":
                        time.sleep(float(command[1]))
                        continue
                    done = cp.kubectl(ADMIN, *command)
                    # The test cluster has no cert-manager or prometheus-operator CRDs.
                    errors = [
                        line for line in done.stderr.splitlines()
                        if line
                        and "no matches for kind" not in line
                        and line != "ensure CRDs are installed first"
                    ]  # fmt: skip
                    assert errors == [], (command, done.stderr)
            assert load.writes > 0 and load.failures == [], load.failures
        finally:
            compilers.stop_all()
            if kube.webhook is not None:
                stop(kube.webhook.process)
        assert leftovers(cp) == {}
        removed_cleanly(cp, "t1", "t1-after")


def previous_release(into: Path) -> Path:
    """The tree of the previous release (its chart, manifests and code), from git history."""
    archive = subprocess.run(
        ["git", "archive", PREVIOUS_RELEASE, "charts/label-rbac", "app", "manifests"],
        cwd=ROOT,
        capture_output=True,
    )
    if archive.returncode != 0:
        pytest.skip(f"no git history of {PREVIOUS_RELEASE[:7]}: {archive.stderr.decode()}")
    into.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def test_upgrade_from_the_previous_release(cp: ControlPlane, tmp_path: Path) -> None:
    """The previous release with the compiled rule, installed as docs/install.md says and its
    compiler running the previous release's code, then ``helm upgrade --reuse-values`` (its
    values, the new chart) and the new compiler's rollout, under load: no write refused and no
    unlabeled write let through on the way; still failing closed and judging; the policy the
    previous release installed kept (not deleted by Helm) and taken over by the compiler,
    holding the ClusterRoleBindings' part; the new chart's objects (labeled with its version) in
    place; removed by ``helm uninstall`` with its post-delete Job."""
    new_namespace(cp, "t3")
    tenants(cp, "t3")
    # The CRD an earlier install left (docs/install.md, "Uninstall"), removed as documented:
    # another release's, Helm would not take it over.
    crd = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/labelrbacparams.labelrbac.io"
    cp.request(ADMIN, "DELETE", crd)
    wait_for(lambda: cp.request(ADMIN, "GET", crd)[0] == 404, "the CRD gone", timeout=60)
    release = Install(cp, tmp_path, "label-rbac", "label-rbac", sets=["compiled.enabled=true"])
    previous = previous_release(tmp_path / "old")
    try:
        installing = release.install(background=True, chart=previous / "charts" / "label-rbac")
        wait_for(lambda: release_deployed(cp, release), "the Deployments", timeout=60)
        release.start_webhook()
        release.start_compiler(root=previous)
        release.mark_ready()
        release.run_hook()
        finish(installing)
        eventually(lambda: alice_judged(cp, "t3", by="label-rbac"), timeout=60)
        labels = release.deployment("label-rbac")["metadata"]["labels"]
        assert labels["helm.sh/chart"] == "label-rbac-0.2.0", labels
        status, installed = cp.request(ADMIN, "GET", f"{POLICIES}/label-rbac")
        assert status == 200 and "clusterChunks" not in str(installed["spec"]), installed
        with Load(cp, "t3") as load, Load(cp, "t3", refused=True) as unlabeled:
            upgrading = release.upgrade(background=True)
            # Before Helm applies the new chart: the policy annotated to be kept.
            release.run_hook(job="keep-policies")
            release.rolled_out(upgrading)
            # The rollout: the new compiler's pods replace the previous release's.
            assert release.compilers is not None
            release.compilers.stop_all()
            release.start_compiler()
            taken_over = eventually(lambda: compiler_policy(cp, "label-rbac"), timeout=60)
            eventually(lambda: alice_judged(cp, "t3", by="label-rbac"), timeout=30)
        print(f"upgrade from {PREVIOUS_RELEASE[:7]}: {load.writes} writes, "
              f"{unlabeled.writes} unlabeled ones")  # fmt: skip
        assert load.writes > 5 and load.failures == [], load.failures
        assert unlabeled.writes > 5 and unlabeled.failures == [], unlabeled.failures
        assert taken_over["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        version = yaml.safe_load((helm.CHART / "Chart.yaml").read_text())["version"]
        for name in ("label-rbac", "label-rbac-compiler"):
            labels = release.deployment(name)["metadata"]["labels"]
            assert labels["helm.sh/chart"] == f"label-rbac-{version}", name
        assert failure_policies(cp, "label-rbac") == {
            **FAILING_CLOSED,
            COMPILED_ENTRY: "Fail",
        }
        # The binding now pins what the policy may match.
        bindings = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"
        _, bound = cp.request(ADMIN, "GET", f"{bindings}/label-rbac")
        assert bound["spec"]["matchResources"] == taken_over["spec"]["matchConstraints"]
        # The previous release's values kept: the CA bundle of its existing Secret.
        path = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/label-rbac"
        _, config = cp.request(ADMIN, "GET", path)
        ca = base64.b64encode(release.tls.ca.read_bytes()).decode()
        assert {w["clientConfig"]["caBundle"] for w in config["webhooks"]} == {ca}
        skips(cp, "label-rbac", "services")
        # helm test: the webhook available, an unlabeled ConfigMap refused to the test's
        # label-restricted ServiceAccount, a labeled one allowed; its objects gone after.
        output = release.helm_test()
        assert "refused as expected" in output and "Succeeded" in output, output
        roles = "/apis/rbac.authorization.k8s.io/v1/namespaces/default/roles/label-rbac-test"

        def removed() -> None:
            assert cp.request(ADMIN, "GET", roles)[0] == 404

        eventually(removed)
        with Load(cp, "t3") as load:
            release.uninstall()
        assert load.failures == [], load.failures
    finally:
        release.stop()
    # (The CRD an earlier test's compiled install left, as docs/install.md says, aside.)
    assert {k: v for k, v in leftovers(cp).items() if k != "CustomResourceDefinition"} == {}


def test_overlay_upgrade_from_the_previous_release(tmp_path: Path) -> None:
    """The previous release's manifests/enforce-compiled, its compiler running the previous
    release's code, then ``kubectl apply -k manifests/enforce-compiled`` of this one (no prune)
    and the new compiler, under load: no write refused and no unlabeled write let through on the
    way; the policy the previous release applied stays and the compiler takes it over (a forced
    server-side apply), holding the ClusterRoleBindings' part."""
    require_control_plane()
    previous = previous_release(tmp_path / "old")
    users = (*DEFAULT_USERS, COMPILER)
    with LabelRbacCluster(
        tmp_path, users=users, overlay="enforce-compiled", manifests=previous / "manifests"
    ) as kube:
        cp = kube.control_plane
        new_namespace(cp, "t1")
        tenants(cp, "t1")
        old = Compilers(cp, tmp_path, root=previous)
        new = Compilers(cp, tmp_path)
        old.start("old-0")
        try:
            eventually(lambda: alice_judged(cp, "t1", by="label-rbac"), timeout=30)
            with Load(cp, "t1") as load, Load(cp, "t1", refused=True) as unlabeled:
                kube.upgrade("enforce-compiled")
                # The rollout: the new compiler's pods replace the previous release's.
                old.stop_all()
                new.start("new-0")
                eventually(lambda: compiler_policy(cp, "label-rbac"), timeout=60)
                eventually(lambda: alice_judged(cp, "t1", by="label-rbac"), timeout=30)
            assert load.writes > 5 and load.failures == [], load.failures
            assert unlabeled.writes > 5 and unlabeled.failures == [], unlabeled.failures
        finally:
            old.stop_all()
            new.stop_all()
            if kube.webhook is not None:
                stop(kube.webhook.process)


def generated_tls(cp: ControlPlane, namespace: str) -> tuple[bytes, dict[str, bytes]]:
    """The registration's CA bundle (the same in every entry) and the Secret <name>-tls."""
    path = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/label-rbac"
    _, config = cp.request(ADMIN, "GET", path)
    (bundle,) = {w["clientConfig"]["caBundle"] for w in config["webhooks"]}
    status, secret = cp.request(
        ADMIN, "GET", f"/api/v1/namespaces/{namespace}/secrets/label-rbac-tls"
    )
    assert status == 200, secret
    return base64.b64decode(bundle), {k: base64.b64decode(v) for k, v in secret["data"].items()}


def rotation(cp: ControlPlane, namespace: str, *extra: str) -> str:
    """The chart's CronJob's command, as its ServiceAccount: its last line of output."""
    path = f"/apis/batch/v1/namespaces/{namespace}/cronjobs/label-rbac-certs"
    status, cronjob = cp.request(ADMIN, "GET", path)
    assert status == 200, cronjob
    pod = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["/opt/label-rbac/bin/python", "-m", "app.webhook.rotation"]
    user = f"system:serviceaccount:{namespace}:{pod['serviceAccountName']}"
    done = subprocess.run(
        [sys.executable, "-m", "app.webhook.rotation", *container["args"], *extra,
         "--kubeconfig", str(cp.kubeconfig(user))],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stderr.strip().splitlines()[-1].split(": ", 1)[1]


def test_install_on_a_cluster_without_cert_manager(cp: ControlPlane, tmp_path: Path) -> None:
    """The default certificates (auto) where no cert-manager API is served: the install goes
    through (no cert-manager object); the registration's CA bundle verifies the Secret's serving
    certificate, and the webhook serving that Secret passes a TLS handshake checked against
    the bundle; upgrades keep both, and re-issue them within renewBeforeDays of expiry, the
    bundle keeping the previous CA beside a new one."""
    namespace, host = "bare", "label-rbac.bare.svc"
    release = Install(cp, tmp_path, namespace, "label-rbac")
    # Fail open: nothing here routes the API server to the Service.
    sets = ["--set", "webhook.failurePolicy=Ignore", "--set", "narrowing.enabled=false"]
    try:
        release.helm("install", RELEASE, str(helm.CHART), "--create-namespace", *sets)
        bundle, tls = generated_tls(cp, namespace)
        assert tls["ca.crt"] == bundle
        helm.verifies(bundle, tls["tls.crt"], host)
        # The webhook serving the Secret, as its pods would: a handshake as the API server
        # makes it (the bundle as the only trust, the Service's name).
        files = tmp_path / "secret"
        files.mkdir()
        for key in ("ca.crt", "tls.crt", "tls.key"):
            (files / key).write_bytes(tls[key])
        release.tls = CertPaths(files / "ca.crt", files / "tls.crt", files / "tls.key")
        release.start_webhook(wait=False)  # (its readiness check dials 127.0.0.1 by name)
        context = ssl.create_default_context(cadata=bundle.decode())
        address = ("127.0.0.1", release.port)

        def handshake() -> None:
            try:
                with (
                    socket.create_connection(address, timeout=5) as raw,
                    context.wrap_socket(raw, server_hostname=host) as conn,
                ):
                    assert conn.version() in ("TLSv1.2", "TLSv1.3")
            except OSError as exc:  # not listening yet, or (last) the verification's failure
                raise AssertionError(f"TLS to {host} at {address}: {exc}") from exc

        eventually(handshake, timeout=60)
        release.stop()
        release.webhook = None

        # An upgrade keeps them (the Secrets are read back, not issued again).
        release.helm("upgrade", RELEASE, str(helm.CHART), "--reuse-values")
        assert generated_tls(cp, namespace) == (bundle, tls)
        # Within renewBeforeDays of the serving certificate's expiry: a new one, the same CA.
        release.helm("upgrade", RELEASE, str(helm.CHART), "--reuse-values",
                     "--set", "certificates.generated.renewBeforeDays=1000")  # fmt: skip
        renewed_bundle, renewed = generated_tls(cp, namespace)
        assert renewed["tls.crt"] != tls["tls.crt"] and renewed_bundle == bundle
        helm.verifies(renewed_bundle, renewed["tls.crt"], host)
        # Within it of the CA's: a new CA too, the bundle with both, so the pods still serving
        # the previous certificate stay verifiable until their volume is refreshed.
        release.helm("upgrade", RELEASE, str(helm.CHART), "--reuse-values",
                     "--set", "certificates.generated.renewBeforeDays=4000")  # fmt: skip
        rotated_bundle, rotated = generated_tls(cp, namespace)
        assert rotated_bundle != bundle and bundle in rotated_bundle
        helm.verifies(rotated_bundle, rotated["tls.crt"], host)
        helm.verifies(rotated_bundle, renewed["tls.crt"], host)

        # Back to the default threshold: nothing due, nothing issued.
        release.helm("upgrade", RELEASE, str(helm.CHART), "--reuse-values",
                     "--set", "certificates.generated.renewBeforeDays=180")  # fmt: skip
        assert generated_tls(cp, namespace) == (rotated_bundle, rotated)
        # Between upgrades, the CronJob renews them: its command, as its ServiceAccount.
        assert rotation(cp, namespace) == "renewed: nothing (not due)"
        assert generated_tls(cp, namespace) == (rotated_bundle, rotated)
        assert rotation(cp, namespace, "--renew-before-days=1000") == "renewed: serving"
        bundle, tls = generated_tls(cp, namespace)
        assert bundle == rotated_bundle and tls["tls.crt"] != rotated["tls.crt"]
        assert tls["ca.crt"] == bundle
        helm.verifies(bundle, tls["tls.crt"], host)
        assert rotation(cp, namespace, "--renew-before-days=4000") == "renewed: ca, serving"
        bundle, renewed = generated_tls(cp, namespace)
        assert rotated_bundle in bundle and len(bundle) > len(rotated_bundle)
        helm.verifies(bundle, renewed["tls.crt"], host)
        helm.verifies(bundle, tls["tls.crt"], host)  # the pods not yet refreshed
        # And the next upgrade keeps what the CronJob wrote.
        release.helm("upgrade", RELEASE, str(helm.CHART), "--reuse-values")
        assert generated_tls(cp, namespace) == (bundle, renewed)
        release.helm("uninstall", RELEASE, "--wait")
    finally:
        release.stop()
    # (The CRD an earlier test's compiled install left, as docs/install.md says, aside.)
    assert {k: v for k, v in leftovers(cp).items() if k != "CustomResourceDefinition"} == {}


def test_enforce_overlay_is_narrow(tmp_path: Path) -> None:
    """manifests/enforce runs the compiler in its registration-only mode (as the chart's
    default does): with its arguments and identity, it keeps the label rule off what no
    annotation restricts, so with the webhook down a write to an unrestricted resource passes
    and a restricted one is refused, rather than every write in the cluster."""
    require_control_plane()
    with LabelRbacCluster(tmp_path, users=(*DEFAULT_USERS, COMPILER), overlay="enforce") as kube:
        cp = kube.control_plane
        new_namespace(cp, "t1")
        tenants(cp, "t1")
        eventually(lambda: alice_judged(cp, "t1"))
        docs = {(d["kind"], d["metadata"]["name"]): d for d in cluster_kustomize("enforce")}
        (container,) = docs[("Deployment", "label-rbac-compiler")]["spec"]["template"]["spec"][
            "containers"
        ]
        identity = "--identity=$(POD_NAME)"
        args = [a for a in container["args"][1:] if a != identity]
        assert "--registration-only" in args
        probes = free_port()
        args = [a if not a.startswith("--probe-bind=") else f"--probe-bind=127.0.0.1:{probes}"
                for a in args]  # fmt: skip
        compilers = Compilers(cp, tmp_path, COMPILER.name)
        compilers.start("compiler-0", *args)
        try:
            eventually(lambda: skips(cp, "label-rbac", "services"), timeout=30)
            # The guard holds it to its conditions: it may not drop an entry.
            patch = '[{"op": "remove", "path": "/webhooks/1"}]'
            done = cp.kubectl(COMPILER.name, "patch", "validatingwebhookconfiguration/label-rbac",
                              "--type=json", f"--patch={patch}")  # fmt: skip
            assert done.returncode != 0 and "label-rbac-registration" in done.stderr, done.stderr
            assert kube.webhook is not None
            stop(kube.webhook.process)
            kube.webhook = None
            service = {"metadata": {"generateName": "s-"}, "spec": {"ports": [{"port": 80}]}}
            status, answer = cp.request(ADMIN, "POST", "/api/v1/namespaces/t1/services", service)
            assert status == 201, answer
            refused = configmap(cp, ADMIN, "t1", {})
            assert refused.startswith("500") and "failed calling webhook" in refused, refused
        finally:
            compilers.stop_all()


def run_reporter(release: Install, workdir: Path, log: str) -> subprocess.Popen[str]:
    """The reporter as its pods would run it: the Deployment's arguments (its identity and
    metrics port the process's own), as its ServiceAccount."""
    (container,) = release.deployment("label-rbac-reporter")["spec"]["template"]["spec"][
        "containers"
    ]
    own = ("--identity=", "--metrics-port=")
    args = [a for a in container["args"] if not a.startswith(own)]
    assert args[0] == "report"
    return subprocess.Popen(
        [sys.executable, "-m", "app", *args, "--kubeconfig",
         str(release.cp.kubeconfig(REPORTER.name)), "--identity", "one", "--interval", "0.2"],
        cwd=ROOT, stdout=(workdir / log).open("w"), stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "KUBECONFIG": ""}, start_new_session=True,
    )  # fmt: skip


def unaudited(cp: ControlPlane) -> dict[str, str]:
    """The ClusterPolicyReport's `audited` errors: resource → message (absent report: raise)."""
    status, found = cp.request(ADMIN, "GET", CLUSTER_REPORT)
    assert status == 200, found
    return {r["resources"][0]["name"]: r["message"] for r in found.get("results") or []
            if r["result"] == "error" and r["rule"] == "audited"}  # fmt: skip


def test_reporter_reads_every_restricted_resource(cp: ControlPlane, tmp_path: Path) -> None:
    """reports.enabled: the reporter's rights cover every resource an annotation can restrict
    (the example platform-ops role restricts every resource, "*"): its cluster report has no
    `audited` error. Narrowed to ConfigMaps (reports.readRules), the same reporter reports the
    resources it cannot list: the rights are what decides."""
    if not REPORT_CRDS.is_dir():
        pytest.skip(f"no report CRDs in {REPORT_CRDS}")
    crds = [d for path in sorted(REPORT_CRDS.glob("*.yaml"))
            for d in yaml.safe_load_all(path.read_text()) if d]  # fmt: skip
    cp.apply(ADMIN, crds)
    wait_for(lambda: cp.request(ADMIN, "GET", CLUSTER_REPORT.rsplit("/", 1)[0])[0] == 200, "CRD")
    examples = ROOT / "manifests" / "examples"
    for name in ("namespaces.yaml", "tenants.yaml", "cluster.yaml"):
        cp.apply(ADMIN, (examples / name).read_text())
    narrowed = [
        "reports.readRules[0].apiGroups[0]=", "reports.readRules[0].resources[0]=configmaps",
        "reports.readRules[0].verbs={list,watch}",
    ]  # fmt: skip
    release = Install(
        cp, tmp_path, "label-rbac", "label-rbac",
        sets=["reports.enabled=true", "webhook.failurePolicy=Ignore", "narrowing.enabled=false",
              *narrowed],
    )  # fmt: skip
    sets = [a for v in release.values() for a in ("--set", v)]
    reporter: subprocess.Popen[str] | None = None
    try:
        release.helm("install", RELEASE, str(CHART), "--create-namespace", *sets)
        reporter = run_reporter(release, tmp_path, "reporter-narrowed.log")
        eventually(lambda: "services" in unaudited(cp), timeout=60)
        assert "configmaps" not in unaudited(cp)
        stop(reporter)
        cp.request(ADMIN, "DELETE", CLUSTER_REPORT)
        # The default rights (every resource, list and watch).
        release.helm("upgrade", RELEASE, str(CHART), "--reuse-values",
                     "--set", "reports.readRules[0].apiGroups[0]=*",
                     "--set", "reports.readRules[0].resources[0]=*",
                     "--set", "reports.readRules[0].verbs={list,watch}")  # fmt: skip
        reporter = run_reporter(release, tmp_path, "reporter.log")

        def reported_without_errors() -> None:
            status, found = cp.request(ADMIN, "GET", CLUSTER_REPORT)
            assert status == 200 and found["summary"]["pass"] >= 1, found
            assert unaudited(cp) == {} and found["summary"].get("error", 0) == 0, found

        eventually(reported_without_errors, timeout=60)
        release.helm("uninstall", RELEASE, "--wait")
    finally:
        if reporter is not None:
            stop(reporter)
