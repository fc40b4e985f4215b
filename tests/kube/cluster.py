"""label-rbac installed in a loopback control plane from its own manifests, as a user installs it.

The webhook runs as the real server process (``python -m app serve --kubeconfig``, its
ServiceAccount's identity) on a loopback port. What the API server is told about it comes from
the shipped manifests, changed only where a cluster differs from loopback:

- ``kubectl kustomize manifests/deploy`` (or ``manifests/enforce``): the Namespace, the
  ServiceAccount and its ClusterRole(Binding) are applied as they are; the
  ValidatingWebhookConfiguration gets ``clientConfig.url`` (the loopback address and the
  Service's path) and ``caBundle`` in place of its Service. The Deployment, Service and
  cert-manager objects are left out: the process and ``app.webhook.certs`` stand in for them.
- ``manifests/authorization/`` (or ``manifests/node-authorizer/``): the AuthorizationConfiguration
  as shipped, with ``kubeConfigFile`` pointing at the shipped kubeconfig whose ``server`` is the
  loopback address and ``certificate-authority`` the test CA. ``tls-server-name`` is kept: the
  serving certificate is issued for the Service name, as cert-manager issues it.

Order: the API server starts first (its own requests, admins' and the webhook's are kept away
from the authorization webhook by the shipped matchConditions, so it is ready without label-rbac),
then the RBAC objects, then the webhook (it lists and watches the API server), then, once it is
ready, the ValidatingWebhookConfiguration, as README "Install" does it.
"""

from __future__ import annotations

import base64
import copy
import os
import signal
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from app.compiled.admission_policy import COMPILER
from app.webhook.certs import CertPaths, generate
from tests.kube.controlplane import (
    ADMIN,
    DEFAULT_USERS,
    WEBHOOK_USER,
    ControlPlane,
    User,
)
from tests.process import Server, free_port, launch, stop
from tests.support import ROOT

MANIFESTS = ROOT / "manifests"
# The Service name the serving certificate is issued for (manifests/deploy/certificate.yaml).
SERVICE_NAME = "label-rbac.label-rbac.svc"
# Stand-ins run here instead (the process, app.webhook.certs), or need CRDs no test cluster has.
NOT_APPLIED = {"Deployment", "Service", "Certificate", "Issuer", "ServiceMonitor"}


def kustomize(overlay: str, manifests: Path = MANIFESTS) -> list[dict[str, Any]]:
    """``kubectl kustomize manifests/<overlay>``: the objects a user's ``apply -k`` creates
    (``manifests``: an earlier release's, for an upgrade)."""
    done = subprocess.run(
        ["kubectl", "kustomize", str(manifests / overlay)],
        capture_output=True,
        text=True,
        check=True,
    )
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def webhook_configuration(
    docs: Sequence[Mapping[str, Any]], url: str, ca_pem: bytes
) -> dict[str, Any]:
    """The rendered ValidatingWebhookConfiguration, each entry's Service replaced by ``url`` +
    the Service's path, with ``ca_pem`` as its caBundle."""
    (config,) = [copy.deepcopy(d) for d in docs if d["kind"] == "ValidatingWebhookConfiguration"]
    config["metadata"].get("annotations", {}).pop("cert-manager.io/inject-ca-from", None)
    for entry in config["webhooks"]:
        service = entry["clientConfig"].pop("service")
        entry["clientConfig"] = {
            "url": url.rstrip("/") + service.get("path", "/"),
            "caBundle": base64.b64encode(ca_pem).decode(),
        }
    return config


def authorization_kubeconfig(url: str, ca: Path) -> dict[str, Any]:
    """manifests/authorization/authorization-webhook.kubeconfig, pointed at ``url``."""
    path = MANIFESTS / "authorization" / "authorization-webhook.kubeconfig"
    config: dict[str, Any] = yaml.safe_load(path.read_text())
    (cluster,) = config["clusters"]
    shipped = cluster["cluster"]["server"]
    cluster["cluster"]["server"] = url.rstrip("/") + "/" + shipped.split("/", 3)[3]
    cluster["cluster"]["certificate-authority"] = str(ca)
    return config


def authorization_config(variant: str, kubeconfig: Path) -> dict[str, Any]:
    """The shipped AuthorizationConfiguration (``authorization`` or ``node-authorizer``), its
    label-rbac webhook reached through ``kubeconfig``."""
    path = MANIFESTS / variant / "authorization-config.yaml"
    config: dict[str, Any] = yaml.safe_load(path.read_text())
    webhooks = [a for a in config["authorizers"] if a["type"] == "Webhook"]
    for authorizer in webhooks:
        authorizer["webhook"]["connectionInfo"]["kubeConfigFile"] = str(kubeconfig)
    if not webhooks:
        raise ValueError(f"{path}: no Webhook authorizer")
    return config


