"""Two replicas behind a load balancer, under steady tenant traffic through the real API server:
one drained (SIGTERM), the other killed (SIGKILL), both restarted.

The drain loses nothing: the replica goes unready, the balancer stops sending it new
connections, its answers close their connections, and what was accepted is answered. A SIGKILL
loses the requests that were on the killed replica's connections at that instant: the
AdmissionReview was written to a connection that then ended without an answer (``EOF``), the
API server's HTTP client does not send a POST again once written, and the enforce overlay's
``failurePolicy: Fail`` makes it a refusal (500, ``failed calling webhook``); an authorization
call lost so is a refusal too (``failurePolicy: Deny``, answered 500). New connections never
reach the dead replica: a refused connection is redispatched by the balancer, which marks the
replica down within two health checks. So the failures are bounded by the requests in flight
at the kill, and a failure is never an allow.
"""

from __future__ import annotations

from tests.e2e.load import FAILED, WRONG, Load, probes, summary, until
from tests.e2e.replicas import PHASES, Replicated, run_faults
from tests.kube.support import fresh_namespace, install_tenants

# What a request lost to the SIGKILL looks like, as the API server reports it.
KILLED = (
    'failed calling webhook "',  # admission, failurePolicy Fail
    "Internal error occurred",  # authorization, failurePolicy Deny
    # The same, answered in plain text by the API server's authorization filter when the
    # authorizer itself returned the error (``responsewriters.InternalError``).
    'Internal Server Error: "',
)


def test_drain_loses_nothing_and_a_kill_loses_only_requests_in_flight(ha: Replicated) -> None:
    namespace = fresh_namespace(ha.cluster)
    install_tenants(ha.cluster, namespace)
    load = Load(ha.cluster.control_plane, probes(namespace), threads=2).start()
    try:
        run_faults(ha, load)
    finally:
        load.stop()
    rows = {row["phase"]: row for row in summary(load, PHASES)}
    assert load.of(outcome=WRONG) == [], "a wrong decision"
    for phase in ("steady", "drain", "after"):
        assert rows[phase]["requests"] > 0, rows
        assert load.of(phase, FAILED) == [], (phase, load.of(phase, FAILED))
    failures = load.of("kill", FAILED)
    # The requests in flight when the replica died (one per client thread; 2 of 2 in the
    # measured runs), and at most one more each sent on a kept-alive connection to it in the
    # instant before the balancer closed that connection.
    assert len(failures) <= 2 * load.threads, failures
    for failure in failures:
        assert any(sign in failure.detail for sign in KILLED), failure
    until(lambda: all(s == "UP" for s in ha.balancer.states().values()), 10, "both replicas up")
