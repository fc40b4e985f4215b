"""HTTP access to the Kubernetes API for the cluster source: paged list, watch stream and get.

Requests go through the official client's ``ApiClient``: its urllib3 pool, TLS settings and
authentication (including the token refresh hooks of in-cluster and exec-plugin credentials).
Bodies are read as streams, as the client's REST layer hands them over unread, and decoded
here: the typed API methods would turn every object into model classes only to be thrown away,
and their watch helper hides the HTTP status we need to tell ``410 Gone`` from a lost connection.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import os
import ssl
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from http.client import HTTPException
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import urllib3
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

import app
from app import deepjson
from app.source.yamlload import describe_error

log = logging.getLogger("label_rbac.source")

Query = Sequence[tuple[str, str]]
# (connect, read) seconds; the read timeout bounds the silence between two reads.
Timeout = tuple[float, float]

ERROR_BODY_LIMIT = 64 * 1024  # enough for any Status; error bodies are never logged whole


class KubeError(Exception):
    """Talking to the API server failed."""


class ConfigError(KubeError):
    """No usable connection settings (kubeconfig or in-cluster service account)."""


CANNOT_LOAD = "cannot load cluster connection settings"


def check_kubeconfig(kubeconfig: Path) -> None:
    """Raise ConfigError, one line, unless ``kubeconfig`` (a path, or several joined with
    ``os.pathsep`` as in $KUBECONFIG) reads as a kubeconfig with a current context.

    The files are parsed here first because the official loader lets its YAML parser's
    four-line errors and its lookups' TypeErrors (a file that is not a mapping) escape.
    Nothing is contacted and no credential plugin is run.
    """
    parts = str(kubeconfig).split(os.pathsep)
    for part in parts:
        path = Path(part)
        if not path.is_file():
            continue  # the official loader skips missing files of a list, and says if all are
        where = f"{path}: " if len(parts) > 1 else ""  # the caller names a single file
        try:
            document = yaml.safe_load(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"{CANNOT_LOAD}: {where}{exc.strerror or exc}") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{CANNOT_LOAD}: {where}not UTF-8 text (byte {exc.start})") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"{CANNOT_LOAD}: {where}{describe_error(exc)}") from None
        except RecursionError:
            raise ConfigError(
                f"{CANNOT_LOAD}: {where}nested too deeply to be a kubeconfig"
            ) from None
        if not isinstance(document, dict):
            raise ConfigError(
                f"{CANNOT_LOAD}: {where}not a kubeconfig (expected a mapping with clusters, "
                "users and contexts)"
            )
    try:
        k8s_config.list_kube_config_contexts(config_file=str(kubeconfig))
    except Exception as exc:  # the official client raises anything from a malformed entry
        raise ConfigError(f"{CANNOT_LOAD}: {_one_line(exc)}") from None


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    if isinstance(exc, (ConfigException, OSError)):
        return text
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class ApiError(KubeError):
    """The API server answered with an error status (HTTP, or a watch ERROR event)."""

    def __init__(self, status: int, reason: str = "", message: str = "") -> None:
        self.status = status
        self.reason = reason
        self.message = message
        super().__init__(str(self))

    def __str__(self) -> str:
        text = f"HTTP {self.status} {self.reason}".rstrip()
        return f"{text}: {self.message}" if self.message else text

    @classmethod
    def from_status(cls, status: Mapping[str, Any], default_code: int = 0) -> ApiError:
        """From a ``Status`` object; 410 becomes ``Expired``."""
        code = status.get("code")
        code = code if isinstance(code, int) else default_code
        kind = Expired if code == 410 else cls
        return kind(code, str(status.get("reason") or ""), str(status.get("message") or ""))


class Expired(ApiError):
    """410 Gone: the resourceVersion asked for is no longer in the API server's history."""


class Unreachable(KubeError):
    """No usable answer: connection refused or lost, a timeout, a TLS failure.

    ``connection_lost`` marks a connection the peer closed under us (worth one immediate retry
    for a single GET: a pooled keep-alive connection may just have expired).
    """

    def __init__(self, message: str, connection_lost: bool = False) -> None:
        super().__init__(message)
        self.connection_lost = connection_lost


