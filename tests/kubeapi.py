"""A small Kubernetes API server for tests: list, watch and get over real HTTP(S) on loopback.

It speaks the protocol as kube-apiserver does: paged lists carrying a resourceVersion, chunked
watch streams of newline-delimited JSON events (replayed from a requested resourceVersion),
``410 Gone`` as an HTTP status or as an ERROR event, ``Status`` bodies for errors. A watch that
asks for ``allowWatchBookmarks`` gets a BOOKMARK carrying the latest resourceVersion every
``bookmark_interval`` seconds and when it reaches its ``timeoutSeconds`` (the real watch cache
sends them about every minute and just before the timeout). ``compact()`` drops old history as
the API server's compaction of etcd does: a watch from an older version then gets ``ERROR 410``.
Every request and the bytes of every response are recorded, so tests and benchmarks can count
the traffic.
Metadata-only requests are answered as the real server answers them: a list asked for
``as=PartialObjectMetadataList`` returns a ``PartialObjectMetadataList``, a watch asked for
``as=PartialObjectMetadata`` streams events whose objects are ``PartialObjectMetadata``, and a
GET asked for ``as=PartialObjectMetadata`` returns one. The initial state is the recorded lists
in ``tests.support.API``; ``add_collection`` serves any other resource. Tests push events into open
watches and inject faults: a stream cut mid-event, a server down at start or going away and
coming back, a slow, failing or truncated GET or list.
"""

from __future__ import annotations

import bisect
import contextlib
import copy
import itertools
import json
import math
import socket
import ssl
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlsplit

import yaml

from app.webhook.certs import generate
from tests.support import API

T = TypeVar("T")

RBAC = "rbac.authorization.k8s.io"
# resource → (path prefix, kind, apiVersion, fixture file or None)
RESOURCES: Mapping[str, tuple[str, str, str, str | None]] = {
    "roles": (f"/apis/{RBAC}/v1", "Role", f"{RBAC}/v1", "list-roles.json"),
    "clusterroles": (f"/apis/{RBAC}/v1", "ClusterRole", f"{RBAC}/v1", "list-clusterroles.json"),
    "rolebindings": (f"/apis/{RBAC}/v1", "RoleBinding", f"{RBAC}/v1", "list-rolebindings.json"),
    "clusterrolebindings": (
        f"/apis/{RBAC}/v1",
        "ClusterRoleBinding",
        f"{RBAC}/v1",
        "list-clusterrolebindings.json",
    ),
    "namespaces": ("/api/v1", "Namespace", "v1", "list-namespaces.json"),
    # No recorded node list: two nodes like the recorded cluster's.
    "nodes": ("/api/v1", "Node", "v1", None),
    # Empty until a test applies some (the node authorizer's graph watches them).
    "pods": ("/api/v1", "Pod", "v1", None),
    "persistentvolumes": ("/api/v1", "PersistentVolume", "v1", None),
    "volumeattachments": (
        "/apis/storage.k8s.io/v1",
        "VolumeAttachment",
        "storage.k8s.io/v1",
        None,
    ),
    # The webhook's own registration (watched by name; this server ignores field selectors).
    "validatingwebhookconfigurations": (
        "/apis/admissionregistration.k8s.io/v1",
        "ValidatingWebhookConfiguration",
        "admissionregistration.k8s.io/v1",
        None,
    ),
}


