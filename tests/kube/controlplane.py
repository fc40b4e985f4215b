"""A throwaway Kubernetes control plane on loopback: etcd and a real kube-apiserver.

Used the way controller-runtime's envtest is: tests (and scripts) start etcd and kube-apiserver on
free 127.0.0.1 ports in a temporary directory, authenticate users with static tokens, and drive
the API server with kubectl as those users. Nothing else runs (no controller manager, no
scheduler, no kubelet): a Deployment gets no ReplicaSet, a pod is never scheduled, so tests
write the objects a controller or a kubelet would write themselves, as that identity.

Where the pieces come from:

- kube-apiserver: ``$KUBE_APISERVER`` (a binary), else the archive beside the repository
  (``../shared/kube/kube-apiserver-<version>-linux-amd64.xz``), unpacked once into
  ``.cache/kube/`` (not in git) and checked against its published sha256;
- etcd and kubectl: ``$PATH`` (Debian's ``etcd-server`` 3.4 works).

``available()`` says what is missing, so a test tier can skip with that reason.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import lzma
import os
import secrets
import shutil
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from app.compiled.admission_policy import COMPILER
from app.webhook.certs import Authority
from tests.process import free_port
from tests.support import ROOT

VERSION = "v1.36.2"
ARCHIVE = ROOT.parent / "shared" / "kube" / f"kube-apiserver-{VERSION}-linux-amd64.xz"
# The decompressed binary's sha256, as published beside the archive.
SHA256 = "13b1632a8cc28ab6cb5c167fc0053e886b035bc4aabf8d625650f0e8f272759b"
CACHE = ROOT / ".cache" / "kube"

ADMIN = "admin"
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"


class Unavailable(Exception):
    """A prerequisite of the control plane is missing; the message says which and how to get it."""


@dataclass(frozen=True)
class User:
    """An identity the API server authenticates by bearer token (``--token-auth-file``)."""

    name: str
    groups: tuple[str, ...] = ()
    token: str = field(default_factory=lambda: secrets.token_hex(16))


def node(name: str) -> User:
    """A kubelet's identity: ``system:node:<name>`` in ``system:nodes``."""
    return User(f"system:node:{name}", ("system:nodes",))


def service_account(namespace: str, name: str) -> User:
    """A ServiceAccount's identity, as its token authenticates it."""
    return User(
        f"system:serviceaccount:{namespace}:{name}",
        ("system:serviceaccounts", f"system:serviceaccounts:{namespace}"),
    )


# label-rbac's own identity (manifests/deploy/rbac.yaml binds its ClusterRole to it).
WEBHOOK_USER = service_account("label-rbac", "label-rbac")
# The compiler's (manifests/compiled/rbac.yaml), which the guard policies name.
COMPILER_USER = User(COMPILER, ("system:serviceaccounts", "system:serviceaccounts:label-rbac"))

# The people of manifests/examples (its README's table), an admin, two kubelets, label-rbac.
DEFAULT_USERS: tuple[User, ...] = (
    User(ADMIN, ("system:masters",)),
    User("alice", ("tenants",)),
    User("bob", ("tenants",)),
    User("carol", ("auditors",)),
    User("dana", ("t1-admins",)),
    User("erin", ("platform",)),
    node("node-1"),
    node("node-2"),
    WEBHOOK_USER,
)


# --- prerequisites --------------------------------------------------------------------------


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def apiserver_binary() -> Path:
    """The kube-apiserver to run: ``$KUBE_APISERVER``, or the shared archive unpacked once."""
    configured = os.environ.get("KUBE_APISERVER")
    if configured:
        path = Path(configured)
        if not os.access(path, os.X_OK):
            raise Unavailable(f"$KUBE_APISERVER={configured} is not an executable file")
        return path
    binary = CACHE / f"kube-apiserver-{VERSION}"
    if binary.is_file() and os.access(binary, os.X_OK):
        return binary
    if not ARCHIVE.is_file():
        raise Unavailable(
            f"no kube-apiserver: set $KUBE_APISERVER to a {VERSION} binary, or put "
            f"{ARCHIVE.name} in {ARCHIVE.parent}"
        )
    return unpack(ARCHIVE, binary, SHA256)


def unpack(archive: Path, binary: Path, sha256: str) -> Path:
    """``archive`` (xz) unpacked to ``binary``, checked against its published ``sha256``."""
    binary.parent.mkdir(parents=True, exist_ok=True)
    partial = binary.with_name(f"{binary.name}.{os.getpid()}.partial")
    with lzma.open(archive) as src, partial.open("wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    if _sha256(partial) != sha256:
        partial.unlink()
        raise Unavailable(f"{archive}: the unpacked binary does not have sha256 {sha256}")
    partial.chmod(0o755)
    partial.replace(binary)  # atomic: a concurrent run sees the whole binary or none
    return binary


def available() -> None:
    """Raise ``Unavailable`` with a reason unless a control plane can be started here."""
    for tool, hint in (("etcd", "apt-get install etcd-server"), ("kubectl", "install kubectl")):
        if shutil.which(tool) is None:
            raise Unavailable(f"{tool} is not on $PATH ({hint})")
    apiserver_binary()


# --- the control plane ----------------------------------------------------------------------


def _write_private(path: Path, data: bytes) -> Path:
    path.touch(mode=0o600)
    path.write_bytes(data)
    return path


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it when the process that started it dies, so a test
    run killed halfway leaves no etcd or API server behind (Linux prctl PR_SET_PDEATHSIG)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)


