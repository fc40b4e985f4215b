"""Command line: ``serve``, ``check``, ``who-can``, ``audit``, ``gen-certs`` and ``lint``.

``check``, ``who-can`` and ``audit`` read RBAC from ``--rbac-dir`` or from a cluster, as kubectl
finds one (``--kubeconfig``, ``$KUBECONFIG``, ``~/.kube/config`` and its current context, or the
pod's service account), and take kubectl's spellings (``--as``, ``--as-group``, ``-n``, ``-l``,
``-o``, ``-f``). Every bad input is one line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import app
from app import deepjson
from app.engine.authorize import READ_CHECKS, authorize
from app.engine.context import (
    Context,
    MetadataLookup,
    ObjectRef,
    ParentLookup,
    no_metadata_lookup,
    no_parent_lookup,
)
from app.engine.decide import POST_CHECKS, evaluate
from app.engine.kinds import BINDING_KINDS, GRAPH_KINDS, ROLE_KINDS, snapshot_from_objects
from app.engine.model import (
    AUTHORIZED_VERBS,
    ENFORCE,
    MODES,
    SERVICE_ACCOUNT_PREFIX,
    Access,
    AccessDecision,
    Decision,
    Request,
    Resource,
    UserInfo,
    Verdict,
)
from app.engine.nodeauthz import check_node_read
from app.engine.nodegraph import NodeGraph
from app.engine.params import MAX_BYTES
from app.engine.policy import (
    DEFAULT_ANNOTATION_KEY,
    AnnotationError,
    is_label_key,
    is_label_value,
    resource_pattern,
)
from app.engine.rbac import Snapshot
from app.engine.selectors import Selector, SelectorError, parse_selector
from app.settings import Settings
from app.source.static import ManifestError, parse_manifests, read_manifests
from app.wire import ReviewError, parse_review
from app.wire_sar import AccessReview, parse_access_review

if TYPE_CHECKING:  # the official client is imported only to talk to a cluster (it is slow)
    from app.source.api import KubeClient


class CliError(Exception):
    """A bad input or an unreachable source: printed as one line, exit status 2."""


class UsageError(CliError):
    """A command line argparse refused; the message is the whole line."""


class _Parser(argparse.ArgumentParser):
    """argparse, with usage errors as one line (``prog: message``) like every other error."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message} (see --help)")


OPERATION_FOR_VERB = {
    "create": "CREATE",
    "update": "UPDATE",
    "patch": "UPDATE",
    "delete": "DELETE",
    "deletecollection": "DELETE",
    "connect": "CONNECT",
}


def _read_pattern(text: str) -> str:
    try:
        resource_pattern(text)
    except AnnotationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


# Every argument is checked whole: ``fullmatch``, or ``whole()`` patterns (never ``$``, which
# also matches before a final newline), and numbers as ASCII digits only (``int`` and ``float``
# also take surrounding whitespace, other scripts' digits, ``nan`` and ``inf``).
# A sign passes, so that the range checks of ``serve`` say what is wrong with a negative value.
_COUNT = re.compile(r"-?[0-9]+")
_SECONDS = re.compile(r"-?([0-9]+(\.[0-9]*)?|\.[0-9]+)")


def _resource_name(text: str) -> str:
    if _resource_arg(text).subresource:
        raise argparse.ArgumentTypeError(f"{text!r}: name a resource, not a subresource")
    return text


def _key_arg(text: str) -> str:
    if not is_label_key(text):
        raise argparse.ArgumentTypeError(
            f"invalid key {text!r}: expected [prefix/]name as Kubernetes label and annotation "
            "keys are, e.g. team or labelrbac.io/permissions"
        )
    return text


def _count_arg(text: str) -> int:
    if not _COUNT.fullmatch(text):
        raise argparse.ArgumentTypeError(f"invalid number {text!r}: expected a whole number")
    return int(text)


def _seconds_arg(text: str) -> float:
    if not _SECONDS.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"invalid duration {text!r}: expected seconds as a decimal number, e.g. 30 or 2.5"
        )
    return float(text)