TRUNCATE = "truncate"
REASONS = {
    403: "Forbidden",
    410: "Expired",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


@contextlib.contextmanager
def tls_cluster(directory: Path, token: str) -> Iterator[tuple[FakeKubeAPI, Path]]:
    """A started TLS fake requiring ``token``, with a kubeconfig for it written to ``directory``."""
    certs = generate(directory / "api-certs", ["127.0.0.1"])
    api = FakeKubeAPI(tls=(certs.ca, certs.cert, certs.key), token=token).start()
    try:
        yield api, api.write_kubeconfig(directory / "kubeconfig")
    finally:
        api.stop()


def wait_until(
    predicate: Callable[[], T], timeout: float = 15.0, interval: float = 0.002, what: str = ""
) -> T:
    """Poll until ``predicate()`` is truthy and return it; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(interval)


def status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def expired_event(rv: int) -> dict[str, Any]:
    return {
        "type": "ERROR",
        "object": status(410, "Expired", f"too old resource version: {rv}"),
    }


@dataclass
class Collection:
    resource: str
    prefix: str
    kind: str
    api_version: str
    items: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    # The event history watches replay from: (resourceVersion, JSON line).
    log: list[tuple[int, bytes]] = field(default_factory=list)
    # Watches from a resourceVersion below this get an ERROR 410 event (history compacted).
    floor: int = 0
    # HTTP statuses the next watch requests get instead of a stream.
    watch_faults: deque[int] = field(default_factory=deque)
    # The next event an open stream delivers is cut in half and the connection dropped.
    cut_next: bool = False
    # What the next list requests get instead of a list: an HTTP status, or TRUNCATE.
    list_faults: deque[int | str] = field(default_factory=deque)
    # Bumped to end open streams with an ERROR 410 event.
    expiry: int = 0
    # Bumped to end open streams normally, as the server does at timeoutSeconds.
    ending: int = 0
    open_watches: int = 0

    @property
    def path(self) -> str:
        return f"{self.prefix}/{self.resource}"


@dataclass(frozen=True)
class Recorded:
    method: str
    path: str
    query: dict[str, str]
    authorization: str
    accept: str = ""


# How often the real API server's watch cache sends a bookmark to a watch that asked for them.
BOOKMARK_INTERVAL = 60.0


class FakeKubeAPI:
    """The server. ``start()``/``stop()`` may be called repeatedly; the port stays the same."""

    def __init__(
        self,
        api_dir: Path = API,
        *,
        port: int = 0,
        tls: tuple[Path, Path, Path] | None = None,
        token: str | None = None,
    ) -> None:
        self.port = port
        self.tls = tls  # (ca, cert, key)
        self.token = token
        self.cond = threading.Condition()
        self.rv = 0
        self.collections: dict[str, Collection] = {}
        self.objects: dict[str, dict[str, Any]] = {}
        self.get_delay = 0.0
        # False: answer metadata-only GETs with the whole object (a server that ignores ``as=``).
        self.partial_metadata = True
        self.get_faults: dict[str, int] = {}
        # GETs of these paths send half their body and drop the connection.
        self.truncate_gets: set[str] = set()
        self.requests: list[Recorded] = []
        # Response bytes (headers and body) by (path, "list" | "watch" | "get").
        self.sent: Counter[tuple[str, str]] = Counter()
        self.listed: Counter[str] = Counter()  # objects sent in list pages, by path
        self.bookmark_interval = BOOKMARK_INTERVAL
        # False: ignore ``allowWatchBookmarks``, as a server without a watch cache does.
        self.bookmarks = True
        self._compact_next = 0  # where the next ``compact()`` compacts to
        self.bookmarks_sent = 0
        self.serving = False
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._connections: set[socket.socket] = set()
        self._load(api_dir)

    # Setup.

    def _load(self, api_dir: Path) -> None:
        for resource, (prefix, kind, api_version, fixture) in RESOURCES.items():
            coll = Collection(resource, prefix, kind, api_version)
            if fixture is None:
                items = [_node("node1"), _node("node2")] if resource == "nodes" else []
                list_rv = 0
            else:
                document = json.loads((api_dir / fixture).read_text())
                items = document["items"]
                list_rv = int(document["metadata"]["resourceVersion"])
            for item in items:
                coll.items[_name_key(item)] = item
                self.rv = max(self.rv, int(item["metadata"].get("resourceVersion") or 0))
            self.rv = max(self.rv, list_rv)
            self.collections[resource] = coll

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def write_kubeconfig(self, path: Path) -> Path:
        cluster: dict[str, Any] = {"server": self.url}
        if self.tls:
            cluster["certificate-authority"] = str(self.tls[0])
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": cluster}],
            "users": [{"name": "webhook", "user": {"token": self.token} if self.token else {}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "webhook"}}],
            "current-context": "fake",
        }
        path.write_text(yaml.safe_dump(config))
        return path

    def start(self) -> FakeKubeAPI:
        server = _Server(("127.0.0.1", self.port), _Handler)
        server.api = self
        if self.tls:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(str(self.tls[1]), str(self.tls[2]))
            server.socket = context.wrap_socket(server.socket, server_side=True)
        self.port = server.server_address[1]
        self._server = server
        self.serving = True
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Go away like a crashed API server: refuse connections, cut the open ones."""
        server, self._server = self._server, None
        if server is None:
            return
        with self.cond:
            self.serving = False
            self.cond.notify_all()
        server.shutdown()
        server.server_close()
        with self.cond:
            for conn in list(self._connections):
                _abort(conn)
            self._connections.clear()
        if self._thread is not None:
            self._thread.join(5)

    # State changes, seen by watches.

    def apply(self, resource: str, obj: Mapping[str, Any]) -> int:
        """Create or replace an object (ADDED or MODIFIED); returns its new resourceVersion."""
        coll = self.collections[resource]
        with self.cond:
            existing = coll.items.get(_name_key(obj))
            kind = "MODIFIED" if existing is not None else "ADDED"
            obj = copy.deepcopy(dict(obj))
            meta = obj.setdefault("metadata", {})
            kept = existing["metadata"].get("uid") if existing is not None else None
            meta["uid"] = kept or meta.get("uid") or str(uuid.uuid4())
            return self._emit(coll, kind, obj)

    def delete(self, resource: str, name: str, namespace: str = "") -> int:
        coll = self.collections[resource]
        with self.cond:
            obj = copy.deepcopy(coll.items[(namespace, name)])
            return self._emit(coll, "DELETED", obj)

    def _emit(self, coll: Collection, kind: str, obj: dict[str, Any]) -> int:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        if kind == "DELETED":
            coll.items.pop(_name_key(obj), None)
        else:
            coll.items[_name_key(obj)] = obj
        event = {"type": kind, "object": {"kind": coll.kind, "apiVersion": coll.api_version, **obj}}
        self._append(coll, self.rv, event)
        return self.rv

    def _append(self, coll: Collection, rv: int, event: Mapping[str, Any] | bytes) -> None:
        line = event if isinstance(event, bytes) else json.dumps(event).encode()
        coll.log.append((rv, line.rstrip(b"\n") + b"\n"))
        self.cond.notify_all()

    def replay(self, resource: str, lines: Iterable[str]) -> None:
        """Recorded watch lines, as they are: state follows them, versions are theirs."""
        coll = self.collections[resource]
        with self.cond:
            for line in lines:
                event = json.loads(line)
                obj = event["object"]
                rv = int(obj["metadata"]["resourceVersion"])
                if event["type"] in ("ADDED", "MODIFIED"):
                    coll.items[_name_key(obj)] = obj
                elif event["type"] == "DELETED":
                    coll.items.pop(_name_key(obj), None)
                self.rv = max(self.rv, rv)
                self._append(coll, rv, line.encode())

    def inject(self, resource: str, line: bytes) -> None:
        """Any line into the stream (unknown event types, garbage), at a new version."""
        with self.cond:
            self.rv += 1
            self._append(self.collections[resource], self.rv, line)

    def change_silently(self, resource: str, obj: Mapping[str, Any]) -> None:
        """Change state without an event: only a re-list can find out."""
        coll = self.collections[resource]
        with self.cond:
            self.rv += 1
            obj = copy.deepcopy(dict(obj))
            obj["metadata"]["resourceVersion"] = str(self.rv)
            obj["metadata"].setdefault("uid", str(uuid.uuid4()))
            coll.items[_name_key(obj)] = obj

    def remove_silently(self, resource: str, name: str, namespace: str = "") -> None:
        with self.cond:
            self.rv += 1
            del self.collections[resource].items[(namespace, name)]

    # Faults.

    def fail_next_watch(self, resource: str, code: int = 410) -> None:
        with self.cond:
            self.collections[resource].watch_faults.append(code)

    def expire_watches(self, resource: str) -> None:
        """Open watches get ``ERROR 410 Expired`` and end; older versions are compacted away."""
        with self.cond:
            coll = self.collections[resource]
            coll.expiry += 1
            coll.floor = self.rv
            self.cond.notify_all()

    def compact(self) -> None:
        """Forget the history up to the previous call, as the API server's periodic compaction
        does (every 5 minutes it compacts etcd to the revision it noted 5 minutes before): a watch
        from an older resourceVersion gets ``ERROR 410``; open watches go on."""
        with self.cond:
            for coll in self.collections.values():
                coll.floor = self._compact_next
            self._compact_next = self.rv

    def end_watches(self, resource: str) -> None:
        """Open watches end cleanly, as at their timeoutSeconds."""
        with self.cond:
            self.collections[resource].ending += 1
            self.cond.notify_all()

    def fail_next_lists(self, resource: str, *faults: int | str) -> None:
        """The next lists of ``resource`` get these HTTP statuses, or ``TRUNCATE``d bodies."""
        with self.cond:
            self.collections[resource].list_faults.extend(faults)

    def clear_faults(self, resource: str) -> None:
        """Forget the list and watch faults still queued for ``resource``."""
        with self.cond:
            self.collections[resource].list_faults.clear()
            self.collections[resource].watch_faults.clear()

    def cut_next_event(self, resource: str) -> None:
        with self.cond:
            self.collections[resource].cut_next = True

    def add_collection(
        self,
        resource: str,
        prefix: str,
        kind: str,
        api_version: str,
        items: Iterable[Mapping[str, Any]] = (),
    ) -> Collection:
        """Serve another resource (list, watch, and GET of its objects by name)."""
        coll = Collection(resource, prefix, kind, api_version)
        with self.cond:
            self.collections[resource] = coll
        for item in items:
            self.apply(resource, item)
        return coll

    # Objects for GET.

    def put_object(self, path: str, obj: Mapping[str, Any]) -> None:
        self.objects[path] = dict(obj)

    # Inspection.

    def recorded(self, resource: str | None = None, *, watch: bool | None = None) -> list[Recorded]:
        with self.cond:
            found = list(self.requests)
        if resource is not None:
            path = self.collections[resource].path
            found = [r for r in found if r.path == path]
        if watch is not None:
            found = [r for r in found if (r.query.get("watch") == "true") == watch]
        return found

    def open_watches(self, resource: str) -> int:
        return self.collections[resource].open_watches

    def sent_bytes(self, resource: str | None = None, *, watch: bool | None = None) -> int:
        """Response bytes sent, for one resource's collection and/or lists or watches only."""
        path = self.collections[resource].path if resource is not None else None
        with self.cond:
            return sum(
                n
                for (p, what), n in self.sent.items()
                if (path is None or p == path)
                and (watch is None or (what == "watch") == watch)
                and (watch is None or what != "get")
            )

    # Internals used by the handler.

    def _record(self, request: Recorded) -> None:
        with self.cond:
            self.requests.append(request)

    def _count(self, key: tuple[str, str], size: int) -> None:
        with self.cond:
            self.sent[key] += size

    def _collection_at(self, path: str) -> Collection | None:
        for coll in self.collections.values():
            if coll.path == path:
                return coll
        return None

    def _stored(self, path: str) -> dict[str, Any] | None:
        """An object of a collection by URL: ``{prefix}[/namespaces/{ns}]/{resource}/{name}``."""
        for coll in self.collections.values():
            rest = path.removeprefix(coll.prefix + "/")
            if rest == path:
                continue
            namespace = ""
            if rest.startswith("namespaces/") and rest.count("/") == 3:
                _, namespace, rest = rest.split("/", 2)
            resource, _, name = rest.partition("/")
            if resource == coll.resource and name and "/" not in name:
                with self.cond:
                    found = coll.items.get((namespace, name))
                return copy.deepcopy(found) if found is not None else None
        return None


PARTIAL = {"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata"}


def partial(obj: Mapping[str, Any]) -> dict[str, Any]:
    """An object as ``PartialObjectMetadata``: its metadata and nothing else."""
    return {**PARTIAL, "metadata": obj.get("metadata") or {}}


def _partial_event(line: bytes) -> bytes:
    try:
        event = json.loads(line)
    except ValueError:
        return line  # injected garbage stays garbage
    if event.get("type") in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK"):
        event["object"] = partial(event.get("object") or {})
    return json.dumps(event).encode() + b"\n"


def _bookmark_line(coll: Collection, rv: int) -> bytes:
    """A BOOKMARK as the API server sends it: an empty object of the kind, with a version."""
    meta = {"resourceVersion": str(rv), "creationTimestamp": None}
    obj = {"kind": coll.kind, "apiVersion": coll.api_version, "metadata": meta}
    return json.dumps({"type": "BOOKMARK", "object": obj}).encode() + b"\n"


def _name_key(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return meta.get("namespace") or "", meta.get("name") or ""


def _node(name: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "uid": str(uuid.uuid5(uuid.NAMESPACE_DNS, name)),
            "resourceVersion": "1",
            "labels": {"kubernetes.io/hostname": name},
        }
    }


def _abort(conn: socket.socket) -> None:
    with contextlib.suppress(OSError):
        conn.shutdown(socket.SHUT_RDWR)
    conn.close()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    api: FakeKubeAPI


class _Aborted(Exception):
    """The connection was cut on purpose."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server
    metadata_only = False
    traffic = ("", "get")  # what the bytes of the current response are counted as

    def _write(self, data: bytes) -> None:
        self.server.api._count(self.traffic, len(data))
        self.wfile.write(data)

    def end_headers(self) -> None:
        # The status line and headers are buffered until here: count them with the body.
        buffered = b"".join(getattr(self, "_headers_buffer", []))
        self.server.api._count(self.traffic, len(buffered) + 2)  # and the blank line
        super().end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        # Like a real server: headers and body are not held back waiting for the client's ACK.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self.server.api.cond:
            self.server.api._connections.add(self.connection)

    def finish(self) -> None:
        with self.server.api.cond:
            self.server.api._connections.discard(self.connection)
        with contextlib.suppress(OSError):
            super().finish()

    def _refuse(self) -> None:
        self.send_response(405)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_POST = do_PUT = do_PATCH = do_DELETE = _refuse

    def do_GET(self) -> None:
        api = self.server.api
        url = urlsplit(self.path)
        query = dict(parse_qsl(url.query, keep_blank_values=True))
        api._record(
            Recorded(
                "GET",
                url.path,
                query,
                self.headers.get("Authorization") or "",
                self.headers.get("Accept") or "",
            )
        )
        if not api.serving:
            _abort(self.connection)
            self.close_connection = True
            return
        if api.token and self.headers.get("Authorization") != f"Bearer {api.token}":
            self._send_json(401, status(401, "Unauthorized", "Unauthorized"))
            return
        coll = api._collection_at(url.path)
        watching = query.get("watch") in ("true", "1")
        self.traffic = (url.path, "get" if coll is None else "watch" if watching else "list")
        # Content negotiation: the first type offered decides, as in the real server.
        offered = (self.headers.get("Accept") or "").split(",")[0]
        self.metadata_only = api.partial_metadata and "as=PartialObjectMetadata" in offered
        try:
            if coll is None:
                self._get(url.path, self.metadata_only)
            elif watching:
                self._watch(coll, query)
            else:
                self._list(coll, query)
        except (OSError, _Aborted):
            self.close_connection = True

    def _send_json(self, code: int, body: Mapping[str, Any], truncate: bool = False) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if truncate:  # the declared length, half of it sent, then the connection drops
            self._write(data[: len(data) // 2])
            self.wfile.flush()
            _abort(self.connection)
            raise _Aborted
        self._write(data)

    def _send_fault(self, code: int) -> None:
        self._send_json(code, status(code, REASONS.get(code, ""), f"injected {code}"))

    def _get(self, path: str, metadata_only: bool = False) -> None:
        api = self.server.api
        if api.get_delay:
            time.sleep(api.get_delay)
        if path in api.get_faults:
            self._send_fault(api.get_faults[path])
            return
        obj = api.objects.get(path) or api._stored(path)
        if obj is None:
            name = path.rsplit("/", 1)[-1]
            self._send_json(404, status(404, "NotFound", f'"{name}" not found'))
            return
        if metadata_only:  # as the real server answers ``as=...``
            obj = partial(obj)
        self._send_json(200, obj, truncate=path in api.truncate_gets)

    def _list(self, coll: Collection, query: Mapping[str, str]) -> None:
        api = self.server.api
        start = int(query.get("continue") or 0)
        with api.cond:
            total = len(coll.items)
            limit = int(query.get("limit") or 0) or total
            items = itertools.islice(coll.items.values(), start, start + limit)
            page = [copy.deepcopy(i) for i in items]
            rv = api.rv
            fault = coll.list_faults.popleft() if coll.list_faults else None
            if fault is None:
                api.listed[coll.path] += len(page)
        if isinstance(fault, int):
            self._send_fault(fault)
            return
        meta: dict[str, Any] = {"resourceVersion": str(rv)}
        if start + limit < total:
            meta["continue"] = str(start + limit)
        body = {"kind": f"{coll.kind}List", "apiVersion": coll.api_version, "metadata": meta}
        if self.metadata_only:
            body.update(kind="PartialObjectMetadataList", apiVersion="meta.k8s.io/v1")
            page = [partial(item) for item in page]
        self._send_json(200, {**body, "items": page}, truncate=fault == TRUNCATE)

    def _chunk(self, data: bytes) -> None:
        self._write(b"%x\r\n%s\r\n" % (len(data), data))

    def _watch(self, coll: Collection, query: Mapping[str, str]) -> None:
        api = self.server.api
        since = int(query.get("resourceVersion") or 0)
        deadline = time.monotonic() + float(query.get("timeoutSeconds") or 1800)
        with api.cond:
            fault = coll.watch_faults.popleft() if coll.watch_faults else None
        if fault is not None:
            self._send_fault(fault)
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        with api.cond:
            compacted = since < coll.floor
            position = bisect.bisect_right([rv for rv, _ in coll.log], since)
            expiry, ending = coll.expiry, coll.ending
            coll.open_watches += 1
        try:
            if compacted:
                self._chunk(json.dumps(expired_event(since)).encode() + b"\n")
            else:
                asked = query.get("allowWatchBookmarks") in ("true", "1")
                bookmarks = asked and api.bookmarks
                self._stream(coll, position, expiry, ending, deadline, bookmarks)
            self._write(b"0\r\n\r\n")
        finally:
            with api.cond:
                coll.open_watches -= 1

    def _stream(
        self,
        coll: Collection,
        position: int,
        expiry: int,
        ending: int,
        deadline: float,
        bookmarks: bool,
    ) -> None:
        api = self.server.api
        next_bookmark = time.monotonic() + api.bookmark_interval if bookmarks else math.inf
        while True:
            with api.cond:
                while (
                    api.serving
                    and position >= len(coll.log)
                    and coll.expiry == expiry
                    and coll.ending == ending
                    and time.monotonic() < min(deadline, next_bookmark)
                ):
                    wake = min(deadline, next_bookmark)
                    api.cond.wait(min(0.2, max(0.0, wake - time.monotonic())))
                if not api.serving:
                    raise _Aborted
                pending = [line for _, line in coll.log[position:]]
                position = len(coll.log)
                now = time.monotonic()
                # After the events up to now: the version they reached (or a later one).
                bookmark = bookmarks and (now >= next_bookmark or now >= deadline)
                if bookmark:
                    pending.append(_bookmark_line(coll, api.rv))
                    api.bookmarks_sent += 1
                    next_bookmark = now + api.bookmark_interval
                cut = coll.cut_next and bool(pending)
                if cut:
                    coll.cut_next = False
                expired = coll.expiry != expiry
            if cut:
                self._chunk(pending[0][: len(pending[0]) // 2])
                _abort(self.connection)
                raise _Aborted
            for line in pending:
                self._chunk(_partial_event(line) if self.metadata_only else line)
            if expired:
                self._chunk(json.dumps(expired_event(coll.floor)).encode() + b"\n")
                return
            if time.monotonic() >= deadline or coll.ending != ending:
                return


def discovery(api: FakeKubeAPI) -> None:
    """API discovery as kube-apiserver serves it (only the fields clients read)."""

    def resource(name: str, kind: str, namespaced: bool, verbs: str = "create delete get list "
                 "patch update watch") -> dict[str, Any]:  # fmt: skip
        return {"name": name, "singularName": "", "namespaced": namespaced, "kind": kind,
                "verbs": verbs.split()}  # fmt: skip

    api.put_object("/api/v1", {"kind": "APIResourceList", "groupVersion": "v1", "resources": [
        resource("configmaps", "ConfigMap", True),
        resource("namespaces", "Namespace", False),
        resource("pods", "Pod", True),
        resource("pods/exec", "PodExecOptions", True, "create get"),
        resource("secrets", "Secret", True),
    ]})  # fmt: skip
    api.put_object("/apis", {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
        {"name": "apps", "versions": [{"groupVersion": "apps/v1", "version": "v1"}],
         "preferredVersion": {"groupVersion": "apps/v1", "version": "v1"}},
    ]})  # fmt: skip
    api.put_object(
        "/apis/apps/v1",
        {
            "kind": "APIResourceList",
            "groupVersion": "apps/v1",
            "resources": [resource("deployments", "Deployment", True)],
        },
    )