class Malformed(KubeError):
    """A response or watch line that is not the JSON expected: events may have been lost."""


def _root_cause(exc: BaseException) -> BaseException:
    reason = getattr(exc, "reason", None)
    if isinstance(exc, urllib3.exceptions.MaxRetryError) and isinstance(reason, BaseException):
        exc = reason
    if isinstance(exc, urllib3.exceptions.ProtocolError) and exc.args:
        inner = exc.args[-1]
        if isinstance(inner, BaseException):
            exc = inner
    return exc


def unreachable(exc: BaseException, context: str = "") -> Unreachable:
    """An ``Unreachable`` with a one-line cause: no URLs, headers or bodies."""
    cause = _root_cause(exc)
    lost = False
    if isinstance(cause, ConnectionRefusedError) or "Connection refused" in str(cause):
        text = "connection refused"
    elif isinstance(cause, urllib3.exceptions.NameResolutionError):
        text = "cannot resolve the API server's name"
    elif isinstance(cause, urllib3.exceptions.NewConnectionError):
        # (Checked before timeouts: urllib3 still derives it from ConnectTimeoutError.)
        text = f"cannot connect: {cause.__context__ or cause}"
    elif isinstance(cause, TimeoutError | urllib3.exceptions.TimeoutError):
        text = "timed out"
    elif isinstance(cause, http.client.IncompleteRead):
        text, lost = "connection closed mid-response", True
    elif isinstance(cause, ConnectionError | http.client.RemoteDisconnected):
        text, lost = "connection lost", True
    elif isinstance(cause, ssl.SSLError | urllib3.exceptions.SSLError):
        text = f"TLS error: {cause}"
    elif isinstance(cause, ApiException) and not cause.status:
        # The client's REST layer reports TLS failures this way (status 0, multi-line reason).
        text = "TLS error: " + " ".join(str(cause.reason).split()).removeprefix("SSLError ")
    else:
        text = f"{type(cause).__name__}: {cause}"
    return Unreachable(f"{context}{text}", connection_lost=lost)


JSON = "application/json"
# Content negotiation for metadata only (as kubectl and client-go's metadata client ask for it).
METADATA_ONLY = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"
# Lists ask for a PartialObjectMetadataList; watch events then carry PartialObjectMetadata.
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"


def object_path(
    group: str, version: str, resource: str, namespace: str = "", name: str = ""
) -> str:
    """``/api/v1/...`` for the core group, ``/apis/<group>/<version>/...`` otherwise."""
    path = f"/apis/{group}/{version}" if group else f"/api/{version}"
    if namespace:
        path += f"/namespaces/{quote(namespace, safe='')}"
    path += f"/{resource}"
    if name:
        path += f"/{quote(name, safe='')}"
    return path


class WatchStream:
    """One open watch response, read as newline-delimited JSON events.

    ``interrupt()`` may be called from any thread; everything else belongs to the reader.
    """

    def __init__(self, response: urllib3.BaseHTTPResponse) -> None:
        self._response = response
        self._closed = False

    def __iter__(self) -> Iterator[dict[str, Any]]:
        buffer = bytearray()
        while True:
            try:
                data = self._response.read1(64 * 1024)
            except Exception as exc:
                if self._closed:
                    return  # interrupted on purpose; whatever the read tripped over
                if not isinstance(exc, urllib3.exceptions.HTTPError | OSError | HTTPException):
                    raise
                where = "watch stream cut mid-event: " if buffer.strip() else "watch stream: "
                raise unreachable(exc, where) from None
            if not data:
                break
            buffer += data
            start = 0
            while (end := buffer.find(b"\n", start)) >= 0:
                line = bytes(buffer[start:end]).strip()
                start = end + 1
                if line:
                    yield self._decode(line)
            del buffer[:start]
        if buffer.strip() and not self._closed:
            # The stream ended inside an event: the connection was cut, nothing was decided.
            raise Unreachable("watch stream ended mid-event")

    @staticmethod
    def _decode(line: bytes) -> dict[str, Any]:
        try:
            event = deepjson.loads(line)
        except ValueError:
            raise Malformed(f"undecodable watch line ({len(line)} bytes)") from None
        if not isinstance(event, dict):
            raise Malformed("watch line is not a JSON object")
        return event

    def interrupt(self) -> None:
        """Make a blocked read return (from another thread): the socket is shut down."""
        self._closed = True
        # Already closed, or never fully opened: then there is nothing left to interrupt.
        with contextlib.suppress(Exception):
            self._response.shutdown()

    def close(self) -> None:
        """Drop the connection (it is not reused)."""
        self._closed = True
        with contextlib.suppress(Exception):
            self._response.close()

    def release(self) -> None:
        """After a clean end of stream: hand the connection back to the pool."""
        self._response.release_conn()


