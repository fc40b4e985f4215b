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

# Every RBAC verb that may have authorized an admission operation (see ``authorizations``).
# PATCH reaches admission as UPDATE and a collection delete as one DELETE per object; CONNECT
# carries the verb of the HTTP method, which the review does not say.
VERBS_FOR_OPERATION: Mapping[str, tuple[str, ...]] = {
    "CREATE": ("create",),
    "UPDATE": ("update", "patch"),
    "DELETE": ("delete", "deletecollection"),
    "CONNECT": ("create", "get", "update", "patch", "delete"),
}

# -- Which verbs the label rule restricts: the one definition both front doors read ------------
# Admission (``/validate``) sees the verbs above; the authorization webhook (``/authorize``) judges
# the verbs admission never sees. The escalation check judges a role handing out any of them, so a
# verb added here is restricted by ``/authorize`` and guarded against escalation at once.
ADMISSION_VERBS = frozenset(verb for verbs in VERBS_FOR_OPERATION.values() for verb in verbs)
# Reads: a named object by its labels, a collection by its label selector.
READ_VERBS = frozenset({"get", "list", "watch", "deletecollection"})
COLLECTION_VERBS = frozenset({"list", "watch", "deletecollection"})
# Verbs that lend the holder another subject's authority: impersonation (legacy and constrained,
# KEP-5284), and approving or signing a certificate request (a client certificate names any
# user). ``serviceaccounts`` are judged by the target's labels; the other identities carry none.
IDENTITY_VERBS = frozenset(
    {
        "impersonate",
        "impersonate:serviceaccount",
        "impersonate:user-info",
        "impersonate:arbitrary-node",
        "impersonate:associated-node",
        "approve",
        "sign",
    }
)
# What ``/authorize`` judges (everything else there is admission's or RBAC's).
AUTHORIZED_VERBS = READ_VERBS | IDENTITY_VERBS
# Every verb whose grant the label rule can restrict somewhere; ``*`` includes them all.
RESTRICTED_VERBS = ADMISSION_VERBS | AUTHORIZED_VERBS | {"*"}

# Subresources whose CONNECT is an interactive session on a pod. The API server serves them for
# GET (the WebSocket upgrade, verb ``get``) and POST (SPDY, verb ``create``); since 1.35 it also
# authorizes ``create`` for the WebSocket upgrade (AuthorizePodWebsocketUpgradeCreatePermission).
SESSION_SUBRESOURCES = frozenset({"exec", "attach", "portforward"})
# Every other CONNECT (``pods/proxy``, ``services/proxy``, ``nodes/proxy``) is served for GET,
# HEAD, POST, PUT, PATCH, DELETE and OPTIONS, each authorized as its method's verb: HEAD is
# ``get``, OPTIONS has no verb at all ("": only a ``*`` rule grants it).
PROXY_VERBS = ("get", "create", "update", "patch", "delete", "")

SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"

# Enforcement modes, strictest first. ``enforce`` denies; ``warn`` allows with an admission
# warning; ``audit`` allows and records the would-be denial as an audit annotation.
ENFORCE, WARN, AUDIT = "enforce", "warn", "audit"
MODES = (ENFORCE, WARN, AUDIT)


def strictest(modes: Iterable[str]) -> str:
    """The strictest of ``modes`` (``enforce`` when there are none)."""
    return min(modes, key=MODES.index, default=ENFORCE)


def softest(*modes: str) -> str:
    return max(modes, key=MODES.index)


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


# -- Identity loans: acting as another subject lends that subject's grants on every resource -----
# A token request yields a ServiceAccount's credentials, as impersonating it does.
TOKEN_REQUEST = Resource("", "serviceaccounts", "token")
# The subjects an identity verb names, as RBAC spells them (legacy impersonation in the core
# group, constrained impersonation in authentication.k8s.io, certificate signers).
IDENTITY_RESOURCES: tuple[Resource, ...] = (
    *(Resource("", r) for r in ("users", "groups", "serviceaccounts")),
    *(
        Resource("authentication.k8s.io", r)
        for r in ("users", "groups", "serviceaccounts", "uids", "userextras", "nodes")
    ),
    Resource("certificates.k8s.io", "signers"),
)
LOAN_TARGETS: tuple[Resource, ...] = (*IDENTITY_RESOURCES, TOKEN_REQUEST)


def lends_identity(verb: str, resource: Resource) -> bool:
    """Whether ``verb`` on ``resource`` lets the holder act as another subject (an identity
    loan), which a label-restricted role permits only within all of its buckets
    (``policy.Permissions.loan_entries``). ``*`` includes the identity verbs."""
    if verb in IDENTITY_VERBS:
        return True
    if resource == TOKEN_REQUEST:
        return verb in ("create", "*")
    return verb == "*" and Resource(resource.group, resource.resource) in IDENTITY_RESOURCES


@dataclass(frozen=True, slots=True)
class Authorization:
    """One authorization the API server made before admission, as the RBAC authorizer saw it.

    ``name`` is the name in the URL, "" when it named none (a POST to the collection, a
    collection delete). ``after``: the API server makes this check only after one of these verbs
    was authorized on the same name (a server-side apply is authorized as ``patch`` and, when it
    creates the object, then as ``create``).
    """

    verb: str
    name: str = ""
    after: tuple[str, ...] = ()


# One or more authorizations of which the request passed at least one (the review does not say
# which: a POST or an apply, a PUT or a PATCH). Granting the same outcome, they are judged
# together: the roles granting any of them.
Alternatives = tuple[Authorization, ...]


