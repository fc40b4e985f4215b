"""Proof that the policies see a batch of new parameters: one proof for many namespaces.

A namespace may be marked compiled only once the API server's informer of parameters, which the
policies read, holds its parameters: marked before, its plain writes would be judged by no one
(the policy stands aside where it finds no parameters). For one namespace the compiler proves it
with an update of the new parameters, which ``label-rbac-params-visible`` admits only once that
informer holds them (``ParamsWriter._seen``): a second request per namespace, about as costly to
the API server as the create (docs/performance.md, "The first compile").

A first compile creates thousands at once, so they are proven a batch at a time instead. That
informer applies the changes of parameters in the order the API server made them, so once it
holds a change made after every create of a batch was answered, it holds the whole batch. The
compiler sets an epoch (the annotation ``EPOCH``) on one namespace's parameters, the sentinel,
after the batch's creates were answered, and asks, with a dry-run update carrying the label
``EPOCH``, whether the informer holds that epoch; ``label-rbac-params-visible`` refuses the dry
run until it does. It does so twice: an informer that coalesces the changes of one object
(client-go's DeltaFIFO) applies the first epoch where a change of the sentinel still queued
stood, possibly ahead of the batch; the second, set once the first is seen, has no queued change
of the sentinel to join, and comes after the batch. Before, a dry run asking for an epoch never
set must be refused: that proves the policy checks epochs (an older release's does not) and
judges the sentinel's namespace (an exempt one is not judged); where it is not refused, the batch
is proven one namespace at a time, as before.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Callable, Mapping, Set
from functools import partial

from app.compiled.admission_policy import EPOCH, EPOCH_MESSAGE, SHIPPED
from app.source.api import ApiError, KubeClient, KubeError

# The refusal of an update of parameters the API server's informer does not hold yet, and the
# pauses before trying again: at most 0.775 s of a writer's time.
NOT_SEEN = "no params found"
SEEN_RETRIES = (0.025, 0.05, 0.1, 0.2, 0.4)
MERGE = "application/merge-patch+json"
FIELD_MANAGER = "label-rbac-compiler"
# Namespaces waiting for their proof from which on a batch is proven (fewer are proven one by
# one, which takes fewer requests), and sentinels refused in a row before batches are given up
# for the leader's term (the policy does not check epochs: an older release's manifests; or
# each sentinel's namespace was exempt, which costs two requests a sentinel).
BATCH = 16
GIVE_UP = 8


class EpochUnchecked(KubeError):
    """The policy admitted a dry run asking for an epoch never set: it does not check epochs
    there."""


def retried(
    attempt: Callable[[], bool],
    refusals: tuple[str, ...],
    what: str,
    failure: ApiError | None = None,
) -> None:
    """Call ``attempt`` until it returns True, pausing ``SEEN_RETRIES`` between tries, while it
    returns False or is refused with one of ``refusals``; then raise ``failure``, by default a
    retryable error naming ``what``."""
    for delay in (*SEEN_RETRIES, None):
        try:
            if attempt():
                return
        except ApiError as exc:
            if not any(r in exc.message for r in refusals):
                raise
        if delay is None:
            break
        time.sleep(delay)
    raise failure or ApiError(503, "NotSeen", f"the API server's policies do not see {what} yet")


def prove(client: KubeClient, path: str, epochs: Callable[[], str]) -> None:
    """Prove that the informer of parameters holds every change made before this call, through
    the parameters at ``path`` (the sentinel); ``epochs`` gives a new epoch on each call."""
    never = epochs()
    for n in range(2):
        epoch = epochs()
        # An update: admitted once the informer holds the sentinel at all.
        retried(partial(_set, client, path, epoch), (NOT_SEEN,), path)
        if n == 0:
            try:
                _ask(client, path, never)
            except ApiError as exc:
                if EPOCH_MESSAGE not in exc.message:
                    raise
            else:
                raise EpochUnchecked(f"{path}: a dry run asking for an epoch never set passed")
        retried(partial(_ask, client, path, epoch), (EPOCH_MESSAGE,), f"epoch {epoch} of {path}")


def _set(client: KubeClient, path: str, epoch: str) -> bool:
    body = {"metadata": {"annotations": {EPOCH: epoch}}}
    client.send("PATCH", path, body, [("fieldManager", FIELD_MANAGER)], MERGE)
    return True


def _ask(client: KubeClient, path: str, epoch: str) -> bool:
    body = {"metadata": {"labels": {EPOCH: epoch}}}
    query = [("dryRun", "All"), ("fieldManager", FIELD_MANAGER)]
    client.send("PATCH", path, body, query, MERGE)
    return True


def epoch_source() -> Callable[[], str]:
    """New epochs, unique to this process (a label value: letters, digits and dashes)."""
    prefix = f"e{os.getpid()}-{int(time.time() * 1000)}"
    counter = itertools.count()
    return lambda: f"{prefix}-{next(counter)}"


class Unseen:
    """The namespaces whose new parameters wait for a proof that the policies see them, each
    with what was written there; at most one proof of a batch at a time. ``unjudged``: the
    namespaces the install's policies never judge by name (``Install.unjudged``), never taken
    as a sentinel while another can be."""

    def __init__(self, unjudged: Set[str] = SHIPPED.unjudged) -> None:
        self._unjudged = unjudged
        self._lock = threading.Lock()
        self._waiting: dict[str, object] = {}
        self.proving = ""  # the sentinel of the proof in flight
        self._refused = 0  # sentinels refused in a row
        self.epochs = epoch_source()

    @property
    def batches(self) -> bool:
        """Whether batches are proven (not given up for this term)."""
        return self._refused < GIVE_UP

    def add(self, namespace: str, written: object) -> None:
        with self._lock:
            self._waiting[namespace] = written

    def discard(self, namespace: str) -> None:
        with self._lock:
            self._waiting.pop(namespace, None)

    def reset(self) -> None:
        """A new leader's term: nothing waits, batches are tried again."""
        with self._lock:
            self._waiting.clear()
            self._refused = 0

    def __len__(self) -> int:
        return len(self._waiting)

    def take(self, busy: Set[str]) -> tuple[str, dict[str, object]] | None:
        """The batch to prove now and its sentinel (one of them not being written, in a
        namespace the policies judge if one is), or None."""
        with self._lock:
            if self.proving or not self._waiting:
                return None
            free = [n for n in self._waiting if n not in busy]
            sentinel = next((n for n in free if n not in self._unjudged), free[0] if free else "")
            if not sentinel:
                return None
            self.proving = sentinel
            return sentinel, dict(self._waiting)

    def proven(self, batch: Mapping[str, object]) -> list[str]:
        """The batch was proven: those of it still waiting with what was proven, no longer."""
        with self._lock:
            self.proving, self._refused = "", 0
            done = [n for n, w in batch.items() if self._waiting.get(n) is w]
            for namespace in done:
                del self._waiting[namespace]
            return done

    def failed(self, unchecked: bool) -> list[str]:
        """The proof failed. With ``unchecked`` its sentinel does not check epochs (its
        namespace is exempt, or the policy is an older release's): the sentinel is handed back,
        to be proven on its own, and after ``GIVE_UP`` such in a row every waiting namespace is,
        and batches are given up for this term. The namespaces handed back."""
        with self._lock:
            sentinel, self.proving = self.proving, ""
            if not unchecked:
                return []
            self._refused += 1
            if self._refused < GIVE_UP:
                self._waiting.pop(sentinel, None)
                return [sentinel]
            back, self._waiting = list(self._waiting), {}
            return back