T = TypeVar("T")


def _same(item: dict[str, Any]) -> dict[str, Any]:
    return item


class KubeClient:
    """Access to the API server through one ``ApiClient`` (thread-safe): reads for the cluster
    source, and ``send`` for the compiler's writes (its parameters, its Lease, Events)."""

    def __init__(self, api_client: k8s.ApiClient) -> None:
        self._api = api_client

    @classmethod
    def connect(
        cls, kubeconfig: Path | None = None, in_cluster: bool = False, context: str | None = None
    ) -> KubeClient:
        """Build a client from a kubeconfig file (its current context, or ``context``) or the
        pod's service account."""
        configuration = k8s.Configuration()
        if kubeconfig is not None:
            check_kubeconfig(kubeconfig)
        try:
            if kubeconfig is not None:
                k8s_config.load_kube_config(
                    config_file=str(kubeconfig),
                    context=context,
                    client_configuration=configuration,
                    persist_config=False,
                )
            elif in_cluster:
                k8s_config.load_incluster_config(client_configuration=configuration)
            else:
                raise ConfigError("no cluster connection: pass a kubeconfig or run in a pod")
        except ConfigError:
            raise
        except Exception as exc:  # the official client raises anything from a malformed entry
            raise ConfigError(f"{CANNOT_LOAD}: {_one_line(exc)}") from None
        # Retries are ours (backoff in the informers, a deadline for parent lookups); urllib3's
        # would retry a timed-out GET and multiply the time a request waits.
        configuration.retries = False
        # TCP keepalive finds a silently dead watch connection within three minutes.
        configuration.keep_alive = True
        api_client = k8s.ApiClient(configuration)
        api_client.user_agent = f"label-rbac/{app.__version__}"
        return cls(api_client)

    @property
    def host(self) -> str:
        return str(self._api.configuration.host)

    def close(self) -> None:
        self._api.close()

    def _open(
        self, path: str, query: Query, timeout: float | Timeout, accept: str = JSON
    ) -> urllib3.BaseHTTPResponse:
        method, url, headers, _, _ = self._api.param_serialize(
            "GET",
            path,
            query_params=list(query),
            header_params={"Accept": accept},
            auth_settings=["BearerToken"],
        )
        try:
            response = self._api.call_api(
                method, url, header_params=headers, _request_timeout=timeout
            ).response
        except (urllib3.exceptions.HTTPError, ApiException, OSError) as exc:
            raise unreachable(exc) from None
        if not 200 <= response.status < 300:
            raise self._error(response)
        return response

    @staticmethod
    def _error(response: urllib3.BaseHTTPResponse) -> ApiError:
        try:
            body = response.read(ERROR_BODY_LIMIT)
            status = json.loads(body)
        except Exception:  # not a Status: the HTTP status line says enough
            status = {}
        finally:
            response.close()
        if not isinstance(status, dict) or status.get("kind") != "Status":
            status = {"reason": response.reason or ""}
        status["code"] = response.status
        return ApiError.from_status(status)

    def get(
        self,
        path: str,
        query: Query = (),
        timeout: float | Timeout = 10.0,
        *,
        metadata_only: bool = False,
        accept: str | None = None,
    ) -> dict[str, Any]:
        """One JSON document. ``timeout`` as a number bounds the whole request.

        ``metadata_only`` asks for a ``PartialObjectMetadata``: the API server then sends no
        ``spec``, ``data`` or ``status``, so Secret contents never reach this process.
        """
        accept = accept or (METADATA_ONLY if metadata_only else JSON)
        deadline = time.monotonic() + (timeout if isinstance(timeout, int | float) else 1e9)
        for attempt in (1, 2):
            try:
                response = self._open(path, query, timeout, accept)
                try:
                    body = response.read()
                except (urllib3.exceptions.HTTPError, OSError) as exc:
                    response.close()
                    raise unreachable(exc) from None
                response.release_conn()
                break
            except Unreachable as exc:
                # A pooled keep-alive connection may have been closed by the server just now:
                # one more try, only for that cause and only if it fits in the deadline.
                remaining = deadline - time.monotonic()
                if attempt == 2 or not exc.connection_lost or remaining < 0.25:
                    raise
                if isinstance(timeout, int | float):
                    timeout = remaining
        try:
            document = deepjson.loads(body)
        except ValueError:
            raise Malformed(f"GET {path}: response is not JSON") from None
        if not isinstance(document, dict):
            raise Malformed(f"GET {path}: response is not a JSON object")
        return document

    def send(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any],
        query: Query = (),
        content_type: str = JSON,
        timeout: float = 10.0,
    ) -> dict[str, Any]:
        """One write (POST, PUT, PATCH) of a JSON ``body``; the object the API server returns.
        Raises ``ApiError`` on an error status, ``Unreachable`` when it cannot be asked."""
        method, url, headers, payload, _ = self._api.param_serialize(
            method,
            path,
            query_params=list(query),
            header_params={"Accept": JSON, "Content-Type": content_type},
            body=dict(body),
            auth_settings=["BearerToken"],
        )
        try:
            response = self._api.call_api(
                method, url, header_params=headers, body=payload, _request_timeout=timeout
            ).response
        except (urllib3.exceptions.HTTPError, ApiException, OSError) as exc:
            raise unreachable(exc) from None
        if not 200 <= response.status < 300:
            raise self._error(response)
        try:
            document = json.loads(response.read())
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise unreachable(exc) from None
        except ValueError:
            raise Malformed(f"{method} {path}: response is not JSON") from None
        finally:
            response.release_conn()
        if not isinstance(document, dict):
            raise Malformed(f"{method} {path}: response is not a JSON object")
        return document

    def list_each(
        self,
        path: str,
        page_size: int | Callable[[], int],
        timeout: Timeout,
        each: Callable[[dict[str, Any]], T],
        *,
        metadata_only: bool = False,
        selector: Query = (),
    ) -> tuple[list[T], str]:
        """``list``, with ``each`` applied to every item as its page arrives: what it keeps of an
        object is all that is held of it, so a large list's pages are never all held at once.
        ``page_size`` may be asked before each page (the caller sizes pages by what it saw)."""
        accept = METADATA_LIST if metadata_only else JSON
        items: list[T] = []
        token = ""
        while True:
            size = page_size() if callable(page_size) else page_size
            query = [*selector, ("limit", str(size))]
            if token:
                query.append(("continue", token))
            page = self.get(path, query, timeout, accept=accept)
            items.extend(each(i) for i in page.get("items") or () if isinstance(i, dict))
            meta = page.get("metadata") or {}
            token = meta.get("continue") or ""
            if not token:
                return items, str(meta.get("resourceVersion") or "")

    def list(
        self, path: str, page_size: int, timeout: Timeout, *, metadata_only: bool = False
    ) -> tuple[list[dict[str, Any]], str]:
        """All items of a collection (paged) and the resourceVersion to watch from.

        ``metadata_only`` asks for a ``PartialObjectMetadataList`` (no bodies are sent).
        """
        return self.list_each(path, page_size, timeout, _same, metadata_only=metadata_only)

    def watch(
        self,
        path: str,
        resource_version: str,
        timeout_seconds: int,
        timeout: Timeout,
        *,
        metadata_only: bool = False,
        selector: Query = (),
    ) -> WatchStream:
        """Open a watch from ``resource_version``; the server ends it after ``timeout_seconds``.

        ``metadata_only``: the events carry ``PartialObjectMetadata`` objects.
        """
        query = [
            *selector,
            ("watch", "true"),
            ("resourceVersion", resource_version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(timeout_seconds)),
        ]
        accept = METADATA_ONLY if metadata_only else JSON
        return WatchStream(self._open(path, query, timeout, accept))