def _policy_flags() -> _Parser:
    parent = _Parser(add_help=False)
    group = parent.add_argument_group("policy")
    group.add_argument(
        "--annotation-key",
        action="append",
        dest="annotation_keys",
        type=_key_arg,
        metavar="KEY",
        help=f"annotation with label permissions (repeatable; default {DEFAULT_ANNOTATION_KEY})",
    )
    group.add_argument(
        "--default-label-key",
        type=_key_arg,
        metavar="KEY",
        help="label key for the list shorthand, e.g. sdewan-bucket-type",
    )
    group.add_argument(
        "--allow-unlabeled",
        action="store_true",
        help="let objects that lack a restricted label pass (migration aid)",
    )
    group.add_argument(
        "--unrestricted-reads",
        action="append",
        type=_read_pattern,
        default=[],
        metavar="PATTERN",
        help="resource pattern whose reads are not label-scoped, only its writes "
        "(repeatable; e.g. configmaps, *.apps)",
    )
    group.add_argument(
        "--mode",
        choices=MODES,
        default=ENFORCE,
        help="enforce denies; warn allows with a warning; audit allows and records an audit "
        "annotation (default enforce; roles may be softer with labelrbac.io/mode)",
    )
    return parent


def _settings(args: argparse.Namespace, **extra: object) -> Settings:
    return Settings(
        annotation_keys=tuple(args.annotation_keys or (DEFAULT_ANNOTATION_KEY,)),
        default_label_key=args.default_label_key,
        allow_unlabeled=args.allow_unlabeled,
        unrestricted_reads=tuple(args.unrestricted_reads),
        mode=args.mode,
        **extra,  # type: ignore[arg-type]
    )