def authorizations(operation: str, resource: Resource, name: str) -> tuple[Alternatives, ...]:
    """What RBAC authorized for an admission request: every entry was passed (they AND); within
    an entry, at least one alternative. docs/decision.md, "The decision" table, step 1, explains
    each row; tests/engine/test_attributes.py holds one test per row."""
    if operation == "CREATE":
        if resource.subresource:
            # POST .../<name>/eviction, /binding, /token: the URL names the parent.
            return ((Authorization("create", name),),)
        # A POST names no object, so RBAC saw none and a resourceNames rule cannot match. A PUT
        # of a missing object (update.go) or a server-side apply that creates it (patch.go) is
        # authorized as "update"/"patch" and then as "create" *with the name*, so a rule with
        # resourceNames can grant a create. The review does not say which of the three it was.
        # Counting such a rule whenever the user also holds update or patch on that name is
        # sound: through that rule the user can make the very same object with PUT or apply
        # anyway. Without update or patch on the name, the rule cannot have been used.
        return (
            (Authorization("create"), Authorization("create", name, after=("update", "patch"))),
        )
    if operation == "UPDATE":
        # PUT is "update", PATCH (apply included) is "patch". Either yields the same object, so
        # a user holding one can reach what the other did.
        return ((Authorization("update", name), Authorization("patch", name)),)
    if operation == "DELETE":
        # A collection delete (DELETE on the collection URL) is "deletecollection" without a
        # name; each object then reaches admission as a DELETE with an empty name.
        return ((Authorization("delete", name),) if name else (Authorization("deletecollection"),),)
    if operation == "CONNECT":
        # The HTTP method, hence the verb, is not in the review. The verbs lead to different
        # outcomes (a POST to a proxied service is not a GET), so every verb the user holds
        # must permit the request.
        verbs = ("create", "get") if resource.subresource in SESSION_SUBRESOURCES else PROXY_VERBS
        return tuple((Authorization(verb, name),) for verb in verbs)
    return ()


@dataclass(frozen=True, slots=True)
class Request:
    """One admission request, reduced to what the engine decides on.

    ``resource`` and ``kind`` describe ``object`` and ``oldObject``. ``request_resource`` is
    what the client asked for and RBAC authorized, when the API server converted the request to
    an equivalent resource for this webhook (``matchPolicy: Equivalent``); None when the same.
    """

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
    request_resource: Resource | None = None
    # The authorizations to judge the request by when it stands for another request than the
    # review's (a write judged as the delete it makes a controller do: ``owners``); None: those
    # the review implies (``authorizations``).
    judged_as: tuple[Alternatives, ...] | None = None

    @property
    def verbs(self) -> tuple[str, ...]:
        return VERBS_FOR_OPERATION.get(self.operation, ())

    @property
    def authorized_resource(self) -> Resource:
        """The resource RBAC authorized: the one roles and annotation entries are matched on."""
        return self.request_resource or self.resource

    @property
    def authorizations(self) -> tuple[Alternatives, ...]:
        if self.judged_as is not None:
            return self.judged_as
        return authorizations(self.operation, self.authorized_resource, self.name)

    @property
    def verb(self) -> str:
        """The verb a denial message names: the first RBAC verb of the request."""
        for alternatives in self.authorizations:
            return alternatives[0].verb
        return self.operation.lower()

    def describe(self) -> str:
        """``configmaps "c2" in namespace "t1"`` — the object as a denial message names it."""
        text = str(self.authorized_resource)
        # A collection delete reaches admission without a name: the object still has one.
        name = self.name or _text(_metadata(self.old_object or self.object), "name")
        if name:
            text += f' "{name}"'
        if self.namespace:
            text += f' in namespace "{self.namespace}"'
        return text


@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome of one review.

    ``reason`` is a short machine-readable cause (used in logs and metrics); ``message`` is what
    the tenant reads. ``explanation`` lists which roles and entries decided, for ``app check``.
    ``mode``: on a denial, the mode of the rule that denied (the pipeline may soften it); on an
    allowed decision, ``warn`` or ``audit`` when it is a denial that was not enforced, whose
    reason and message are kept.
    """

    allowed: bool
    code: int = 200
    reason: str = "Allowed"
    message: str = ""
    warnings: tuple[str, ...] = ()
    explanation: tuple[str, ...] = field(default=(), compare=False)
    mode: str = ENFORCE

    @classmethod
    def allow(cls, reason: str, *explanation: str, warnings: tuple[str, ...] = ()) -> Decision:
        return cls(True, 200, reason, "", warnings, explanation)

    @classmethod
    def deny(
        cls, reason: str, message: str, *explanation: str, code: int = 403, mode: str = ENFORCE
    ) -> Decision:
        return cls(False, code, reason, message, (), explanation, mode)

    @property
    def softened(self) -> bool:
        """A denial let through by ``warn`` or ``audit`` mode."""
        return self.allowed and self.mode != ENFORCE


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


def _metadata(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """``metadata`` of an object, tolerating absent or null metadata (as the API allows)."""
    metadata = obj.get("metadata") if obj else None
    return metadata if isinstance(metadata, Mapping) else {}


def _text(mapping: Mapping[str, Any], key: str) -> str:
    value = mapping.get(key)
    return value if isinstance(value, str) else ""


def _metadata_map(obj: Mapping[str, Any] | None, key: str) -> Mapping[str, str]:
    """``metadata.<key>`` of an object: labels or annotations, {} when absent or malformed."""
    found = _metadata(obj).get(key)
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
