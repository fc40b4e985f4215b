"""``report``: run the background audit (``app.reports.controller``), leader-elected, until
SIGTERM or SIGINT, keeping its findings as policy reports."""

from __future__ import annotations

import argparse
import signal
import threading

from app.cli.inputs import CliError, kube_connection, leader_lease, policy_settings


def cmd_report(args: argparse.Namespace) -> int:
    from prometheus_client import start_http_server

    from app import logs
    from app.reports.controller import REGISTRY, SYSTEM_NAMESPACES, Options, run
    from app.reports.render import OPENREPORTS, WGPOLICY
    from app.source.api import KubeClient

    if args.interval <= 0 or args.writes_per_second <= 0:
        raise CliError("--interval and --writes-per-second must be > 0")
    if args.max_results < 1 or args.max_pass_results < 1:
        raise CliError("--max-results and --max-pass-results must be >= 1")
    kubeconfig, in_cluster = kube_connection(args.kubeconfig)
    settings = policy_settings(args, kubeconfig=kubeconfig, in_cluster=in_cluster)
    logs.configure(args.log_level)
    client = KubeClient.connect(kubeconfig, in_cluster)
    lease = leader_lease(args, client)
    if args.metrics_port:
        start_http_server(args.metrics_port, registry=REGISTRY)
    kinds = (WGPOLICY, OPENREPORTS) if args.openreports else (WGPOLICY,)
    excluded = set(args.exclude_namespace)
    if not args.include_system_namespaces:
        excluded |= SYSTEM_NAMESPACES | {args.lease_namespace}
    options = Options(
        args.interval,
        args.writes_per_second,
        args.max_results,
        kinds,
        max_passes=args.max_pass_results,
        excluded=frozenset(excluded),
    )
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    run(client, settings, lease, stop, options)
    logs.stop()
    return 0