def _parser(prog: str = "python -m app") -> argparse.ArgumentParser:
    parser = _Parser(prog=prog, description="label-rbac: label-based permissions for Kubernetes")
    parser.add_argument("--version", action="version", version=f"label-rbac {app.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    policy = _policy_flags()

    serve = sub.add_parser("serve", parents=[policy], help="run the webhook (gunicorn, TLS)")
    serve.add_argument("--bind", default="0.0.0.0:8443", metavar="HOST:PORT")
    serve.add_argument("--workers", type=_count_arg, default=2)
    serve.add_argument("--threads", type=_count_arg, default=4)
    serve.add_argument("--tls-cert", type=Path)
    serve.add_argument("--tls-key", type=Path)
    serve.add_argument(
        "--dev-tls",
        nargs="?",
        const=Path("dev-certs"),
        type=Path,
        metavar="DIR",
        help="generate a self-signed CA and serving cert into DIR (default ./dev-certs)",
    )
    source = serve.add_mutually_exclusive_group()
    source.add_argument("--rbac-dir", type=Path, help="load RBAC objects from manifests here")
    source.add_argument(
        "--kubeconfig", type=Path, help="watch a cluster (default: $KUBECONFIG, or in-cluster)"
    )
    serve.add_argument(
        "--max-staleness",
        type=_seconds_arg,
        metavar="SECONDS",
        help="deny everything once the cluster state is older than this (default: off)",
    )
    serve.add_argument(
        "--node-authorizer",
        action="store_true",
        help="decide kubelets' reads from the pods bound to them (watches pods and PVs)",
    )
    serve.add_argument(
        "--watch-labels",
        action="append",
        type=_resource_name,
        default=[],
        metavar="RESOURCE[.GROUP]",
        help="keep the labels of this resource from a metadata-only watch, for label-scoped "
        "gets (repeatable; configmaps, secrets, pods and deployments.apps always are)",
    )
    serve.add_argument(
        "--webhook-configuration",
        default=Settings.webhook_configuration,
        metavar="NAME",
        help="the ValidatingWebhookConfiguration whose unjudged resources to read (cluster mode; "
        "default label-rbac)",
    )
    serve.add_argument("--max-body-bytes", type=_count_arg, default=Settings.max_body_bytes)
    serve.add_argument("--log-level", default="info")
    serve.add_argument(
        "--drain-seconds",
        type=_seconds_arg,
        default=0.0,
        metavar="SECONDS",
        help="after SIGTERM, keep serving this long with /readyz at 503 (default 0)",
    )

    serve.add_argument(
        "--request-deadline",
        type=_seconds_arg,
        default=Settings.request_deadline,
        metavar="SECONDS",
        help="a connection's TLS handshake and request (headers and body) must arrive within "
        "this long of its accept, or of its next request's first byte (default 10)",
    )
    serve.add_argument(
        "--max-connections",
        type=_count_arg,
        default=Settings.max_connections,
        help="open connections per worker; past it the oldest one still waiting for its "
        "request is closed (default 1000)",
    )
    serve.add_argument(
        "--max-connections-per-peer",
        type=_count_arg,
        default=Settings.max_connections_per_peer,
        help="open connections per client address per worker, likewise (default 128)",
    )

    compile_ = sub.add_parser(
        "compile",
        parents=[policy],
        help="keep the compiled label rule's parameters in step with RBAC (leader-elected)",
    )
    compile_.add_argument(
        "--kubeconfig", type=Path, help="the cluster (default: $KUBECONFIG, or in-cluster)"
    )
    compile_.add_argument("--lease-namespace", default="label-rbac", metavar="NAMESPACE")
    compile_.add_argument("--lease-name", default="label-rbac-compiler", metavar="NAME")
    compile_.add_argument(
        "--lease-seconds",
        type=_seconds_arg,
        default=15.0,
        metavar="SECONDS",
        help="how long a replica's lease lasts unrenewed (default 15)",
    )
    compile_.add_argument(
        "--identity", help="this replica's name in the Lease (default: host name and a number)"
    )
    compile_.add_argument(
        "--max-params-bytes",
        type=_count_arg,
        default=MAX_BYTES,
        metavar="BYTES",
        help="leave a namespace whose parameters would be larger to the webhook",
    )
    compile_.add_argument(
        "--webhook-configuration",
        default=Settings.webhook_configuration,
        metavar="NAME",
        help="the ValidatingWebhookConfiguration whose label-rule entries skip the resources no "
        "annotation restricts (default label-rbac)",
    )
    compile_.add_argument("--log-level", default="info")

    rbac_source = _source_flags()
    check = sub.add_parser(
        "check",
        parents=[policy, rbac_source],
        help="explain one decision, like kubectl auth can-i with labels",
    )
    check.add_argument(
        "--review", type=Path, help="an AdmissionReview or SubjectAccessReview JSON file to decide"
    )
    check.add_argument(
        "-f", "--filename", metavar="FILE", help="the object to judge, a manifest file or - (stdin)"
    )
    check.add_argument("--as", "--user", dest="user", metavar="USER")
    check.add_argument(
        "--as-group", "--group", dest="group", action="append", default=[], metavar="GROUP"
    )
    check.add_argument("--verb", choices=sorted({*OPERATION_FOR_VERB, *AUTHORIZED_VERBS}))
    check.add_argument(
        "--selector",
        type=_selector_arg,
        metavar="SELECTOR",
        help="a read's label selector, as kubectl -l takes it (list, watch, deletecollection)",
    )
    check.add_argument("--resource", type=_resource_arg, help="res[.group][/subresource]")
    check.add_argument("-n", "--namespace", default="")
    check.add_argument("--name", default="")
    check.add_argument("-l", "--label", action="append", default=[], type=_label_arg,
                       metavar="KEY=VALUE")  # fmt: skip
    check.add_argument("-o", "--output", choices=("text", "json", "yaml"), default="text")
    check.add_argument(
        "--node-authorizer",
        action="store_true",
        help="decide kubelets' requests from the pods bound to them, as serve does",
    )

    who = sub.add_parser(
        "who-can",
        parents=[policy, rbac_source],
        help="who may do VERB on RESOURCE objects with these labels, and through which roles",
    )
    who.add_argument("verb", metavar="VERB")
    who.add_argument("resource", metavar="RESOURCE", type=_resource_arg)
    who.add_argument("-n", "--namespace", default="")
    who.add_argument("--name", default="", help="an object name (for resourceNames rules)")
    who.add_argument("-l", "--label", action="append", default=[], type=_label_arg,
                     metavar="KEY=VALUE")  # fmt: skip
    who.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table")

    audit = sub.add_parser(
        "audit",
        parents=[policy, rbac_source],
        help="existing objects left to admins, labels in no bucket, buckets and their holders",
    )
    audit.add_argument("-n", "--namespace", default="", help="only this namespace")
    audit.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table")

    certs = sub.add_parser("gen-certs", help="write a CA and serving certificate")
    certs.add_argument("--out", type=Path, required=True)
    certs.add_argument("--dns", action="append", required=True, metavar="NAME")
    certs.add_argument("--days", type=_days_arg, default=365)

    lint = sub.add_parser("lint", parents=[policy], help="validate permission annotations")
    lint.add_argument("files", nargs="+", type=Path)
    return parser


def _cmd_serve(args: argparse.Namespace) -> int:
    from app.certs import generate
    from app.serve import ConfigError, serve

    tls_cert, tls_key = args.tls_cert, args.tls_key
    if args.dev_tls is not None:
        try:
            paths = generate(args.dev_tls, ["localhost", "127.0.0.1"])
        except OSError as exc:
            print(f"serve: --dev-tls {args.dev_tls}: {exc.strerror}", file=sys.stderr)
            return 2
        tls_cert, tls_key = paths.cert, paths.key
        print(f"dev TLS: CA {paths.ca}, cert {paths.cert}, key {paths.key}", flush=True)
    if tls_cert is None or tls_key is None:
        print(
            "serve: TLS is required: pass --tls-cert and --tls-key, or --dev-tls", file=sys.stderr
        )
        return 2
    kubeconfig = args.kubeconfig
    if args.rbac_dir is None and kubeconfig is None and os.environ.get("KUBECONFIG"):
        kubeconfig = Path(os.environ["KUBECONFIG"])
    in_cluster = args.rbac_dir is None and kubeconfig is None
    if in_cluster and not os.environ.get("KUBERNETES_SERVICE_HOST"):
        print(
            "serve: no RBAC source: pass --rbac-dir DIR or --kubeconfig FILE (or run in a pod)",
            file=sys.stderr,
        )
        return 2
    settings = _settings(
        args,
        bind=args.bind,
        workers=args.workers,
        threads=args.threads,
        tls_cert=tls_cert,
        tls_key=tls_key,
        rbac_dir=args.rbac_dir,
        kubeconfig=kubeconfig,
        in_cluster=in_cluster,
        max_staleness=args.max_staleness,
        node_authorizer=args.node_authorizer,
        watch_labels=tuple(args.watch_labels),
        max_body_bytes=args.max_body_bytes,
        log_level=args.log_level,
        drain_seconds=args.drain_seconds,
        request_deadline=args.request_deadline,
        max_connections=args.max_connections,
        max_connections_per_peer=args.max_connections_per_peer,
        webhook_configuration=args.webhook_configuration,
    )
    try:
        serve(settings)
    except ConfigError as exc:
        print(f"serve: {_one_line(str(exc))}", file=sys.stderr)
        return 2
    return 0


_RESOURCE = re.compile(
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"  # resource
    r"(\.[a-z0-9]([-.a-z0-9]*[a-z0-9])?)?"  # .group
    r"(/[a-z0-9]+)?"  # /subresource
)


def _resource_arg(text: str) -> Resource:
    """``res[.group][/subresource]`` as kubectl spells it; anything else is refused here."""
    if not _RESOURCE.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"invalid resource {text!r}: expected res[.group][/subresource], "
            "e.g. configmaps, deployments.apps, pods/exec"
        )
    return Resource.parse(text)


