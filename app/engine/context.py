"""What every rule set may read besides the request: settings, the snapshot, parent lookups.

This module sits below the rule sets (``node``, ``escalation``, the label rule) and the pipelines
that combine them, so each rule set imports it and none imports another.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from app.engine.model import ENFORCE, Decision, Request, Resource
from app.engine.policy import DEFAULT_ANNOTATION_KEY, Entry
from app.engine.rbac import Compiler, Snapshot


class ParentUnavailable(Exception):
    """An object the decision needs could not be read; the message says what and why."""


ParentLookup = Callable[[Request], Mapping[str, Any]]


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """An object by its API coordinates (``namespace`` empty for cluster-scoped objects)."""

    group: str
    version: str
    resource: str
    namespace: str
    name: str

    def __str__(self) -> str:
        kind = f"{self.resource}.{self.group}" if self.group else self.resource
        where = f' in namespace "{self.namespace}"' if self.namespace else ""
        return f'{kind} "{self.name}"{where}'


# The metadata of any object (a ``PartialObjectMetadata``: ``{"metadata": {...}}``, never a body;
# Secrets are among the objects read). Raises ``ParentUnavailable`` when it cannot be read.
MetadataLookup = Callable[[ObjectRef], Mapping[str, Any]]


def no_parent_lookup(request: Request) -> Mapping[str, Any]:
    raise ParentUnavailable(
        f'{request.resource.resource} "{request.name}" is not in this request and this webhook '
        "runs without cluster access (static --rbac-dir), so it cannot read it"
    )


def no_metadata_lookup(ref: ObjectRef) -> Mapping[str, Any]:
    raise ParentUnavailable(
        f"{ref} cannot be read: this webhook runs without cluster access (static --rbac-dir)"
    )


class NodeRelations(Protocol):
    """The node authorizer's graph as a rule reads it (``app.engine.nodegraph.NodeGraph``)."""

    def related(self, node: str, resource: str, namespace: str, name: str) -> bool:
        """Whether a pod bound to ``node`` leads to the object."""
        ...


@dataclass(frozen=True)
class Options:
    """Engine settings (a subset of the server settings)."""

    compiler: Compiler = field(default_factory=lambda: Compiler((DEFAULT_ANNOTATION_KEY,)))
    allow_unlabeled: bool = False
    # Resource patterns whose reads are not label-scoped (only their writes are).
    unrestricted_reads: tuple[Entry, ...] = ()
    # The global enforcement mode: the strictest any denial is enforced (see decide.evaluate).
    mode: str = ENFORCE

    def reads_unrestricted(self, resource: Resource) -> bool:
        """Whether an ``--unrestricted-reads`` pattern switches label-scoped reads off here.

        Read by ``/authorize`` (no opinion on such reads) and by the escalation check (handing
        out such a read hands out nothing the webhook would have scoped).
        """
        return any(entry.rank(resource) for entry in self.unrestricted_reads)


@dataclass(frozen=True)
class Context:
    """What a check may read besides the request."""

    snapshot: Snapshot
    options: Options = field(default_factory=Options)
    lookup: ParentLookup = no_parent_lookup
    metadata: MetadataLookup = no_metadata_lookup
    # Set when the node authorizer is on; None: no graph, so no node reaches anything.
    nodes: NodeRelations | None = None


# A rule: ``(Request, Context) -> Decision | None`` (None: no objection).
Check = Callable[[Request, Context], "Decision | None"]
