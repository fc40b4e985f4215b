"""The SubjectAccessReview wire format (authorization.k8s.io/v1 and v1beta1): parse and build.

An authorization webhook receives a SubjectAccessReview whose ``spec`` says who asks to do what,
and answers with the same kind carrying ``status``: ``allowed`` (allow), ``denied`` (deny; the
API server asks no later authorizer) or neither (no opinion). Like ``app.webhook.wire``, a body that
is not a SubjectAccessReview raises ``ReviewError`` (the HTTP layer answers 400).

Since Kubernetes 1.31 the API server also sends the request's label and field selectors, parsed
into ``requirements``; a selector it could not parse arrives as ``rawSelector`` only and is read
here as no selector at all (which can only narrow what the webhook lets through).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NotRequired, TypedDict

from app.engine.model import Access, AccessDecision, Resource, UserInfo, Verdict
from app.engine.selectors import Requirement, SelectorError, requirement
from app.webhook.wire import ReviewError

API_VERSIONS = ("authorization.k8s.io/v1", "authorization.k8s.io/v1beta1")
KIND = "SubjectAccessReview"


class SelectorRequirementWire(TypedDict):
    key: str
    operator: str
    values: NotRequired[list[str]]


class SelectorAttributesWire(TypedDict, total=False):
    rawSelector: str
    requirements: list[SelectorRequirementWire]


class ResourceAttributesWire(TypedDict, total=False):
    namespace: str
    verb: str
    group: str
    version: str
    resource: str
    subresource: str
    name: str
    fieldSelector: SelectorAttributesWire
    labelSelector: SelectorAttributesWire


class NonResourceAttributesWire(TypedDict, total=False):
    path: str
    verb: str


class SubjectAccessReviewSpec(TypedDict, total=False):
    user: str
    uid: str
    groups: list[str]  # v1; v1beta1 spells it ``group``
    group: list[str]
    extra: dict[str, list[str]]
    resourceAttributes: ResourceAttributesWire
    nonResourceAttributes: NonResourceAttributesWire


class SubjectAccessReviewStatus(TypedDict):
    allowed: bool
    denied: NotRequired[bool]
    reason: NotRequired[str]
    evaluationError: NotRequired[str]


class SubjectAccessReviewResponse(TypedDict):
    apiVersion: str
    kind: str
    status: SubjectAccessReviewStatus


@dataclass(frozen=True, slots=True)
class NonResource:
    """A request for a path outside the resource API (``/healthz``, ``/version``)."""

    user: UserInfo
    verb: str
    path: str


@dataclass(frozen=True, slots=True)
class AccessReview:
    """A parsed SubjectAccessReview: exactly one of ``access`` and ``non_resource`` is set."""

    api_version: str
    access: Access | None
    non_resource: NonResource | None

    @property
    def user(self) -> UserInfo:
        subject = self.access or self.non_resource
        assert subject is not None
        return subject.user


def _string(mapping: Mapping[str, Any], key: str, where: str) -> str:
    value = mapping.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ReviewError(f"{where}.{key} must be a string")
    return value


def _strings(mapping: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    value = mapping.get(key)
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ReviewError(f"{where}.{key} must be a list of strings")
    return tuple(value)


def _object(mapping: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any] | None:
    value = mapping.get(key)
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ReviewError(f"{where}.{key} must be an object")
    return value


def parse_selector(
    attributes: Mapping[str, Any] | None, where: str
) -> tuple[Requirement, ...] | None:
    """Parsed requirements, or None for no usable selector (absent, or only a rawSelector)."""
    if attributes is None:
        return None
    _string(attributes, "rawSelector", where)
    found = attributes.get("requirements")
    if found is None:
        return None
    if not isinstance(found, list) or not all(isinstance(r, Mapping) for r in found):
        raise ReviewError(f"{where}.requirements must be a list of objects")
    if not found:
        return None
    try:
        return tuple(requirement(r.get("key"), r.get("operator"), r.get("values")) for r in found)
    except SelectorError as exc:
        raise ReviewError(f"{where}: {exc}") from None


def _user(spec: Mapping[str, Any], api_version: str) -> UserInfo:
    groups_key = "group" if api_version.endswith("v1beta1") else "groups"
    return UserInfo(
        username=_string(spec, "user", "spec"),
        groups=_strings(spec, groups_key, "spec"),
        uid=_string(spec, "uid", "spec"),
    )


def _access(user: UserInfo, attrs: Mapping[str, Any]) -> Access:
    where = "spec.resourceAttributes"
    verb = _string(attrs, "verb", where)
    resource = _string(attrs, "resource", where)
    if not verb or not resource:
        raise ReviewError(f"{where} needs a verb and a resource")
    return Access(
        user=user,
        verb=verb,
        resource=Resource(
            group=_string(attrs, "group", where),
            resource=resource,
            subresource=_string(attrs, "subresource", where),
        ),
        version=_string(attrs, "version", where),
        namespace=_string(attrs, "namespace", where),
        name=_string(attrs, "name", where),
        labels=parse_selector(_object(attrs, "labelSelector", where), f"{where}.labelSelector"),
        fields=parse_selector(_object(attrs, "fieldSelector", where), f"{where}.fieldSelector"),
    )


def parse_access_review(document: Any) -> AccessReview:
    """Validate the envelope and reduce it to an engine ``Access``. Raises ``ReviewError``."""
    if not isinstance(document, Mapping):
        raise ReviewError("body must be a JSON object")
    if document.get("kind") != KIND:
        raise ReviewError(f"kind must be {KIND}")
    api_version = document.get("apiVersion")
    if api_version not in API_VERSIONS:
        raise ReviewError(f"apiVersion must be one of {', '.join(API_VERSIONS)}")
    spec = _object(document, "spec", "")
    if spec is None:
        raise ReviewError("spec must be an object")
    user = _user(spec, api_version)
    if not user.username and not user.groups:
        raise ReviewError("spec needs a user or groups")
    resource = _object(spec, "resourceAttributes", "spec")
    non_resource = _object(spec, "nonResourceAttributes", "spec")
    if (resource is None) == (non_resource is None):
        raise ReviewError("spec needs exactly one of resourceAttributes and nonResourceAttributes")
    if resource is not None:
        return AccessReview(api_version, _access(user, resource), None)
    assert non_resource is not None
    where = "spec.nonResourceAttributes"
    return AccessReview(
        api_version,
        None,
        NonResource(
            user, _string(non_resource, "verb", where), _string(non_resource, "path", where)
        ),
    )


def build_access_response(
    api_version: str, decision: AccessDecision
) -> SubjectAccessReviewResponse:
    """The SubjectAccessReview the API server expects back, echoing ``apiVersion`` and kind.

    ``reason`` is what kubectl shows in its Forbidden error, so it is set on denials; a
    no-opinion answer carries none (RBAC, asked next, has the last word).
    """
    status: SubjectAccessReviewStatus = {"allowed": decision.verdict is Verdict.ALLOW}
    if decision.verdict is Verdict.DENY:
        status["denied"] = True
    if decision.verdict is not Verdict.NO_OPINION and decision.message:
        status["reason"] = decision.message
    return {"apiVersion": api_version, "kind": KIND, "status": status}
