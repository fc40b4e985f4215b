"""Server settings: one frozen dataclass, built from the command line and the environment."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from app.engine.context import Options
from app.engine.model import ENFORCE, Resource
from app.engine.placement import DEFAULT_PLACEMENT_KEY
from app.engine.policy import DEFAULT_ANNOTATION_KEY, resource_pattern
from app.engine.rbac import Compiler

# The largest review the API server sends (docs/http.md, "Limits"): an UPDATE carries object and
# oldObject, each at most etcd's 1.5 MiB in its storage encoding and up to six times that as
# the API server's JSON (every "<", ">", "&", control character or invalid UTF-8 byte becomes a
# six-byte \uXXXX escape): 18 MiB; the envelope, user info included, comes from headers the
# API server caps at 1 MiB, six-fold again at worst: 6 MiB.
DEFAULT_MAX_BODY_BYTES = 24 * 1024 * 1024


@dataclass(frozen=True)
class Settings:
    annotation_keys: tuple[str, ...] = (DEFAULT_ANNOTATION_KEY,)
    default_label_key: str | None = None
    # Annotations with a placement (where the pods a role lets its holders write may run).
    placement_keys: tuple[str, ...] = (DEFAULT_PLACEMENT_KEY,)
    allow_unlabeled: bool = False
    # Resource patterns (as in the annotation) whose reads are not label-scoped.
    unrestricted_reads: tuple[str, ...] = ()
    mode: str = ENFORCE
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    # Where RBAC comes from: a directory of manifests, or a cluster (kubeconfig / in-cluster).
    rbac_dir: Path | None = None
    kubeconfig: Path | None = None
    in_cluster: bool = False
    # Fail closed once the cluster state is older than this many seconds (None: never).
    max_staleness: float | None = None
    # Decide kubelets' reads from the pods bound to them (watches pods and PVs).
    node_authorizer: bool = False
    # Resources (``res[.group]``) whose labels are also kept from a metadata-only watch, beyond
    # the default set, for label-scoped gets (the ClusterRole must grant list/watch on them).
    watch_labels: tuple[str, ...] = ()
    # The webhook's ValidatingWebhookConfiguration: the compiler keeps what its label-rule entries
    # leave out in step with the annotations; the webhook (cluster mode) reads it to fence
    # widening RBAC writes until the registration covers them.
    webhook_configuration: str = "label-rbac"
    # Serving.
    bind: str = "0.0.0.0:8443"
    workers: int = 2
    threads: int = 4
    tls_cert: Path | None = None
    tls_key: Path | None = None
    log_level: str = "info"
    # After SIGTERM: seconds of serving with readiness off before the graceful stop
    # (app.webhook.serve).
    drain_seconds: float = 0.0
    # Connections (app.webhook.connections): the TLS handshake and the whole request must arrive
    # within this many seconds of accept (or of a kept-alive connection's next first byte); at
    # most this many connections per worker, and per client address per worker.
    request_deadline: float = 10.0
    max_connections: int = 1000
    max_connections_per_peer: int = 128

    @property
    def compiler(self) -> Compiler:
        return Compiler(self.annotation_keys, self.default_label_key, self.placement_keys)

    @property
    def watched_labels(self) -> frozenset[tuple[str, str]]:
        parsed = map(Resource.parse, self.watch_labels)
        return frozenset((res.group, res.resource) for res in parsed)

    @property
    def engine_options(self) -> Options:
        return Options(
            compiler=self.compiler,
            allow_unlabeled=self.allow_unlabeled,
            unrestricted_reads=tuple(map(resource_pattern, self.unrestricted_reads)),
            mode=self.mode,
        )
