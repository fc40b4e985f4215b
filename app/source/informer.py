"""One informer per kind: list, then watch, keeping the compiled objects a snapshot is built from.

The protocol follows client-go's reflector: a paged list gives the state and a resourceVersion;
a watch from there (with bookmarks and a server-side timeout) keeps it current. A watch that ends
at its timeout is resumed from the last version seen, which BOOKMARK events keep recent even for
a kind that does not change, so a healthy watch never costs a list. ``410 Gone`` (an HTTP status
or an ERROR event) means the version left the API server's history: re-list. A lost connection
means reconnect from the last version seen, after a capped, jittered exponential backoff.

Objects are compiled on arrival; the cache holds the compiled values only (raw objects are
dropped), keyed by uid with the resourceVersion they were compiled from, so a re-list recompiles
only what changed.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from app.engine.kinds import KindSpec
from app.source.api import (
    ApiError,
    Expired,
    KubeClient,
    KubeError,
    Malformed,
    WatchStream,
    object_path,
)
from app.source.base import bulk_load

log = logging.getLogger("label_rbac.source")

# Why a watch was (re)started, as the restart metric labels it.
EXPIRED = "expired"  # 410 Gone: re-listed
CLOSED = "closed"  # the server ended the stream (its timeoutSeconds): re-watched
DISCONNECTED = "disconnected"  # connection refused, lost or timed out
ERROR = "error"  # any other error status or ERROR event
MALFORMED = "malformed"  # an undecodable event: re-listed, as events may have been lost
RESYNC = "resync"  # the periodic re-list


@dataclass(frozen=True)
class Tuning:
    """Timings of the cluster source. The defaults are for production; tests shorten them."""

    # Server-side timeoutSeconds of a watch, stretched by up to 50% so watches do not all
    # reconnect at once; the socket read timeout is that plus ``read_grace``.
    watch_timeout: int = 300
    read_grace: float = 30.0
    connect_timeout: float = 10.0
    # Read timeout of each list page, and the page size (paging bounds API server memory).
    list_timeout: float = 60.0
    page_size: int = 500
    # Reconnect backoff: doubles from ``backoff_initial`` up to ``backoff_max``, jittered.
    backoff_initial: float = 0.5
    backoff_max: float = 30.0
    # A periodic re-list of every kind, one kind at a time, once per interval; off (0) by
    # default. As in client-go's reflector, a healthy watch is never replaced by a list: a list
    # happens at start, after 410 Gone and after an undecodable event, which are the only ways
    # the cache can miss a change (a reconnect resumes from the last version seen or is told
    # 410). A list costs the API server the whole collection per worker; see docs/performance.md,
    # "API-server traffic".
    resync_interval: float = 0.0
    # Events arriving within this window are folded into one new snapshot.
    coalesce: float = 0.005
    # Parent lookups on the request path: per-request timeout and cache lifetime.
    parent_timeout: float = 2.0
    parent_ttl: float = 2.0
    # How long ``start()`` waits for the first sync (a worker then only accepts requests once
    # it can answer them).
    start_wait: float = 0.0


class InformerObserver(Protocol):
    """What informers report (the metrics implement this)."""

    def contact(self, kind: str, timestamp: float) -> None:
        """The API server was heard from about ``kind`` at Unix time ``timestamp``."""

    def watch_restarted(self, kind: str, cause: str) -> None: ...

    def cache_objects(self, kind: str, count: int) -> None: ...


class NullObserver:
    def contact(self, kind: str, timestamp: float) -> None:
        pass

    def watch_restarted(self, kind: str, cause: str) -> None:
        pass

    def cache_objects(self, kind: str, count: int) -> None:
        pass


@dataclass(frozen=True, slots=True)
class Cached:
    """A compiled object and the resourceVersion it was compiled from."""

    version: str
    value: Any


Compile = Callable[[Mapping[str, Any]], Any]
# Told of every change of a compiled value: (old, new), None for absent. Called on the informer
# thread, so an incremental index (the node graph) follows without rebuilding from ``values()``.
Update = Callable[[Any, Any], None]


def _key(meta: Mapping[str, Any]) -> str:
    return str(meta.get("uid") or f"{meta.get('namespace') or ''}/{meta.get('name') or ''}")


def _value(cached: Cached | None) -> Any:
    return None if cached is None else cached.value


def _where(meta: Mapping[str, Any]) -> str:
    namespace, name = meta.get("namespace") or "", meta.get("name") or ""
    return f"{namespace}/{name}" if namespace else str(name)


class Informer:
    """Keeps the compiled objects of one kind current, on its own thread.

    Other threads read ``synced``, ``connected``, ``last_contact`` (monotonic seconds),
    ``last_error`` and ``resource_version`` (single attribute reads) and ``values()``.
    Subclasses may list and watch metadata only, and key the cache otherwise than by uid.
    """

    metadata_only = False

    @staticmethod
    def key_of(meta: Mapping[str, Any]) -> str:
        return _key(meta)

    def __init__(
        self,
        spec: KindSpec,
        client: KubeClient,
        compile: Compile,
        on_change: Callable[[], None],
        tuning: Tuning | None = None,
        observer: InformerObserver | None = None,
        on_update: Update | None = None,
        field_selector: str = "",
        label_selector: str = "",
    ) -> None:
        self.spec = spec
        # A field selector (``metadata.name=x``) or a label selector narrows the kind to the
        # objects it selects (an object leaving it is seen as deleted).
        self._selector = tuple(
            (key, value)
            for key, value in (("fieldSelector", field_selector), ("labelSelector", label_selector))
            if value
        )
        self._path = object_path(spec.group, spec.version, spec.resource)
        self._client = client
        self._compile = compile
        self._on_change = on_change
        self._on_update = on_update
        self._tuning = tuning or Tuning()
        self._observer = observer or NullObserver()
        self._items: dict[str, Cached] = {}
        self._lock = threading.Lock()  # guards _items against readers while it is mutated
        self._stop = threading.Event()
        self._resync = threading.Event()
        self._stream: WatchStream | None = None
        self._thread: threading.Thread | None = None
        self._failures = 0
        self.synced = False
        self.connected = False
        self.last_contact: float | None = None
        self.last_error = ""
        self.resource_version = ""

    @property
    def kind(self) -> str:
        return self.spec.kind

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name=f"informer-{self.spec.resource}", daemon=True
            )
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._interrupt()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def request_resync(self) -> None:
        """Re-list soon: the current watch is ended and resumed from the fresh list."""
        self._resync.set()
        self._interrupt()

    def _interrupt(self) -> None:
        stream = self._stream
        if stream is not None:
            stream.interrupt()

    def values(self) -> list[Any]:
        with self._lock:
            return [cached.value for cached in self._items.values()]

    def items(self) -> list[tuple[str, Any]]:
        """(key, compiled value) of every cached object: the key is its uid unless a subclass
        keys otherwise."""
        with self._lock:
            return [(key, cached.value) for key, cached in self._items.items()]

    def __len__(self) -> int:
        return len(self._items)

    # The informer thread.

    def _run(self) -> None:
        need_list = True
        while not self._stop.is_set():
            delay = 0.0
            try:
                if need_list or self._resync.is_set():
                    self._resync.clear()
                    self._list()
                    need_list = False
                started = time.monotonic()
                progressed = self._watch()
                cause = CLOSED
                if progressed or time.monotonic() - started >= 1.0:
                    self._failures = 0
                else:
                    # A server that hangs up at once every time must not make us spin.
                    delay = self._backoff()
            except Expired as exc:
                need_list, cause = True, EXPIRED
                # The first 410 is routine (history compacted): re-list at once.
                delay = self._backoff() if self._failures else 0.0
                self._failures = max(self._failures, 1)
                log.info("%s: %s; re-listing", self.kind, exc)
            except Malformed as exc:
                need_list, cause = True, MALFORMED
                delay = self._backoff()
                log.warning("%s: %s; re-listing", self.kind, exc)
            except KubeError as exc:
                cause = ERROR if isinstance(exc, ApiError) else DISCONNECTED
                delay = self._backoff()
                self._lost(exc, delay)
            except Exception:
                # A bug must not end the informer: the state would silently freeze.
                cause, need_list = ERROR, True
                delay = self._backoff()
                log.exception("%s informer failed; re-listing", self.kind)
                self.connected = False
            if self._stop.is_set():
                break
            if self._resync.is_set():
                cause, delay = RESYNC, 0.0
            self._observer.watch_restarted(self.kind, cause)
            if delay:
                self._stop.wait(delay)

    def _backoff(self) -> float:
        """Capped exponential backoff with jitter (between half and all of the ceiling)."""
        ceiling = min(self._tuning.backoff_max, self._tuning.backoff_initial * 2**self._failures)
        self._failures += 1
        return random.uniform(ceiling / 2, ceiling)

    def _touch(self) -> None:
        if not self.connected and self.last_error:
            log.info("%s: connection to the API server restored", self.kind)
            self.last_error = ""
        self.connected = True
        self.last_contact = time.monotonic()
        self._observer.contact(self.kind, time.time())

    def _lost(self, exc: KubeError, delay: float) -> None:
        first = self.connected or not self.last_error
        if self.connected:
            # The watch was current until now: staleness counts from here, not from the last
            # event (a quiet kind is not a stale one).
            self.last_contact = time.monotonic()
        self.connected = False
        self.last_error = str(exc)
        # One warning per outage; the retries that follow are logged at debug level.
        log.log(
            logging.WARNING if first else logging.DEBUG,
            "%s: %s; retrying in %.1fs (serving the last synced state)",
            self.kind,
            exc,
            delay,
        )

    def _compile_one(self, obj: Mapping[str, Any], rv: str) -> Cached | None:
        """Compile; an object the compiler cannot digest is left out (and said so, by name)."""
        try:
            return Cached(rv, self._compile(obj))
        except Exception as exc:
            meta = obj.get("metadata") or {}
            log.error("%s %s: cannot compile (%s); ignored", self.kind, _where(meta), exc)
            return None

    def _list(self) -> None:
        t = self._tuning
        old = self._items

        def keep(obj: Mapping[str, Any]) -> tuple[str, Cached | None]:
            meta = obj.get("metadata") or {}
            rv = str(meta.get("resourceVersion") or "")
            key = self.key_of(meta)
            prior = old.get(key)
            if prior is not None and rv and prior.version == rv:
                return key, prior  # unchanged since compiled: reuse
            return key, self._compile_one(obj, rv)

        # Compiled page by page: the raw objects of a large list are never all held.
        with bulk_load():
            kept, version = self._client.list_each(
                self._path,
                t.page_size,
                (t.connect_timeout, t.list_timeout),
                keep,
                metadata_only=self.metadata_only,
                selector=self._selector,
            )
            new = {key: cached for key, cached in kept if cached is not None}
        changed = new.keys() != old.keys() or any(new[k].value != old[k].value for k in new)
        with self._lock:
            self._items = new
        if self._on_update is not None:
            self._report(old, new)
        self.resource_version = version
        self._touch()
        if self.synced and changed:
            log.info("%s: re-list brought changes the watch had not (yet) delivered", self.kind)
        first = not self.synced
        self.synced = True
        self._observer.cache_objects(self.kind, len(new))
        if first:
            log.info("%s: listed %d objects at resourceVersion %s", self.kind, len(new), version)
        if first or changed:
            self._on_change()

    def _report(self, old: Mapping[str, Cached], new: Mapping[str, Cached]) -> None:
        """Tell ``on_update`` what a re-list changed: additions first, then removals."""
        assert self._on_update is not None
        for key, cached in new.items():
            prior = old.get(key)
            if prior is None or prior.value != cached.value:
                self._on_update(_value(prior), cached.value)
        for key, cached in old.items():
            if key not in new:
                self._on_update(cached.value, None)

    def _watch(self) -> bool:
        """Follow one watch stream until it ends; True if it delivered anything."""
        t = self._tuning
        timeout_seconds = int(t.watch_timeout * random.uniform(1.0, 1.5))
        stream = self._client.watch(
            self._path,
            self.resource_version,
            timeout_seconds,
            (t.connect_timeout, timeout_seconds + t.read_grace),
            metadata_only=self.metadata_only,
            selector=self._selector,
        )
        self._stream = stream
        if self._stop.is_set() or self._resync.is_set():
            stream.close()  # asked to stop or re-list while this stream was being opened
            self._stream = None
            return False
        self._touch()
        progressed = ended = False
        try:
            for event in stream:
                self._touch()
                self._handle(event)
                progressed = True
            ended = True
        finally:
            self._stream = None
            if ended and not self._stop.is_set() and not self._resync.is_set():
                stream.release()
            else:
                stream.close()
        return progressed

    def _handle(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        obj = event.get("object")
        if not isinstance(obj, Mapping):
            raise Malformed(f"{kind} event without an object")
        if kind == "ERROR":
            raise ApiError.from_status(obj)
        meta = obj.get("metadata") or {}
        rv = str(meta.get("resourceVersion") or "")
        key = self.key_of(meta)
        prior = self._items.get(key)
        if kind in ("ADDED", "MODIFIED"):
            cached = self._compile_one(obj, rv)
            with self._lock:
                if cached is not None:
                    self._items[key] = cached
                else:
                    self._items.pop(key, None)
            # Most updates do not touch what is compiled (a Node's status, a Namespace's
            # labels, a Role's managedFields): no new snapshot for those.
            changed = cached is None or prior is None or prior.value != cached.value
            if changed and self._on_update is not None:
                self._on_update(_value(prior), _value(cached))
        elif kind == "DELETED":
            with self._lock:
                self._items.pop(key, None)
            changed = prior is not None
            if changed and self._on_update is not None:
                self._on_update(_value(prior), None)
        elif kind == "BOOKMARK":
            # Nothing changed; the version moves on so a reconnect resumes from here.
            if rv:
                self.resource_version = rv
            return
        else:
            # Names only, never the object: it may be anything.
            log.warning("%s: skipped a watch event of unknown type %r", self.kind, kind)
            return
        if rv:
            self.resource_version = rv
        log.debug("%s: %s %s at %s", self.kind, kind, _where(meta), rv)
        self._observer.cache_objects(self.kind, len(self._items))
        if changed:
            self._on_change()