class LabelRbacCluster:
    """A control plane with label-rbac installed; ``start()``, then kubectl as any user.

    ``node_authorizer``: label-rbac is the node authorizer (manifests/node-authorizer, ``serve
    --node-authorizer``) instead of the in-tree one. ``overlay``: ``enforce`` (failurePolicy
    Fail, the installed state) or ``deploy``, from ``manifests`` (an earlier release's, for an
    upgrade: ``apply``). ``serve_args``: more flags for ``serve``.
    ``webhook_url``: what the API server dials (e.g. a load balancer in front of replicas the
    caller runs with ``launch_webhook``); default: the one replica started here.
    ``admission_plugins``: the API server's extra admission plugins. By default the in-tree
    NodeRestriction is off, so the node rules kubelets meet are the webhook's
    (nodes.labelrbac.io), as where that plugin is not enabled.
    """

    def __init__(
        self,
        workdir: Path,
        users: Sequence[User] = DEFAULT_USERS,
        node_authorizer: bool = False,
        overlay: str = "enforce",
        serve_args: Sequence[str] = (),
        webhook_url: str | None = None,
        admission_plugins: Sequence[str] = (),
        manifests: Path = MANIFESTS,
    ) -> None:
        self.workdir = workdir
        self.manifests = manifests
        workdir.mkdir(parents=True, exist_ok=True)
        self.node_authorizer = node_authorizer
        self.overlay = overlay
        self.serve_args = tuple(serve_args)
        self.webhook_port = free_port()
        self.webhook_url = webhook_url or f"https://127.0.0.1:{self.webhook_port}"
        self.tls: CertPaths = generate(
            workdir / "webhook-tls", [SERVICE_NAME, "127.0.0.1", "localhost"]
        )
        kubeconfig = workdir / "authorization-webhook.kubeconfig"
        kubeconfig.write_text(
            yaml.safe_dump(authorization_kubeconfig(self.webhook_url, self.tls.ca))
        )
        variant = "node-authorizer" if node_authorizer else "authorization"
        self.control_plane = ControlPlane(
            workdir / "control-plane",
            users=users,
            authorization_config=authorization_config(variant, kubeconfig),
            admission_plugins=admission_plugins,
        )
        self.webhook: Server | None = None

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        cp = self.control_plane
        cp.start()
        docs = self.install(kustomize(self.overlay, self.manifests))
        if self.node_authorizer:
            for name in ("rbac.yaml", "system-node-binding.yaml"):
                cp.apply(ADMIN, (MANIFESTS / "node-authorizer" / name).read_text())
        self.webhook = self.launch_webhook(self.webhook_port)
        self.webhook.wait_ready()
        self.register(docs)

    def install(self, docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``kubectl apply`` of an overlay's objects (``docs``) but the registration and what
        runs here instead (``NOT_APPLIED``); ``docs``."""
        skipped = NOT_APPLIED | {"ValidatingWebhookConfiguration"}
        self.control_plane.apply(ADMIN, [d for d in docs if d["kind"] not in skipped])
        return docs

    def register(self, docs: Sequence[Mapping[str, Any]]) -> None:
        """The overlay's registration, reaching the webhook run here."""
        config = webhook_configuration(docs, self.webhook_url, self.tls.ca.read_bytes())
        self.control_plane.apply(ADMIN, [config])

    def upgrade(self, overlay: str) -> None:
        """``kubectl apply -k manifests/<overlay>`` of this tree over what is installed (no
        prune: what the new overlay lacks stays)."""
        self.register(self.install(kustomize(overlay)))

    def launch_webhook(self, port: int, *extra: str, log_name: str | None = None) -> Server:
        """One more ``python -m app serve`` replica as label-rbac's ServiceAccount, on ``port``
        with this cluster's serving certificate; not waited for (``wait_ready()``)."""
        args = ["--kubeconfig", str(self.control_plane.kubeconfig(WEBHOOK_USER.name))]
        if self.node_authorizer:
            args.append("--node-authorizer")
        return launch(
            self.workdir,
            *args,
            *self.serve_args,
            *extra,
            tls=(self.tls.ca, self.tls.cert, self.tls.key),
            port=port,
            log_name=log_name or f"webhook-{port}.log",
        )

    def restart_webhook(self) -> None:
        """Stop the replica started here (SIGTERM, drained) and start it again on its port."""
        if self.webhook is not None:
            stop(self.webhook.process)
        self.webhook = self.launch_webhook(self.webhook_port)
        self.webhook.wait_ready()

    def stop(self) -> None:
        if self.webhook is not None:
            stop(self.webhook.process)
        self.control_plane.stop()

    def __enter__(self) -> LabelRbacCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- as users do ---------------------------------------------------------------------------

    def kubectl(
        self, user: str, *args: str, input: str | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        return self.control_plane.kubectl(user, *args, input=input, timeout=timeout)

    def apply(self, user: str, documents: str | Iterable[Mapping[str, Any]]) -> str:
        return self.control_plane.apply(user, documents)


class Compilers:
    """``python -m app compile`` processes, as the compiler's ServiceAccount (``user``), by
    identity, logging to files in ``workdir``."""

    def __init__(
        self, cp: ControlPlane, workdir: Path, user: str = COMPILER, root: Path = ROOT
    ) -> None:
        # ``root``: the tree whose ``app`` runs (an earlier release's, for an upgrade).
        self.cp, self.workdir, self.user, self.root = cp, workdir, user, root
        self.processes: dict[str, subprocess.Popen[str]] = {}

    def start(self, identity: str, *extra: str) -> None:
        log = (self.workdir / f"{identity}.log").open("w")
        self.processes[identity] = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "app",
                "compile",
                "--kubeconfig",
                str(self.cp.kubeconfig(self.user)),
                "--identity",
                identity,
                *extra,
            ],
            cwd=self.root,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "KUBECONFIG": ""},
            start_new_session=True,
        )

    def log(self, identity: str) -> str:
        return (self.workdir / f"{identity}.log").read_text()

    def kill(self, identity: str) -> None:
        process = self.processes[identity]
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()

    def stop_all(self) -> None:
        for process in self.processes.values():
            stop(process)
