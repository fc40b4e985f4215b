"""The RBAC source interface the HTTP layer depends on.

A source hands out immutable ``Snapshot`` objects; the request path only ever reads the latest
one. Sources that need background work (watches) start it in ``start()``, which the server calls
after gunicorn has forked the worker, never at import time.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from app.engine.context import ObjectRef, Registration
from app.engine.model import Request
from app.engine.nodegraph import NodeGraph
from app.engine.rbac import Snapshot


@dataclass(frozen=True, slots=True)
class SourceStatus:
    """Readiness as /readyz and the metrics report it."""

    ready: bool
    detail: str = ""
    # Seconds since the state was last known to be current; None while healthy or not applicable.
    stale_seconds: float | None = None


class RbacSource(Protocol):
    def start(self) -> None:
        """Begin loading (idempotent)."""

    def stop(self) -> None:
        """Stop background work."""

    def snapshot(self) -> Snapshot | None:
        """The current state, or None before the first successful load."""

    def node_graph(self) -> NodeGraph | None:
        """The node authorizer's graph (None when the node authorizer is off)."""

    def status(self) -> SourceStatus:
        """Whether the source is synced and how stale it is."""

    def registration(self) -> Registration | None:
        """What the API server's webhook registration leaves unjudged (None: nothing can be)."""

    def fetch_parent(self, request: Request) -> Mapping[str, Any]:
        """The parent object of a subresource/CONNECT request.

        Raises ``app.engine.context.ParentUnavailable`` when it cannot be read.
        """

    def fetch_metadata(self, ref: ObjectRef) -> Mapping[str, Any]:
        """The metadata of any object (``{"metadata": {...}}``), never its body.

        Raises ``app.engine.context.ParentUnavailable`` when it cannot be read.
        """


# Loads in progress (informers list in parallel) and whether the collector ran before the first.
_bulk_lock = threading.Lock()
_bulk_loads = 0
_collector_was_on = False


@contextmanager
def bulk_load() -> Iterator[None]:
    """Pause the cyclic garbage collector while objects are loaded in bulk; then freeze them.

    A load allocates millions of objects that all stay alive; each collection the allocations
    trigger walks every object allocated so far again, a third of a 100,000-object load's CPU
    time. What a load discards is freed by reference counting as before; cycles wait for the
    collector, which runs again when the last load in progress ends.

    Then every object alive is frozen (``gc.freeze``): moved out of the collector's sight, so that
    no later collection walks it again. Unfrozen, the objects of a 100,000-object load made each
    whole collection walk 1.3 million objects for about 0.8 s with the interpreter lock held —
    a stall of every request of the worker, which changes arriving by the watch brought on every
    few seconds (they make objects that live long, and that is what triggers whole collections).
    A frozen object is still freed by reference counting when nothing refers to it any more, as
    a replaced role or binding is; only a cycle among frozen objects would never be reclaimed,
    and compiled RBAC objects and snapshots hold none.
    """
    global _bulk_loads, _collector_was_on
    with _bulk_lock:
        if _bulk_loads == 0:
            _collector_was_on = gc.isenabled()
            gc.disable()
        _bulk_loads += 1
    try:
        yield
    finally:
        with _bulk_lock:
            _bulk_loads -= 1
            if _bulk_loads == 0:
                gc.freeze()
                if _collector_was_on:
                    gc.enable()
