"""What every rule set may read besides the request: settings, the snapshot, parent lookups.

This module sits below the rule sets (``node``, ``escalation``, the label rule) and the pipelines
that combine them, so each rule set imports it and none imports another.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Container, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from app.engine.model import ENFORCE, Decision, Request, Resource, annotations_of
from app.engine.policy import DEFAULT_ANNOTATION_KEY, Entry
from app.engine.rbac import Compiler, RoleRef, Snapshot


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


# On the ValidatingWebhookConfiguration: the resource keys its label-rule entries leave out, as a
# JSON list (written by ``label-rbac compile`` with the entries' conditions, in one apply).
UNJUDGED_ANNOTATION = "labelrbac.io/unjudged"
# In ``Registration.unjudged``: the list could not be read, so any resource may be left out.
UNKNOWN = "*"
# The resource keys a registration may leave out: plural resource names and API group names as
# the API server serves them (DNS labels and subdomains). Anything else stays judged, so a key
# is always a plain literal wherever it is written (a CEL string, an annotation).
_KEY = re.compile(r"[a-z0-9]([-a-z0-9.]{0,316}[a-z0-9])?")


def is_key(text: object) -> bool:
    """Whether ``text`` is a key a registration may leave out (a plain DNS-style literal)."""
    return isinstance(text, str) and _KEY.fullmatch(text) is not None


def registered_unjudged(obj: Mapping[str, Any]) -> frozenset[str]:
    """The keys a ValidatingWebhookConfiguration's annotation lists; ``{UNKNOWN}`` when the
    annotation is there but is not a JSON list of keys (fail closed: anything may be left out)."""
    raw = annotations_of(obj).get(UNJUDGED_ANNOTATION)
    if raw is None:
        return frozenset()
    try:
        found = json.loads(raw)
    except ValueError:
        return frozenset({UNKNOWN})
    if not isinstance(found, list) or not all(is_key(item) for item in found):
        return frozenset({UNKNOWN})
    return frozenset(found)


@dataclass(frozen=True)
class Registration:
    """What the API server's webhook registration leaves unjudged, as the webhook last saw it.

    ``unjudged``: resource keys (``configmaps``, ``widgets.example.com``) the label-rule entries
    do not send to the webhook (``app.engine.coverage``); ``referred``: the roles some binding
    refers to, whether the role exists yet or not.
    """

    unjudged: frozenset[str] = frozenset()
    referred: Container[RoleRef] = frozenset()


@dataclass(frozen=True)
class Context:
    """What a check may read besides the request."""

    snapshot: Snapshot
    options: Options = field(default_factory=Options)
    lookup: ParentLookup = no_parent_lookup
    metadata: MetadataLookup = no_metadata_lookup
    # Set when the node authorizer is on; None: no graph, so no node reaches anything.
    nodes: NodeRelations | None = None
    # The webhook registration as the live cluster has it; None (static mode): every resource
    # is sent to the webhook, nothing needs fencing.
    registration: Registration | None = None


# A rule: ``(Request, Context) -> Decision | None`` (None: no objection).
Check = Callable[[Request, Context], "Decision | None"]
