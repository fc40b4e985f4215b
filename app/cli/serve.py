"""``serve`` and ``gen-certs``: run the webhook (gunicorn, TLS) and write a CA and serving
certificate. The webhook's modules (``app.webhook``) are imported when the command runs."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from app.cli.inputs import CliError, one_line, policy_settings


def cmd_serve(args: argparse.Namespace) -> int:
    from app.webhook.certs import generate
    from app.webhook.serve import ConfigError, serve

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
    settings = policy_settings(
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
        print(f"serve: {one_line(str(exc))}", file=sys.stderr)
        return 2
    return 0


def cmd_gen_certs(args: argparse.Namespace) -> int:
    from app.webhook.certs import generate

    try:
        paths = generate(args.out, args.dns, args.days)
    except OSError as exc:
        raise CliError(f"--out {args.out}: cannot write there: {exc.strerror or exc}") from None
    print(f"wrote {paths.ca}, {paths.cert}, {paths.key}")
    return 0
