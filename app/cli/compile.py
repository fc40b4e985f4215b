"""``compile``: run the parameter compiler of the compiled path (``app.compiled.compiler``),
leader-elected, until SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import signal
import threading

from app.cli.inputs import kube_connection, leader_lease, policy_settings


def cmd_compile(args: argparse.Namespace) -> int:
    from app import logs
    from app.compiled.admission_policy import Install
    from app.compiled.compiler import run
    from app.source.api import KubeClient

    kubeconfig, in_cluster = kube_connection(args.kubeconfig)
    settings = policy_settings(
        args,
        kubeconfig=kubeconfig,
        in_cluster=in_cluster,
        webhook_configuration=args.webhook_configuration,
    )
    logs.configure(args.log_level)
    client = KubeClient.connect(kubeconfig, in_cluster)
    lease = leader_lease(args, client)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    health = probes = None
    if args.probe_bind is not None:
        from app.compiled.health import CompilerHealth, ProbeServer

        health = CompilerHealth(args.lease_seconds)
        host, port = args.probe_bind
        probes = ProbeServer(health, host, port)
        probes.start()
    try:
        if args.registration_only:
            from app.compiled.narrowing import run_registration_only

            run_registration_only(client, settings, lease, stop, health)
        else:
            run(
                client,
                settings,
                lease,
                stop,
                args.max_params_bytes,
                args.max_params_work,
                health,
                args.compile_softened,
                Install(args.policy_name, args.lease_namespace),
            )
    finally:
        if probes is not None:
            probes.stop()
    logs.stop()
    return 0
