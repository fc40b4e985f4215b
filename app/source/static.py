"""A static RBAC source: Roles, bindings, Namespaces and Nodes read once from YAML/JSON files."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from app.engine.context import ObjectRef, Registration, no_metadata_lookup, no_parent_lookup
from app.engine.kinds import snapshot_from_objects
from app.engine.model import Request
from app.engine.nodegraph import NodeGraph
from app.engine.rbac import Compiler, Snapshot
from app.source.base import SourceStatus, bulk_load
from app.source.yamlload import describe_error, load_all

SUFFIXES = (".yaml", ".yml", ".json")


class ManifestError(ValueError):
    """A file that cannot be read as Kubernetes manifests."""


def _documents(path: Path) -> Iterator[Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ManifestError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    try:
        if path.suffix == ".json":
            yield json.loads(text)
        else:
            yield from load_all(text)
    except json.JSONDecodeError as exc:
        raise ManifestError(f"{path}: line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    except yaml.YAMLError as exc:
        raise ManifestError(f"{path}: {describe_error(exc)}") from None
    except ValueError as exc:
        raise ManifestError(f"{path}: {exc}") from None


def _flatten(doc: Any) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Yield (kind, object) for a manifest, a ``kind: List`` or a typed list (``RoleList``)."""
    if not isinstance(doc, Mapping):
        return
    kind = doc.get("kind") or ""
    if kind.endswith("List") and isinstance(doc.get("items"), list):
        item_kind = kind[: -len("List")]
        for item in doc["items"]:
            if isinstance(item, Mapping):
                yield from _flatten({"kind": item_kind, **item} if item_kind else item)
        return
    yield kind, doc


def iter_manifests(*paths: Path) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """The objects in the given files and directories (recursively, sorted for determinism),
    one file parsed at a time, so a caller that compiles as it goes never holds them all."""
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            files.extend(sorted(p for p in path.rglob("*") if p.suffix in SUFFIXES))
        else:
            files.append(path)
    return (item for f in files for doc in _documents(f) for item in _flatten(doc))


def read_manifests(*paths: Path) -> list[tuple[str, Mapping[str, Any]]]:
    """All objects in the given files and directories (recursively, sorted for determinism)."""
    return list(iter_manifests(*paths))


def parse_manifests(text: str, where: str) -> list[tuple[str, Mapping[str, Any]]]:
    """The objects in one YAML/JSON text (multi-document, lists flattened)."""
    try:
        documents = list(load_all(text))
    except yaml.YAMLError as exc:
        raise ManifestError(f"{where}: {describe_error(exc)}") from None
    return [item for doc in documents for item in _flatten(doc)]


class StaticSource:
    """Serves one snapshot built from files; ready as soon as it has loaded."""

    def __init__(self, directory: Path, compiler: Compiler, *, node_graph: bool = False) -> None:
        self._directory = directory
        self._compiler = compiler
        self._with_graph = node_graph
        self._snapshot: Snapshot | None = None
        self._graph: NodeGraph | None = None

    def start(self) -> None:
        if self._snapshot is None:
            with bulk_load():
                self._load()

    def _load(self) -> None:
        if not self._with_graph:
            # Compiled as parsed: the raw objects of a large directory are never all held.
            self._snapshot = snapshot_from_objects(iter_manifests(self._directory), self._compiler)
            return
        objects = read_manifests(self._directory)
        # The Pods and PersistentVolumes among the manifests, as the API server stores them
        # (spec.nodeName set, spec.serviceAccountName spelled out).
        self._graph = NodeGraph.from_objects(objects)
        self._snapshot = snapshot_from_objects(objects, self._compiler)

    def stop(self) -> None:
        pass

    def snapshot(self) -> Snapshot | None:
        return self._snapshot

    def registration(self) -> Registration | None:
        """Static mode: the webhook is registered as shipped, every resource is sent to it."""
        return None

    def node_graph(self) -> NodeGraph | None:
        return self._graph

    def status(self) -> SourceStatus:
        if self._snapshot is None:
            return SourceStatus(False, "not loaded")
        return SourceStatus(True, f"loaded from {self._directory}")

    def fetch_parent(self, request: Request) -> Mapping[str, Any]:
        return no_parent_lookup(request)

    def fetch_metadata(self, ref: ObjectRef) -> Mapping[str, Any]:
        return no_metadata_lookup(ref)
