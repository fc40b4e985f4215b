"""``label-rbac compile --registration-only``: the narrowing of the webhook's label rule, alone.

Without the compiled policies there are no parameters to write, but the webhook's label-rule
entry still fails closed on every namespaced write of every judged namespace. This keeps the
``skip-unjudged`` condition of that entry (``app.compiled.registration.CoverageWriter``) in step
with the
roles and the served resources, as the compiler's leader does beside the parameters: a webhook
outage then stops only the writes a label restriction may concern, in every install.

The same pieces as ``app.compiled.compiler``: one leader at a time through the Lease
(``LeaderLease``), the
webhook's cluster source for RBAC, discovery every ``DISCOVERY_INTERVAL``; a new leader compares
the live registration again. It writes nothing but the registration's condition and annotation,
which the ``<name>-registration`` guard policy holds it to.
"""

from __future__ import annotations

import logging
import threading
import time

from app.compiled.compiler import DISCOVERY_INTERVAL, FIELD_MANAGER, LeaderLease, ServedResources
from app.compiled.health import CompilerHealth
from app.compiled.registration import CoverageWriter
from app.engine.model import Resource
from app.settings import Settings
from app.source.api import KubeClient, KubeError
from app.source.cluster import ClusterSource
from app.source.informer import Tuning

log = logging.getLogger("label_rbac.compile")


def run_registration_only(
    client: KubeClient,
    settings: Settings,
    lease: LeaderLease,
    stop: threading.Event,
    health: CompilerHealth | None = None,
) -> None:
    """Keep the registration's ``skip-unjudged`` conditions until ``stop`` is set."""
    coverage = CoverageWriter(client, FIELD_MANAGER, settings.webhook_configuration)
    source = ClusterSource(client, settings.compiler, tuning=Tuning(start_wait=0))
    if health is not None:
        health.watching(source.status)
    source.start()
    # One discovery kept across rounds: a group whose listing fails keeps what it listed.
    discover = ServedResources()
    served: tuple[Resource, ...] = ()
    discovered_at = -DISCOVERY_INTERVAL
    leading = False
    retry = max(0.2, lease.duration / 6)
    try:
        while not stop.is_set():
            try:
                now_leading = lease.keep(lease.duration / 3)
                if now_leading and not leading:
                    log.info("leading (lease %s/%s): keeping %s", lease.namespace, lease.name,
                             coverage.name)  # fmt: skip
                    coverage.reset()
                leading = now_leading
                snapshot = source.snapshot()
                if leading and snapshot is not None:
                    if time.monotonic() - discovered_at > DISCOVERY_INTERVAL:
                        served = tuple(discover(client))
                        discovered_at = time.monotonic()
                    coverage.step(snapshot, served)
            except KubeError as exc:
                log.warning("could not update %s: %s", coverage.name, exc)
                if health is not None:
                    health.failed()
            if health is not None:
                health.round(leading, 0, True, 0)
            stop.wait(retry)
    finally:
        source.stop()
