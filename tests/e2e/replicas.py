"""Two webhook replicas behind HAProxy in a loopback control plane (tests/e2e, bench ha)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.e2e.balancer import Balancer
from tests.e2e.load import Load
from tests.kube.cluster import LabelRbacCluster
from tests.process import Server, free_port, stop

# Seconds a replica keeps answering, unready, after SIGTERM (the Deployment ships 10): longer
# than the balancer needs to see /readyz fail (two checks).
DRAIN_SECONDS = "2"


class Replicated:
    """label-rbac with replicas ``r1`` (the cluster's own) and ``r2`` behind ``balancer``."""

    def __init__(self, workdir: Path) -> None:
        port = free_port()
        # Both webhooks' URL (the admission entries' and the authorization kubeconfig's).
        self.cluster = LabelRbacCluster(
            workdir,
            serve_args=("--drain-seconds", DRAIN_SECONDS),
            webhook_url=f"https://127.0.0.1:{port}",
        )
        self.ports = {"r1": self.cluster.webhook_port, "r2": free_port()}
        self.balancer = Balancer(workdir / "balancer", self.ports, port=port)
        self.servers: dict[str, Server] = {}
        self.launches = 0

    def start(self) -> None:
        self.balancer.start()
        self.cluster.start()
        assert self.cluster.webhook is not None
        self.servers["r1"] = self.cluster.webhook
        self.launch("r2")
        for name in self.ports:
            self.balancer.wait_state(name, "UP")

    def launch(self, name: str) -> Server:
        self.launches += 1
        # One log per process: a drained replica still writes while its successor starts.
        log_name = f"webhook-{name}-{self.launches}.log"
        server = self.cluster.launch_webhook(self.ports[name], log_name=log_name)
        server.wait_ready()
        self.servers[name] = server
        if name == "r1":
            self.cluster.webhook = server
        return server

    def signal(self, name: str, signum: signal.Signals) -> subprocess.Popen[Any]:
        """``signum`` to replica ``name`` as a container runtime delivers it: SIGTERM to the
        main process (gunicorn's arbiter, which drains and then stops its workers), SIGKILL to
        every process of the container (arbiter and workers)."""
        process = self.servers[name].process
        if signum == signal.SIGKILL:
            os.killpg(process.pid, signum)
        else:
            os.kill(process.pid, signum)
        return process

    def stop(self) -> None:
        for server in self.servers.values():
            stop(server.process)
        self.cluster.stop()
        self.balancer.stop()


@contextmanager
def replicated(workdir: Path) -> Iterator[Replicated]:
    setup = Replicated(workdir)
    try:
        setup.start()
        yield setup
    finally:
        setup.stop()


PHASES = ["steady", "drain", "kill", "after"]


def run_faults(ha: Replicated, load: Load, steady: int = 40, settle: float = 1.0) -> None:
    """Under ``load``: ``steady`` requests, then r1 drained (SIGTERM) and started again, then r2
    killed (SIGKILL) and started again, then ``steady`` more; ``load.phase`` names each.

    A request counts in the phase it started in, so before the kill the drain's last requests
    get ``settle`` seconds to finish (a steady-state answer takes milliseconds).
    """
    balancer = ha.balancer
    load.phase = "steady"
    load.wait_for(steady)

    load.phase = "drain"
    drained = ha.signal("r1", signal.SIGTERM)
    balancer.wait_state("r1", "DOWN")
    drained.wait(timeout=60)
    assert drained.returncode == 0, "the drained replica exits 0"
    ha.launch("r1")
    balancer.wait_state("r1", "UP")
    load.wait_for(steady // 2)

    load.phase = "kill"
    time.sleep(settle)
    killed = ha.signal("r2", signal.SIGKILL)
    killed.wait(timeout=10)
    balancer.wait_state("r2", "DOWN")
    load.wait_for(steady // 2)
    ha.launch("r2")
    balancer.wait_state("r2", "UP")

    load.phase = "after"
    load.wait_for(steady)
