"""Two replicas behind a load balancer, under steady tenant traffic through the real API server:
one drained (SIGTERM), the other killed (SIGKILL), both restarted.

The drain loses nothing: the replica goes unready, the balancer stops sending it new
connections, its answers close their connections, and what was accepted is answered. A SIGKILL
loses the requests that were on the killed replica's connections at that instant: the API
server does not retry a failed admission call (an AdmissionReview POST is not retried by its
REST client), the enforce overlay's ``failurePolicy: Fail`` turns it into a refusal (500,
``failed calling webhook``), and a failed authorization call, after the authorization webhook
client's own retries (it retries a reset connection), is a refusal too (``failurePolicy: Deny``,
answered 500). New connections never reach the dead replica: a refused connection is
redispatched by the balancer, which marks the replica down within two health checks. So the
failures are bounded by the requests in flight at the kill, and no failure is ever an allow.
"""

from __future__ import annotations

import signal
import time

from tests.e2e.load import FAILED, WRONG, Load, probes, summary, until
from tests.e2e.replicas import Replicated
from tests.kube.support import fresh_namespace, install_tenants

STEADY = 40  # requests per quiet phase
SETTLE = 1.0  # seconds


def run_faults(ha: Replicated, load: Load) -> None:
    """steady -> drain r1 (SIGTERM) until it is back -> kill r2 (SIGKILL) -> restart -> after."""
    balancer = ha.balancer
    load.phase = "steady"
    load.wait_for(STEADY)

    load.phase = "drain"
    drained = ha.signal("r1", signal.SIGTERM)
    balancer.wait_state("r1", "DOWN")
    drained.wait(timeout=60)
    assert drained.returncode == 0, "the drained replica exits 0"
    ha.launch("r1")
    balancer.wait_state("r1", "UP")
    load.wait_for(STEADY // 2)

    load.phase = "kill"
    # A request is counted in the phase it started in: let those of the drain finish first
    # (a steady-state answer takes milliseconds).
    time.sleep(SETTLE)
    killed = ha.signal("r2", signal.SIGKILL)
    killed.wait(timeout=10)
    balancer.wait_state("r2", "DOWN")
    load.wait_for(STEADY // 2)
    ha.launch("r2")
    balancer.wait_state("r2", "UP")

    load.phase = "after"
    load.wait_for(STEADY)


# What a request lost to the SIGKILL looks like, as the API server reports it.
KILLED = (
    'failed calling webhook "',  # admission, failurePolicy Fail
    "Internal error occurred",  # authorization, failurePolicy Deny
)


def test_drain_loses_nothing_and_a_kill_loses_only_requests_in_flight(ha: Replicated) -> None:
    namespace = fresh_namespace(ha.cluster)
    install_tenants(ha.cluster, namespace)
    load = Load(ha.cluster.control_plane, probes(namespace), threads=2).start()
    try:
        run_faults(ha, load)
    finally:
        load.stop()
    rows = {row["phase"]: row for row in summary(load, ["steady", "drain", "kill", "after"])}
    assert load.of(outcome=WRONG) == [], "a wrong decision"
    for phase in ("steady", "drain", "after"):
        assert rows[phase]["requests"] > 0, rows
        assert load.of(phase, FAILED) == [], (phase, load.of(phase, FAILED))
    failures = load.of("kill", FAILED)
    # At most the requests in flight when the replica died: one per client thread, and each
    # of those on a connection to the killed replica (so at most one per thread, twice over
    # for the authorization client's retry of a reset connection).
    assert len(failures) <= 2 * load.threads, failures
    for failure in failures:
        assert any(sign in failure.detail for sign in KILLED), failure
    until(lambda: all(s == "UP" for s in ha.balancer.states().values()), 10, "both replicas up")
