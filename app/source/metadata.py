"""The labels of objects the rules read by name, kept current by metadata-only watches.

A get of a read-restricted object (``kubectl get secret s1``) is judged by the stored object's
labels. Asking the API server for them on every SubjectAccessReview would put a round trip on
each read, so each resource that is read by name gets a **metadata-only informer**: it lists
``PartialObjectMetadataList`` and watches ``PartialObjectMetadata`` (the API server sends no
``spec``, ``data`` or ``status``), and keeps of each object only its labels, keyed by namespace
and name. Secret contents never reach this process, and nothing but names and labels is kept.

While the cache does not know an object — the informer is still listing, its resource cannot be
listed (RBAC), or the object is younger than the last event seen — the caller falls back to a
metadata GET of that one object (``ClusterSource.fetch_metadata``). A lookup therefore never
answers "not found" on its own: an object is judged by labels read from the API server or by
none at all, so another bucket's object is never revealed, and an object created a moment ago
is judged by its real labels at once.

Only the resources in ``watched`` get an informer (the shipped ClusterRole grants list/watch on
exactly ``WATCHED_RESOURCES``; ``serve --watch-labels`` adds more); every other resource is read
by GET. Memory is bounded: informers start lazily, on the first read of their resource, and hold
names and labels only (a few hundred bytes per object).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

from app.engine.context import ObjectRef
from app.engine.kinds import KindSpec
from app.engine.model import Resource
from app.source.api import KubeClient
from app.source.informer import Informer, InformerObserver, Tuning

log = logging.getLogger("label_rbac.source")

# The resources whose labels are kept from a metadata-only watch by default: those the example
# tenants' annotations restrict. manifests/deploy/rbac.yaml grants list/watch on exactly these.
WATCHED_RESOURCES: frozenset[tuple[str, str]] = frozenset(
    {("", "configmaps"), ("", "secrets"), ("", "pods"), ("apps", "deployments")}
)


def _labels(obj: Mapping[str, Any]) -> dict[str, str]:
    """Only the labels, and only string ones: everything else of the object is dropped."""
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") if isinstance(meta, Mapping) else None
    if not isinstance(labels, Mapping):
        return {}
    return {k: v for k, v in labels.items() if isinstance(k, str) and isinstance(v, str)}


class MetadataInformer(Informer):
    """An informer of one resource's object labels, keyed by ``namespace/name``."""

    metadata_only = True

    @staticmethod
    def key_of(meta: Mapping[str, Any]) -> str:
        return f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"

    def labels(self, namespace: str, name: str) -> dict[str, str] | None:
        """The cached labels, or None when the object is not (yet) known."""
        if not self.synced:
            return None
        cached = self._items.get(f"{namespace}/{name}")  # one dict read: no lock needed
        return None if cached is None else dict(cached.value)


def _no_change() -> None:
    """Label changes need no snapshot rebuild: lookups read the informer directly."""


class MetadataCache:
    """Lazily started metadata informers, one per (group, resource), shared by all lookups."""

    def __init__(
        self,
        client: KubeClient,
        tuning: Tuning,
        observer: InformerObserver | None = None,
        watched: frozenset[tuple[str, str]] = WATCHED_RESOURCES,
    ) -> None:
        self._client = client
        self._tuning = tuning
        self._observer = observer
        self._watched = watched
        self._informers: dict[tuple[str, str], MetadataInformer] = {}
        self._lock = threading.Lock()
        self._stopped = False

    def lookup(self, ref: ObjectRef) -> Mapping[str, Any] | None:
        """``{"metadata": {name, namespace, labels}}`` from the cache, or None on a miss.

        The first lookup of a resource starts its informer (and misses until it has listed).
        """
        informer = self._informer(ref)
        if informer is None:
            return None
        labels = informer.labels(ref.namespace, ref.name)
        if labels is None:
            return None
        meta: dict[str, Any] = {"name": ref.name, "labels": labels}
        if ref.namespace:
            meta["namespace"] = ref.namespace
        return {"metadata": meta}

    def _informer(self, ref: ObjectRef) -> MetadataInformer | None:
        key = (ref.group, ref.resource)
        found = self._informers.get(key)
        if found is not None or self._stopped or key not in self._watched:
            return found
        version = ref.version if ref.version not in ("", "*") else ("" if ref.group else "v1")
        if not version:
            return None
        with self._lock:
            found = self._informers.get(key)
            if found is not None or self._stopped:
                return found
            name = str(Resource(ref.group, ref.resource))
            spec = KindSpec(name, ref.group, ref.resource, lambda _c, o: _labels(o), version)
            informer = MetadataInformer(
                spec, self._client, _labels, _no_change, self._tuning, self._observer
            )
            self._informers[key] = informer
            log.info("caching the labels of %s (metadata-only list/watch)", name)
        informer.start()
        return informer

    @property
    def informers(self) -> tuple[MetadataInformer, ...]:
        return tuple(self._informers.values())

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
        for informer in self._informers.values():
            informer.stop()
        for informer in self._informers.values():
            informer.join(5.0)
