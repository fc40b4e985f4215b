"""Value types shared by the engine: the admission request as the engine sees it and the decision.

These are frozen so a decision can be cached, logged and compared without defensive copies.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

# Operations the API server sends to validating webhooks.
OPERATIONS = frozenset({"CREATE", "UPDATE", "DELETE", "CONNECT"})

# The RBAC verbs that may have authorized an admission operation. PATCH reaches admission as
# UPDATE and a collection delete as one DELETE per object, so each operation maps to two verbs.
VERBS_FOR_OPERATION: Mapping[str, tuple[str, ...]] = {
    "CREATE": ("create",),
    "UPDATE": ("update", "patch"),
    "DELETE": ("delete", "deletecollection"),
    "CONNECT": ("create", "get"),
}

SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"


@dataclass(frozen=True, slots=True)
class UserInfo:
    """The authenticated identity behind a request."""

    username: str
    groups: tuple[str, ...] = ()
    uid: str = ""


@dataclass(frozen=True, slots=True)
class Resource:
    """An API resource as RBAC names it: group, plural resource and optional subresource."""

    group: str
    resource: str
    subresource: str = ""

    def __str__(self) -> str:
        name = f"{self.resource}.{self.group}" if self.group else self.resource
        return f"{name}/{self.subresource}" if self.subresource else name

    @classmethod
    def parse(cls, text: str) -> Resource:
        """Parse ``res[.group][/sub]`` as ``kubectl auth can-i`` spells resources."""
        base, _, sub = text.partition("/")
        resource, _, group = base.partition(".")
        if not resource:
            raise ValueError(f"invalid resource {text!r}: expected res[.group][/subresource]")
        return cls(group=group, resource=resource, subresource=sub)


@dataclass(frozen=True, slots=True)
class Request:
    """One admission request, reduced to what the engine decides on."""

    uid: str
    operation: str
    user: UserInfo
    resource: Resource
    kind: str = ""
    namespace: str = ""
    name: str = ""
    object: Mapping[str, Any] | None = None
    old_object: Mapping[str, Any] | None = None
    dry_run: bool = False

    @property
    def verbs(self) -> tuple[str, ...]:
        return VERBS_FOR_OPERATION.get(self.operation, ())

    def describe(self) -> str:
        """``configmaps "c2" in namespace "t1"`` — the object as a denial message names it."""
        text = str(self.resource)
        if self.name:
            text += f' "{self.name}"'
        if self.namespace:
            text += f' in namespace "{self.namespace}"'
        return text


@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome of one review.

    ``reason`` is a short machine-readable cause (used in logs and metrics); ``message`` is what
    the tenant reads. ``explanation`` lists which roles and entries decided, for ``app check``.
    """

    allowed: bool
    code: int = 200
    reason: str = "Allowed"
    message: str = ""
    warnings: tuple[str, ...] = ()
    explanation: tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def allow(cls, reason: str, *explanation: str, warnings: tuple[str, ...] = ()) -> Decision:
        return cls(True, 200, reason, "", warnings, explanation)

    @classmethod
    def deny(cls, reason: str, message: str, *explanation: str, code: int = 403) -> Decision:
        return cls(False, code, reason, message, (), explanation)


@dataclass(frozen=True, slots=True)
class Access:
    """One authorization question (a SubjectAccessReview's resource attributes).

    ``labels``/``fields`` are the request's selectors as requirements (``None``: no usable
    selector); they are typed loosely here so this module stays at the bottom of the engine.
    """

    user: UserInfo
    verb: str
    resource: Resource
    version: str = ""
    namespace: str = ""
    name: str = ""
    labels: tuple[Any, ...] | None = None
    fields: tuple[Any, ...] | None = None


class Verdict(enum.Enum):
    """What an authorizer in a chain may answer."""

    ALLOW = "Allow"
    DENY = "Deny"  # no later authorizer is asked
    NO_OPINION = "NoOpinion"  # the next authorizer (RBAC) decides


@dataclass(frozen=True, slots=True)
class AccessDecision:
    """The answer to an ``Access``: verdict, a machine reason and a tenant-readable message."""

    verdict: Verdict
    reason: str
    message: str = ""
    explanation: tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def allow(cls, reason: str, message: str = "", *explanation: str) -> AccessDecision:
        return cls(Verdict.ALLOW, reason, message, explanation)

    @classmethod
    def deny(cls, reason: str, message: str, *explanation: str) -> AccessDecision:
        return cls(Verdict.DENY, reason, message, explanation)

    @classmethod
    def no_opinion(cls, reason: str, *explanation: str) -> AccessDecision:
        return cls(Verdict.NO_OPINION, reason, "", explanation)


def _metadata_map(obj: Mapping[str, Any] | None, key: str) -> Mapping[str, str]:
    """``metadata.<key>`` of an object, tolerating absent or null metadata (as the API allows)."""
    if not obj:
        return {}
    metadata = obj.get("metadata") or {}
    found = metadata.get(key) if isinstance(metadata, Mapping) else None
    return found if isinstance(found, Mapping) else {}


def labels_of(obj: Mapping[str, Any] | None) -> Mapping[str, str]:
    return _metadata_map(obj, "labels")


def annotations_of(obj: Mapping[str, Any] | None) -> Mapping[str, str]:
    return _metadata_map(obj, "annotations")


def mapping_items(value: Any) -> Iterable[Mapping[str, Any]]:
    """The mapping items of a list field, tolerating null and malformed entries."""
    if not isinstance(value, list):
        return ()
    return (item for item in value if isinstance(item, Mapping))