def _stop(process: subprocess.Popen[Any] | None, timeout: float = 20) -> None:
    if process is None or process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class ControlPlane:
    """etcd and kube-apiserver in ``workdir``, on free loopback ports, until ``stop()``.

    ``authorization_config``: an AuthorizationConfiguration document (passed as
    ``--authorization-config``), else ``--authorization-mode Node,RBAC``. ``admission_config``:
    an AdmissionConfiguration document (``--admission-control-config-file``). Files the
    documents name (a webhook's kubeconfig) are written by the caller, e.g. into ``workdir``.
    """

    def __init__(
        self,
        workdir: Path,
        users: Iterable[User] = DEFAULT_USERS,
        authorization_config: Mapping[str, Any] | None = None,
        admission_plugins: Sequence[str] = ("NodeRestriction",),
        admission_config: Mapping[str, Any] | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.workdir = workdir
        self.users = {user.name: user for user in users}
        if ADMIN not in self.users:
            raise ValueError(f"the users must include {ADMIN!r} (system:masters)")
        self.authorization_config = authorization_config
        self.admission_plugins = tuple(admission_plugins)
        self.admission_config = admission_config
        self.extra_args = tuple(extra_args)
        self.etcd_port = free_port()
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.etcd: subprocess.Popen[bytes] | None = None
        self.apiserver: subprocess.Popen[bytes] | None = None
        self._kubeconfigs: dict[str, Path] = {}
        workdir.mkdir(parents=True, exist_ok=True)
        self.ca = workdir / "ca.crt"
        self.audit_log = workdir / "audit.log"
        self._write_credentials()
        policy = {
            "apiVersion": "audit.k8s.io/v1",
            "kind": "Policy",
            "rules": [{"level": "Metadata"}],
        }
        (workdir / "audit-policy.yaml").write_text(yaml.safe_dump(policy))

    # -- files ---------------------------------------------------------------------------------

    def _write_credentials(self) -> None:
        authority = Authority.create()
        self.ca.write_bytes(authority.pem())
        cert, key = authority.issue(["127.0.0.1", "localhost", "kubernetes.default.svc"])
        (self.workdir / "apiserver.crt").write_bytes(cert)
        _write_private(self.workdir / "apiserver.key", key)
        sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        _write_private(
            self.workdir / "sa.key",
            sa_key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            ),
        )
        (self.workdir / "sa.pub").write_bytes(
            sa_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        lines = [f'{u.token},{u.name},{u.name},"{",".join(u.groups)}"' for u in self.users.values()]
        _write_private(self.workdir / "tokens.csv", ("\n".join(lines) + "\n").encode())

    def kubeconfig(self, user: str) -> Path:
        """A kubeconfig that reaches this API server as ``user`` (by token)."""
        if user not in self._kubeconfigs:
            config = {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "loopback",
                        "cluster": {"server": self.url, "certificate-authority": str(self.ca)},
                    }
                ],
                "users": [{"name": user, "user": {"token": self.users[user].token}}],
                "contexts": [{"name": user, "context": {"cluster": "loopback", "user": user}}],
                "current-context": user,
            }
            path = self.workdir / "kubeconfigs" / f"{user.replace(':', '_')}.yaml"
            path.parent.mkdir(exist_ok=True)
            _write_private(path, yaml.safe_dump(config).encode())
            self._kubeconfigs[user] = path
        return self._kubeconfigs[user]

    # -- processes -----------------------------------------------------------------------------

    def start(self, timeout: float = 90) -> None:
        """Start etcd and the API server; return once ``/readyz`` answers 200."""
        available()
        self._start_etcd()
        self.start_apiserver(timeout)

    def _start_etcd(self) -> None:
        client = f"http://127.0.0.1:{self.etcd_port}"
        peer = f"http://127.0.0.1:{free_port()}"
        with (self.workdir / "etcd.log").open("ab") as log:
            self.etcd = subprocess.Popen(
                [
                    "etcd",
                    "--data-dir", str(self.workdir / "etcd"),
                    "--listen-client-urls", client,
                    "--advertise-client-urls", client,
                    "--listen-peer-urls", peer,
                    "--initial-advertise-peer-urls", peer,
                    "--initial-cluster", f"default={peer}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )  # fmt: skip

    def _apiserver_args(self) -> list[str]:
        d = self.workdir
        args = [
            str(apiserver_binary()),
            "--etcd-servers", f"http://127.0.0.1:{self.etcd_port}",
            "--bind-address", "127.0.0.1",
            "--advertise-address", "127.0.0.1",
            "--secure-port", str(self.port),
            "--tls-cert-file", str(d / "apiserver.crt"),
            "--tls-private-key-file", str(d / "apiserver.key"),
            "--client-ca-file", str(self.ca),
            "--token-auth-file", str(d / "tokens.csv"),
            "--service-account-issuer", "https://kubernetes.default.svc",
            "--service-account-key-file", str(d / "sa.pub"),
            "--service-account-signing-key-file", str(d / "sa.key"),
            "--service-cluster-ip-range", SERVICE_CLUSTER_IP_RANGE,
            "--enable-admission-plugins", ",".join(self.admission_plugins),
            # Every request's metadata, audit annotations included (audit_events()).
            "--audit-policy-file", str(d / "audit-policy.yaml"),
            "--audit-log-path", str(self.audit_log),
        ]  # fmt: skip
        if not self.admission_plugins:
            plugins = args.index("--enable-admission-plugins")
            args[plugins : plugins + 2] = ["--disable-admission-plugins", "NodeRestriction"]
        if self.authorization_config is not None:
            path = d / "authorization-config.yaml"
            path.write_text(yaml.safe_dump(dict(self.authorization_config)))
            args += ["--authorization-config", str(path)]
        else:
            args += ["--authorization-mode", "Node,RBAC"]
        if self.admission_config is not None:
            path = d / "admission-config.yaml"
            path.write_text(yaml.safe_dump(dict(self.admission_config)))
            args += ["--admission-control-config-file", str(path)]
        return args + list(self.extra_args)

    def start_apiserver(self, timeout: float = 90) -> None:
        """Start (or start again) the API server against the running etcd; wait for /readyz."""
        with (self.workdir / "apiserver.log").open("ab") as log:
            self.apiserver = subprocess.Popen(
                self._apiserver_args(),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        self.wait_ready(timeout)

    def stop_apiserver(self, kill: bool = False) -> None:
        """Stop the API server (SIGTERM, or SIGKILL with ``kill``); etcd keeps its data."""
        if kill and self.apiserver is not None and self.apiserver.poll() is None:
            self.apiserver.kill()
            self.apiserver.wait()
        _stop(self.apiserver)

    def restart_apiserver(self, kill: bool = False, timeout: float = 90) -> None:
        """The same API server (port, flags, certificates, etcd data) stopped and started."""
        self.stop_apiserver(kill)
        self.start_apiserver(timeout)

    def stop(self) -> None:
        _stop(self.apiserver)
        _stop(self.etcd)

    def ready(self) -> bool:
        try:
            status, _ = self.request(ADMIN, "GET", "/readyz", timeout=3)
        except (OSError, ssl.SSLError):
            return False
        return status == 200

    def wait_ready(self, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, process in (("etcd", self.etcd), ("kube-apiserver", self.apiserver)):
                if process is not None and process.poll() is not None:
                    raise RuntimeError(
                        f"{name} exited with {process.returncode}:\n{self.log_tail(name)}"
                    )
            if self.ready():
                return
            time.sleep(0.2)
        raise RuntimeError(
            f"kube-apiserver not ready after {timeout}s:\n{self.log_tail('kube-apiserver')}"
        )

    def audit_events(self) -> list[dict[str, Any]]:
        """The API server's audit events so far (level Metadata: who, what, the decision, the
        admission webhooks' audit annotations)."""
        try:
            text = self.audit_log.read_text()
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in text.splitlines() if line.endswith("}")]

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.workdir / ("etcd.log" if name == "etcd" else "apiserver.log")
        try:
            return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    # -- clients -------------------------------------------------------------------------------

    def request(
        self,
        user: str,
        method: str,
        path: str,
        body: Any = None,
        timeout: float = 10,
        content_type: str = "application/json",
    ) -> tuple[int, Any]:
        """One HTTPS request to the API server as ``user``: (status, decoded JSON or text)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.url + path,
            data=data,
            method=method,
            headers={
                "Authorization": f"Bearer {self.users[user].token}",
                "Content-Type": content_type,
            },
        )
        context = ssl.create_default_context(cafile=str(self.ca))
        try:
            with urllib.request.urlopen(req, context=context, timeout=timeout) as resp:
                raw, status = resp.read(), resp.status
        except urllib.error.HTTPError as err:
            raw, status = err.read(), err.code
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw.decode(errors="replace")

    def kubectl(
        self, user: str, *args: str, input: str | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """``kubectl`` as ``user``; the completed process (check ``returncode`` yourself)."""
        return subprocess.run(
            ["kubectl", "--kubeconfig", str(self.kubeconfig(user)), *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "KUBECONFIG": ""},
        )

    def apply(self, user: str, documents: str | Iterable[Mapping[str, Any]]) -> str:
        """``kubectl apply -f -`` of YAML text or objects, as ``user``; its stdout. Raises
        ``RuntimeError`` with kubectl's stderr when it fails."""
        text = (
            documents
            if isinstance(documents, str)
            else yaml.safe_dump_all([dict(d) for d in documents])
        )
        done = self.kubectl(user, "apply", "-f", "-", input=text)
        if done.returncode != 0:
            raise RuntimeError(f"kubectl apply as {user} failed: {done.stderr.strip()}")
        return done.stdout
