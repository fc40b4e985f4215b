"""Command line: ``serve``, ``check``, ``gen-certs`` and ``lint``."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import app
from app.engine.context import Context
from app.engine.decide import POST_CHECKS, evaluate
from app.engine.kinds import ROLE_KINDS
from app.engine.model import ENFORCE, MODES, Decision, Request, Resource, UserInfo
from app.engine.policy import DEFAULT_ANNOTATION_KEY, AnnotationError, resource_pattern
from app.settings import Settings
from app.source.static import ManifestError, StaticSource, read_manifests
from app.wire import ReviewError, parse_review

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


def _policy_flags() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    group = parent.add_argument_group("policy")
    group.add_argument(
        "--annotation-key",
        action="append",
        dest="annotation_keys",
        metavar="KEY",
        help=f"annotation with label permissions (repeatable; default {DEFAULT_ANNOTATION_KEY})",
    )
    group.add_argument(
        "--default-label-key",
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
    parser = argparse.ArgumentParser(
        prog=prog, description="label-rbac: label-based permissions for Kubernetes"
    )
    parser.add_argument("--version", action="version", version=f"label-rbac {app.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    policy = _policy_flags()

    serve = sub.add_parser("serve", parents=[policy], help="run the webhook (gunicorn, TLS)")
    serve.add_argument("--bind", default="0.0.0.0:8443", metavar="HOST:PORT")
    serve.add_argument("--workers", type=int, default=2)
    serve.add_argument("--threads", type=int, default=4)
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
        type=float,
        metavar="SECONDS",
        help="deny everything once the cluster state is older than this (default: off)",
    )
    serve.add_argument("--max-body-bytes", type=int, default=Settings.max_body_bytes)
    serve.add_argument("--log-level", default="info")
    serve.add_argument(
        "--drain-seconds",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="after SIGTERM, keep serving this long with /readyz at 503 (default 0)",
    )

    check = sub.add_parser(
        "check", parents=[policy], help="explain one decision, like kubectl auth can-i"
    )
    check.add_argument("--rbac-dir", type=Path, required=True)
    check.add_argument("--review", type=Path, help="an AdmissionReview JSON file to decide")
    check.add_argument("--as", "--user", dest="user", metavar="USER")
    check.add_argument(
        "--as-group", "--group", dest="group", action="append", default=[], metavar="GROUP"
    )
    check.add_argument("--verb", choices=sorted(OPERATION_FOR_VERB))
    check.add_argument("--resource", help="res[.group][/subresource], e.g. deployments.apps")
    check.add_argument("-n", "--namespace", default="")
    check.add_argument("--name", default="")
    check.add_argument("-l", "--label", action="append", default=[], metavar="KEY=VALUE")

    certs = sub.add_parser("gen-certs", help="write a CA and serving certificate")
    certs.add_argument("--out", type=Path, required=True)
    certs.add_argument("--dns", action="append", required=True, metavar="NAME")
    certs.add_argument("--days", type=int, default=365)

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
        max_body_bytes=args.max_body_bytes,
        log_level=args.log_level,
        drain_seconds=args.drain_seconds,
    )
    try:
        serve(settings)
    except ConfigError as exc:
        print(f"serve: {exc}", file=sys.stderr)
        return 2
    return 0


def _request_from_flags(args: argparse.Namespace) -> Request:
    missing = [f"--{n}" for n in ("user", "verb", "resource") if not getattr(args, n)]
    if missing:
        raise ValueError(f"without --review, {', '.join(missing)} are required")
    labels = {}
    for item in args.label:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--label {item!r}: expected KEY=VALUE")
        labels[key] = value
    operation = OPERATION_FOR_VERB[args.verb]
    obj = {"metadata": {"name": args.name, "labels": labels}}
    return Request(
        uid="cli",
        operation=operation,
        user=UserInfo(args.user, tuple(args.group)),
        resource=Resource.parse(args.resource),
        kind="",
        namespace=args.namespace,
        # A collection delete reaches admission as one DELETE per object, naming none.
        name="" if args.verb == "deletecollection" else args.name,
        object=None if operation == "DELETE" else obj,
        old_object=obj if operation in ("UPDATE", "DELETE") else None,
    )


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
    settings = _settings(args)
    try:
        if args.review:
            request = parse_review(json.loads(args.review.read_text())).request
        else:
            request = _request_from_flags(args)
        source = StaticSource(args.rbac_dir, settings.compiler)
        source.start()
    except (OSError, ValueError, ReviewError, ManifestError) as exc:
        print(f"check: {exc}", file=sys.stderr)
        return 2
    snapshot = source.snapshot()
    if snapshot is None:
        print(f"check: could not load {args.rbac_dir}", file=sys.stderr)
        return 2
    # Flags describe only the object's labels: what the write makes controllers do (its pod
    # template, selector, references) is judged for a whole object, given with --review.
    decision = evaluate(
        request,
        Context(snapshot, settings.engine_options, source.fetch_parent, source.fetch_metadata),
        post_checks=POST_CHECKS if args.review else (),
    )
    _print_decision(decision)
    return 0 if decision.allowed else 1


def _cmd_gen_certs(args: argparse.Namespace) -> int:
    from app.certs import generate

    paths = generate(args.out, args.dns, args.days)
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
    roles = [role_kinds[kind].compile(compiler, obj) for kind, obj in objects if kind in role_kinds]
    if not roles:
        print("lint: no Role or ClusterRole found", file=sys.stderr)
        return 2
    for role in roles:
        if role.error is not None:
            print(f"invalid: {role.ref}: {role.error}")
        else:
            entries = len(role.permissions.entries) if role.permissions else 0
            print(f"ok: {role.ref} ({entries} permission entr{'y' if entries == 1 else 'ies'})")
    return 1 if any(role.error is not None for role in roles) else 0


def main(argv: Sequence[str] | None = None, prog: str = "python -m app") -> int:
    args = _parser(prog).parse_args(argv)
    handler = {
        "serve": _cmd_serve,
        "check": _cmd_check,
        "gen-certs": _cmd_gen_certs,
        "lint": _cmd_lint,
    }[args.command]
    return handler(args)


def entry() -> int:
    """The ``label-rbac`` console script."""
    return main(prog="label-rbac")


def plugin_main() -> int:
    """The ``kubectl-label_rbac`` console script: kubectl runs it for ``kubectl label-rbac``."""
    return main(prog="kubectl label-rbac")
