"""The AdmissionReview wire format (admission.k8s.io/v1 and v1beta1): parse and build, purely.

Two error channels: an envelope that is not an AdmissionReview raises ``ReviewError`` (the HTTP
layer answers 400); a policy denial is an ordinary response with ``allowed: false``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NotRequired, TypedDict

from app.engine.model import Decision, Request, Resource, UserInfo

API_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")

# A denial message longer than this is cut: it quotes attacker-written text (an annotation a
# schema error repeats), and the API server hands it on to the client and its event log as is.
MAX_MESSAGE_CHARS = 4096


class GroupVersionResource(TypedDict):
    group: str
    version: str
    resource: str


class GroupVersionKind(TypedDict):
    group: str
    version: str
    kind: str


class UserInfoWire(TypedDict, total=False):
    username: str
    uid: str
    groups: list[str]
    extra: dict[str, list[str]]


class AdmissionRequest(TypedDict):
    uid: str
    kind: GroupVersionKind
    resource: GroupVersionResource
    operation: str
    userInfo: UserInfoWire
    subResource: NotRequired[str]
    requestKind: NotRequired[GroupVersionKind]
    requestResource: NotRequired[GroupVersionResource]
    requestSubResource: NotRequired[str]
    name: NotRequired[str]
    namespace: NotRequired[str]
    object: NotRequired[dict[str, Any] | None]
    oldObject: NotRequired[dict[str, Any] | None]
    dryRun: NotRequired[bool]
    options: NotRequired[dict[str, Any] | None]


class StatusWire(TypedDict, total=False):
    metadata: dict[str, Any]
    status: str
    code: int
    reason: str
    message: str


class AdmissionResponse(TypedDict):
    uid: str
    allowed: bool
    status: NotRequired[StatusWire]
    warnings: NotRequired[list[str]]
    auditAnnotations: NotRequired[dict[str, str]]


class AdmissionReviewResponse(TypedDict):
    apiVersion: str
    kind: str
    response: AdmissionResponse


class ReviewError(ValueError):
    """The body is not a usable AdmissionReview."""


@dataclass(frozen=True, slots=True)
class Review:
    api_version: str
    request: Request


def _field(
    mapping: Mapping[str, Any], key: str, kind: type, where: str, default: Any = None
) -> Any:
    value = mapping.get(key, default)
    if value is None:
        value = default
    if not isinstance(value, kind):
        raise ReviewError(f"{where}.{key} must be a {kind.__name__}")
    return value


def _string_map(value: Any) -> bool:
    return isinstance(value, Mapping) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    )


def _object(mapping: Mapping[str, Any], key: str) -> Mapping[str, Any] | None:
    """``object``/``oldObject``, with the metadata the rules read checked for shape here, once,
    so the engine can rely on it (the API server never sends anything else)."""
    value = mapping.get(key)
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ReviewError(f"request.{key} must be an object or null")
    metadata = value.get("metadata")
    if metadata is None:
        return value
    if not isinstance(metadata, Mapping):
        raise ReviewError(f"request.{key}.metadata must be an object")
    for field in ("name", "namespace", "uid", "resourceVersion"):
        if metadata.get(field) is not None and not isinstance(metadata[field], str):
            raise ReviewError(f"request.{key}.metadata.{field} must be a string")
    for field in ("labels", "annotations"):
        if metadata.get(field) is not None and not _string_map(metadata[field]):
            raise ReviewError(f"request.{key}.metadata.{field} must map strings to strings")
    owners = metadata.get("ownerReferences")
    if owners is not None and not (
        isinstance(owners, list) and all(isinstance(o, Mapping) for o in owners)
    ):
        raise ReviewError(f"request.{key}.metadata.ownerReferences must be a list of objects")
    finalizers = metadata.get("finalizers")
    if finalizers is not None and not (
        isinstance(finalizers, list) and all(isinstance(f, str) for f in finalizers)
    ):
        raise ReviewError(f"request.{key}.metadata.finalizers must be a list of strings")
    return value


def _request_resource(request: Mapping[str, Any]) -> Resource | None:
    """What the client asked for and RBAC authorized. Under ``matchPolicy: Equivalent`` the API
    server may convert a request to an equivalent resource for the webhook (``resource``,
    ``object``); ``requestResource`` keeps the original. None when absent (before 1.15).

    ``requestSubResource`` is omitted when empty: with ``requestResource`` present, an absent
    one means no subresource, whatever ``subResource`` says.
    """
    if request.get("requestResource") is None:
        return None
    requested = _field(request, "requestResource", Mapping, "request")
    return Resource(
        group=_field(requested, "group", str, "request.requestResource", ""),
        resource=_field(requested, "resource", str, "request.requestResource"),
        subresource=_field(request, "requestSubResource", str, "request", ""),
    )


def parse_review(document: Any) -> Review:
    """Validate the envelope and reduce it to an engine ``Request``. Raises ``ReviewError``."""
    if not isinstance(document, Mapping):
        raise ReviewError("body must be a JSON object")
    if document.get("kind") != "AdmissionReview":
        raise ReviewError("kind must be AdmissionReview")
    api_version = document.get("apiVersion")
    if api_version not in API_VERSIONS:
        raise ReviewError(f"apiVersion must be one of {', '.join(API_VERSIONS)}")
    request = document.get("request")
    if not isinstance(request, Mapping):
        raise ReviewError("request must be an object")

    uid = _field(request, "uid", str, "request")
    if not uid:
        raise ReviewError("request.uid must not be empty")
    operation = _field(request, "operation", str, "request")
    resource = _field(request, "resource", Mapping, "request")
    kind = _field(request, "kind", Mapping, "request", {})
    user = _field(request, "userInfo", Mapping, "request")
    groups = _field(user, "groups", list, "request.userInfo", [])
    if not all(isinstance(g, str) for g in groups):
        raise ReviewError("request.userInfo.groups must be a list of strings")

    return Review(
        api_version=api_version,
        request=Request(
            uid=uid,
            operation=operation,
            user=UserInfo(
                username=_field(user, "username", str, "request.userInfo", ""),
                groups=tuple(groups),
                uid=_field(user, "uid", str, "request.userInfo", ""),
            ),
            resource=Resource(
                group=_field(resource, "group", str, "request.resource", ""),
                resource=_field(resource, "resource", str, "request.resource"),
                subresource=_field(request, "subResource", str, "request", ""),
            ),
            kind=_field(kind, "kind", str, "request.kind", ""),
            namespace=_field(request, "namespace", str, "request", ""),
            name=_field(request, "name", str, "request", ""),
            object=_object(request, "object"),
            old_object=_object(request, "oldObject"),
            dry_run=_field(request, "dryRun", bool, "request", False),
            request_resource=_request_resource(request),
        ),
    )


def build_response(api_version: str, uid: str, decision: Decision) -> AdmissionReviewResponse:
    """The AdmissionReview the API server expects back, echoing ``apiVersion`` and ``uid``."""
    response: AdmissionResponse = {"uid": uid, "allowed": decision.allowed}
    if not decision.allowed:
        response["status"] = {
            "metadata": {},
            "status": "Failure",
            "code": decision.code,
            "reason": _status_reason(decision.code),
            "message": _bounded(decision.message),
        }
    if decision.warnings:
        response["warnings"] = list(decision.warnings)
    if decision.softened:
        # The API server prefixes each key with the webhook's name in the audit event, e.g.
        # "labels.labelrbac.io/would-deny".
        response["auditAnnotations"] = {
            "mode": decision.mode,
            "would-deny-reason": decision.reason,
            "would-deny": decision.message,
        }
    return {"apiVersion": api_version, "kind": "AdmissionReview", "response": response}


def _status_reason(code: int) -> str:
    """metav1.StatusReason for a code, as the API server would spell it."""
    return {
        400: "BadRequest",
        403: "Forbidden",
        422: "Invalid",
        500: "InternalError",
        503: "ServiceUnavailable",
    }.get(code, "Forbidden")


def _bounded(message: str) -> str:
    if len(message) <= MAX_MESSAGE_CHARS:
        return message
    cut = MAX_MESSAGE_CHARS - 64
    return f"{message[:cut]}... ({len(message) - cut} more characters)"