def _label_arg(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not is_label_key(key) or not is_label_value(value):
        raise argparse.ArgumentTypeError(
            f"invalid label {text!r}: expected KEY=VALUE, a label key and value as Kubernetes "
            "accepts them"
        )
    return key, value


def _days_arg(text: str) -> int:
    if not _COUNT.fullmatch(text) or int(text) < 1:
        raise argparse.ArgumentTypeError(f"invalid --days {text!r}: expected a whole number >= 1")
    return int(text)


def _source_flags() -> _Parser:
    parent = _Parser(add_help=False)
    group = parent.add_argument_group("RBAC source (default: the cluster, as kubectl finds it)")
    exclusive = group.add_mutually_exclusive_group()
    exclusive.add_argument(
        "--rbac-dir", type=Path, metavar="DIR", help="read RBAC (and, for audit, objects) here"
    )
    exclusive.add_argument(
        "--kubeconfig", type=Path, metavar="FILE", help="read RBAC from this cluster"
    )
    group.add_argument(
        "--context", metavar="NAME", help="the kubeconfig context to use (default: current)"
    )
    return parent


@dataclass
class Loaded:
    """RBAC read for one command, from a directory or a cluster."""

    snapshot: Snapshot
    where: str
    objects: list[tuple[str, Mapping[str, Any]]]  # the directory's objects (none from a cluster)
    client: KubeClient | None = None
    # Objects a decision reads besides the request: from the cluster, or none (a directory).
    lookup: ParentLookup = no_parent_lookup
    metadata: MetadataLookup = no_metadata_lookup


def _kube_connection(kubeconfig: Path | None) -> tuple[Path | None, bool]:
    """(kubeconfig, in-cluster) as kubectl chooses: the flag, $KUBECONFIG, ~/.kube/config,
    else the pod's service account."""
    if kubeconfig is not None:
        if not kubeconfig.is_file():
            raise CliError(f"--kubeconfig {kubeconfig}: no such file")
        return kubeconfig, False
    if os.environ.get("KUBECONFIG"):
        return Path(os.environ["KUBECONFIG"]), False
    default = Path.home() / ".kube" / "config"
    if default.is_file():
        return default, False
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return None, True
    raise CliError(
        "no RBAC to read: pass --rbac-dir DIR or --kubeconfig FILE "
        "(or set $KUBECONFIG, have ~/.kube/config, or run in a pod)"
    )


def _load(args: argparse.Namespace, settings: Settings) -> Loaded:
    from app.source.listing import cluster_snapshot

    if args.rbac_dir is not None:
        directory: Path = args.rbac_dir
        if not directory.exists():
            raise CliError(f"--rbac-dir {directory}: no such directory")
        if not directory.is_dir():
            raise CliError(f"--rbac-dir {directory}: not a directory")
        try:
            objects = read_manifests(directory)
        except OSError as exc:
            raise CliError(f"--rbac-dir {directory}: {exc.strerror or exc}") from None
        rbac_kinds = {spec.kind for spec in (*ROLE_KINDS, *BINDING_KINDS)}
        if not any(kind in rbac_kinds for kind, _ in objects):
            raise CliError(
                f"--rbac-dir {directory}: no Role, ClusterRole, RoleBinding or "
                "ClusterRoleBinding in it, so there is nothing to decide from"
            )
        return Loaded(snapshot_from_objects(objects, settings.compiler), str(directory), objects)
    from app.source.api import ConfigError, KubeClient, KubeError
    from app.source.cluster import ClusterSource

    kubeconfig, in_cluster = _kube_connection(args.kubeconfig)
    if args.context and in_cluster:
        raise CliError("--context needs a kubeconfig (--kubeconfig, $KUBECONFIG, ~/.kube/config)")
    try:
        client = KubeClient.connect(kubeconfig, in_cluster, args.context)
    except ConfigError as exc:
        where = f"{kubeconfig}: " if kubeconfig else ""
        raise CliError(f"{where}{exc}") from None
    try:
        snapshot = cluster_snapshot(client, settings.compiler)
    except KubeError as exc:
        raise CliError(f"cannot read RBAC from {client.host}: {exc}") from None
    # The watch cache's lookups, without its watches: parents and metadata read on demand.
    reader = ClusterSource(client, settings.compiler)
    return Loaded(snapshot, client.host, [], client, reader.fetch_parent, reader.fetch_metadata)


def _manifest(path: str) -> list[tuple[str, Mapping[str, Any]]]:
    """The objects of ``-f FILE`` (``-`` is stdin)."""
    try:
        data = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except OSError as exc:
        raise CliError(f"-f {path}: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CliError(f"-f {path}: not UTF-8 text (byte {exc.start})") from None
    objects = [(k, o) for k, o in parse_manifests(text, f"-f {path}") if k]
    if not objects:
        raise CliError(f"-f {path}: no Kubernetes object in it")
    return objects


def _resource_of(kind: str, obj: Mapping[str, Any], loaded: Loaded) -> Resource:
    """The resource a manifest's kind is served as: by discovery against a cluster."""
    from app.audit import group_of, plural
    from app.source.api import KubeError
    from app.source.listing import discover

    group = group_of(obj)
    if loaded.client is not None:
        try:
            resources = discover(loaded.client)
        except KubeError as exc:
            raise CliError(f"cannot read API discovery at {loaded.where}: {exc}") from None
        for found in resources:
            if found.kind == kind and found.group == group:
                return found.as_resource
    return Resource(group, plural(kind))


AUTHENTICATED, UNAUTHENTICATED, ANONYMOUS = (
    "system:authenticated",
    "system:unauthenticated",
    "system:anonymous",
)


def impersonated(username: str, groups: Sequence[str]) -> UserInfo:
    """The identity ``--as``/``--as-group`` stand for, as the API server completes it when
    impersonating: a service account without groups gets its default groups, and everyone
    ``system:authenticated`` (``system:unauthenticated`` for ``system:anonymous``)."""
    found = list(groups)
    if not found and username.startswith(SERVICE_ACCOUNT_PREFIX):
        namespace = username[len(SERVICE_ACCOUNT_PREFIX) :].partition(":")[0]
        found = ["system:serviceaccounts", f"system:serviceaccounts:{namespace}"]
    if username != ANONYMOUS:
        if AUTHENTICATED not in found and UNAUTHENTICATED not in found:
            found.append(AUTHENTICATED)
    elif UNAUTHENTICATED not in found:
        found.append(UNAUTHENTICATED)
    return UserInfo(username, tuple(found))


def _review_document(path: Path) -> Any:
    deepjson.prepare()  # a review may be nested as deep as the API server allows
    try:
        return deepjson.loads(path.read_bytes().decode("utf-8"))
    except OSError as exc:
        raise CliError(f"--review {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise CliError(f"--review {path}: not JSON: {exc}") from None


def _selector_arg(text: str) -> Selector:
    """``kubectl -l`` syntax: blanks around terms are skipped as Kubernetes skips them, and
    every key and value must then be one Kubernetes accepts."""
    try:
        selector = parse_selector(text)
    except SelectorError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    for req in selector:
        bad = [v for v in req.values if not is_label_value(v)]
        if not is_label_key(req.key) or bad:
            raise argparse.ArgumentTypeError(
                f"invalid label selector {text!r}: {req.key!r}{f' {bad[0]!r}' if bad else ''} is "
                "not a label key and value as Kubernetes accepts them"
            )
    return selector


def _is_read(args: argparse.Namespace) -> bool:
    """A SubjectAccessReview file, or a read or identity loan asked with flags: decided by the
    authorization pipeline."""
    if args.review:
        document = _review_document(args.review)
        return isinstance(document, Mapping) and document.get("kind") == "SubjectAccessReview"
    if args.verb == "deletecollection":
        return args.selector is not None
    return args.verb in AUTHORIZED_VERBS


def _access(args: argparse.Namespace) -> AccessReview:
    if args.review:
        try:
            return parse_access_review(_review_document(args.review))
        except ReviewError as exc:
            raise CliError(f"--review {args.review}: {exc}") from None
    if not args.user or args.resource is None:
        raise CliError("--as USER and --resource are required (or --review FILE)")
    access = Access(
        impersonated(args.user, args.group),
        args.verb,
        args.resource,
        "v1",  # the version kubectl asks for of every built-in resource label-rbac restricts
        args.namespace,
        args.name,
        labels=args.selector,
    )
    return AccessReview("authorization.k8s.io/v1", access, None)


def _node_graph(loaded: Loaded) -> NodeGraph:
    """The node graph of the directory's Pods, PVs and VolumeAttachments, or the cluster's."""
    if loaded.client is None:
        return NodeGraph.from_objects(loaded.objects)
    from app.source.api import KubeError, object_path

    objects: list[tuple[str, Mapping[str, Any]]] = []
    for spec in GRAPH_KINDS:
        path = object_path(spec.group, spec.version, spec.resource)
        try:
            items, _ = loaded.client.list(path, 500, (10.0, 60.0))
        except KubeError as exc:
            raise CliError(f"could not list {spec.resource} for the node graph: {exc}") from None
        objects += [(spec.kind, item) for item in items]
    return NodeGraph.from_objects(objects)


def _cmd_check_read(args: argparse.Namespace, settings: Settings, loaded: Loaded) -> int:
    """Explain a read as the authorization webhook answers it."""
    from app.audit import dump

    review = _access(args)
    metadata = loaded.metadata
    if args.label:  # -l states the named object's labels, instead of reading them
        labels = dict(args.label)

        def metadata(ref: ObjectRef) -> Mapping[str, Any]:
            return {"metadata": {"name": ref.name, "labels": labels}}

    graph = _node_graph(loaded) if args.node_authorizer else None
    ctx = Context(loaded.snapshot, settings.engine_options, loaded.lookup, metadata, graph)
    checks = (check_node_read, *READ_CHECKS) if args.node_authorizer else READ_CHECKS
    if review.access is None:
        decision = AccessDecision.no_opinion("NonResource", "non-resource requests are RBAC's")
    else:
        decision = authorize(review.access, ctx, checks)
    if args.output != "text":
        data = {
            "verdict": decision.verdict.value,
            "reason": decision.reason,
            "message": decision.message,
            "explanation": list(decision.explanation),
        }
        print(dump(data, args.output), end="")
    else:
        words = {"Allow": "allowed", "Deny": "denied", "NoOpinion": "no opinion"}
        detail = decision.message or (
            "RBAC decides" if decision.verdict is Verdict.NO_OPINION else ""
        )
        print(
            f"{words[decision.verdict.value]} ({decision.reason}){': ' if detail else ''}{detail}"
        )
        for line in decision.explanation:
            print(f"  - {line}")
    return 1 if decision.verdict is Verdict.DENY else 0


def _requests(args: argparse.Namespace, loaded: Loaded) -> list[Request]:
    if args.review:
        document = _review_document(args.review)
        try:
            return [parse_review(document).request]
        except ReviewError as exc:
            raise CliError(f"--review {args.review}: {exc}") from None
    if not args.user:
        raise CliError("--as USER is required (or --review FILE)")
    verb = args.verb or ("create" if args.filename else None)
    if verb is None or (args.resource is None and not args.filename):
        raise CliError("--verb and --resource are required (or -f FILE, or --review FILE)")
    labels = dict(args.label)
    operation = OPERATION_FOR_VERB[verb]
    user = impersonated(args.user, args.group)
    if args.filename:
        targets = _manifest(args.filename)
    else:
        targets = [("", {"metadata": {"name": args.name, "labels": labels}})]
    requests = []
    for kind, obj in targets:
        meta = obj.get("metadata") or {}
        resource = args.resource or _resource_of(kind, obj, loaded)
        # A collection delete reaches admission as one DELETE per object, naming none.
        name = "" if verb == "deletecollection" else args.name or str(meta.get("name") or "")
        requests.append(
            Request(
                uid="cli",
                operation=operation,
                user=user,
                resource=resource,
                kind=kind,
                namespace=args.namespace or str(meta.get("namespace") or ""),
                name=name,
                object=None if operation == "DELETE" else obj,
                old_object=obj if operation in ("UPDATE", "DELETE") else None,
            )
        )
    return requests


def _decision_dict(request: Request, decision: Decision) -> dict[str, Any]:
    return {
        "resource": str(request.resource),
        "namespace": request.namespace,
        "name": request.name,
        "allowed": decision.allowed,
        "mode": decision.mode,
        "reason": decision.reason,
        "code": decision.code,
        "message": decision.message,
        "explanation": list(decision.explanation),
        "warnings": list(decision.warnings),
    }


def _print_decision(decision: Decision) -> None:
    if decision.softened:
        print(
            f"allowed in {decision.mode} mode, would be denied ({decision.reason}): "
            f"{decision.message}"
        )
    elif decision.allowed:
        print(f"allowed ({decision.reason})")
    else:
        print(f"denied ({decision.code} {decision.reason}): {decision.message}")
    for line in decision.explanation:
        print(f"  - {line}")
    for warning in decision.warnings:
        print(f"  warning: {warning}")


def _cmd_check(args: argparse.Namespace) -> int:
    from app.audit import dump

    settings = _settings(args)
    loaded = _load(args, settings)
    if _is_read(args):
        return _cmd_check_read(args, settings, loaded)
    requests = _requests(args, loaded)
    ctx = Context(loaded.snapshot, settings.engine_options, loaded.lookup, loaded.metadata)
    # Flags describe only the object's labels: what a write makes controllers do (its pod
    # template, selector, references) is judged for a whole object, from -f or --review.
    whole = bool(args.review or args.filename)
    results = [
        (request, evaluate(request, ctx, post_checks=POST_CHECKS if whole else ()))
        for request in requests
    ]
    if args.output == "text":
        for request, decision in results:
            if len(results) > 1:  # several objects from -f: say which one each answer is for
                print(f"{request.describe()}:")
            _print_decision(decision)
    else:
        data = [_decision_dict(r, d) for r, d in results]
        print(dump(data[0] if len(data) == 1 else data, args.output), end="")
    return 0 if all(d.allowed for _, d in results) else 1


def _cmd_who_can(args: argparse.Namespace) -> int:
    from app.audit import dump, holders_table
    from app.engine.reverse import who_can

    settings = _settings(args)
    loaded = _load(args, settings)
    labels = dict(args.label)
    holders = who_can(
        loaded.snapshot, args.verb, args.resource, args.namespace, labels, args.name,
        settings.allow_unlabeled,
    )  # fmt: skip
    if args.output == "table":
        print(holders_table(holders), end="")
        return 0
    data = {
        "verb": args.verb,
        "resource": str(args.resource),
        "namespace": args.namespace,
        "labels": labels,
        "subjects": [h.as_dict() for h in holders],
    }
    print(dump(data, args.output), end="")
    return 0


def _cmd_audit(args: argparse.Namespace) -> int:
    from app.audit import cluster_objects, dump, manifest_objects, report_text
    from app.engine.reverse import audit
    from app.source.api import KubeError

    settings = _settings(args)
    loaded = _load(args, settings)
    if loaded.client is not None:
        try:
            objects = cluster_objects(loaded.client, loaded.snapshot, args.namespace)
        except KubeError as exc:
            raise CliError(f"cannot list objects at {loaded.where}: {exc}") from None
    else:
        objects = manifest_objects(loaded.objects)
    if args.namespace:
        objects = [o for o in objects if o.namespace == args.namespace]
    report = audit(loaded.snapshot, objects, settings.allow_unlabeled)
    if args.namespace:
        report.buckets = {
            ns: found for ns, found in report.buckets.items() if ns in ("", args.namespace)
        }
    if args.output == "table":
        print(report_text(report), end="")
    else:
        print(dump(report.as_dict(), args.output), end="")
    return 1 if report.orphans or report.unbucketed else 0


def _cmd_gen_certs(args: argparse.Namespace) -> int:
    from app.certs import generate

    try:
        paths = generate(args.out, args.dns, args.days)
    except OSError as exc:
        raise CliError(f"--out {args.out}: cannot write there: {exc.strerror or exc}") from None
    print(f"wrote {paths.ca}, {paths.cert}, {paths.key}")
    return 0


def _cmd_lint(args: argparse.Namespace) -> int:
    compiler = _settings(args).compiler
    try:
        objects = read_manifests(*args.files)
    except (OSError, ManifestError) as exc:
        print(f"lint: {exc}", file=sys.stderr)
        return 2
    role_kinds = {spec.kind: spec for spec in ROLE_KINDS}
    roles = [
        (_manifest_name(kind, obj), role_kinds[kind].compile(compiler, obj))
        for kind, obj in objects
        if kind in role_kinds
    ]
    if not roles:
        print("lint: no Role or ClusterRole found", file=sys.stderr)
        return 2
    for name, role in roles:
        if role.error is not None:
            print(f"invalid: {name}: {role.error}")
        else:
            entries = len(role.permissions.entries) if role.permissions else 0
            print(f"ok: {name} ({entries} permission entr{'y' if entries == 1 else 'ies'})")
    return 1 if any(role.error is not None for _, role in roles) else 0


def _manifest_name(kind: str, obj: Mapping[str, Any]) -> str:
    """``role t1/x``, ``role x`` (no namespace in the file yet), ``clusterrole x``, as written."""
    meta = obj.get("metadata")
    name = str(meta.get("name") or "") if isinstance(meta, Mapping) else ""
    namespace = meta.get("namespace") if isinstance(meta, Mapping) and kind == "Role" else None
    return f"{kind.lower()} {f'{namespace}/' if namespace else ''}{name or '(no name)'}"


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _cmd_compile(args: argparse.Namespace) -> int:
    from app import logs
    from app.compile import LeaderLease, identity, run
    from app.source.api import KubeClient

    kubeconfig, in_cluster = _kube_connection(args.kubeconfig)
    settings = _settings(
        args,
        kubeconfig=kubeconfig,
        in_cluster=in_cluster,
        webhook_configuration=args.webhook_configuration,
    )
    logs.configure(args.log_level)
    client = KubeClient.connect(kubeconfig, in_cluster)
    lease = LeaderLease(
        client,
        args.lease_namespace,
        args.lease_name,
        args.identity or identity(),
        duration=args.lease_seconds,
    )
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    run(client, settings, lease, stop, args.max_params_bytes)
    logs.stop()
    return 0


def main(argv: Sequence[str] | None = None, prog: str = "python -m app") -> int:
    try:
        args = _parser(prog).parse_args(argv)
    except UsageError as exc:
        print(_one_line(str(exc)), file=sys.stderr)
        return 2
    handler = {
        "serve": _cmd_serve,
        "compile": _cmd_compile,
        "check": _cmd_check,
        "who-can": _cmd_who_can,
        "audit": _cmd_audit,
        "gen-certs": _cmd_gen_certs,
        "lint": _cmd_lint,
    }[args.command]
    try:
        return handler(args)
    except (CliError, ManifestError) as exc:
        print(f"{args.command}: {_one_line(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (``| head``): stop quietly, as kubectl does.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def entry() -> int:
    """The ``label-rbac`` console script."""
    return main(prog="label-rbac")


def plugin_main() -> int:
    """The ``kubectl-label_rbac`` console script: kubectl runs it for ``kubectl label-rbac``."""
    return main(prog="kubectl label-rbac")
