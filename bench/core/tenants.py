"""The tenant namespaces of the layout benchmark, created through a real API server.

Per namespace ``tenant-<i>``: the Namespace, two annotated Roles, a plain Role and three
RoleBindings (``bench.core.layout``'s namespace without its binding of a ClusterRole); with them
``grants`` restricted ClusterRoles bound cluster-wide (``cluster_grant``). ``bench layout``
measures what they cost the compiled path; ``bench vap --namespaces`` measures writes among them.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bench.core.kube import Client
from bench.core.layout import cluster_grant, namespace_objects

RBAC = "rbac.authorization.k8s.io"
TENANT = "tenant-"  # the namespaces' prefix (``bench.core.layout``)
# Objects created per block: the bench holds one block of objects (and its futures) at a time.
BLOCK = 1000


def namespace_docs(i: int) -> list[dict[str, Any]]:
    """tenant-<i>: its Namespace, two annotated Roles, a plain Role and three RoleBindings."""
    platform = ("RoleBinding", "platform")  # its binding of a ClusterRole: left out
    return [o for o in namespace_objects(i, 1) if (o["kind"], o["metadata"]["name"]) != platform]


def collection(obj: dict[str, Any]) -> str:
    """The path ``obj`` is created at."""
    if obj["kind"] == "Namespace":
        return "/api/v1/namespaces"
    plural = f"{obj['kind'].lower()}s"
    namespace = obj["metadata"].get("namespace")
    return f"/apis/{RBAC}/v1/namespaces/{namespace}/{plural}" if namespace else (
        f"/apis/{RBAC}/v1/{plural}")  # fmt: skip


def blocks(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    iterator = iter(items)
    while block := list(itertools.islice(iterator, size)):
        yield block


def build(admin: Client, namespaces: int, grants: int, clients: int) -> tuple[int, float]:
    """Create the layout with ``clients`` parallel connections, each kind after those it refers
    to, a block at a time: (objects, seconds)."""

    def create(obj: dict[str, Any]) -> None:
        status, answer = admin.send("POST", collection(obj), obj)
        if status >= 300 and status != 409:
            raise RuntimeError(f"POST {collection(obj)}: {status} {answer}")

    def of_kind(kind: str) -> Iterator[dict[str, Any]]:
        return (o for i in range(namespaces) for o in namespace_docs(i) if o["kind"] == kind)

    phases: list[Callable[[], Iterator[dict[str, Any]]]] = [
        lambda: of_kind("Namespace"),
        lambda: (o for i in range(grants) for o in cluster_grant(i)),
        lambda: of_kind("Role"),
        lambda: of_kind("RoleBinding"),
    ]
    started, created = time.monotonic(), 0
    with ThreadPoolExecutor(clients) as pool:
        for phase in phases:
            for block in blocks(phase(), BLOCK):
                list(pool.map(create, block))
                created += len(block)
    return created, time.monotonic() - started
