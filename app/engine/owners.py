"""Writes that make the garbage collector delete an object: judged as deleting it.

The garbage collector deletes with its own unrestricted authority: an object whose owners are all
gone (an owner reference naming a uid that does not exist is gone at once), and the dependents of
an owner being deleted. Finalizers hold a deletion (a held ServiceAccount still authenticates its
tokens) and, removed, complete it. So a tenant who may write an object but not delete it could
still have it deleted, then create it again as hers: a ServiceAccount created again under its
name inherits every RoleBinding naming it. Kubernetes' own ``OwnerReferencesPermissionEnforcement``
plugin asks for ``delete`` on the object for the same reason; label-rbac asks for what a delete
must meet here, labels included.

A CREATE carrying owner references or finalizers, and an UPDATE (a patch, a server-side apply, a
subresource write that keeps them) changing them, removals included, is judged as the user's
DELETE of the object, as stored and as written, by the rules that judge a delete: the label rule
(``labels.check_labels``) and what a delete makes controllers do (``workloads.check_workloads``:
a workload's pods, a ServiceAccount's identity loans). The roles judging it are those granting
the user ``delete`` on it; when none does, those granting the write, as the workload rules judge a
controller's pods by the workload's roles when no role grants pods (``workloads._deputy_grants``).

Removing every owner reference is judged too: removing a controller reference hands the object to
whichever controller's selector matches it next (its owner creates a replacement), and leaves it
behind when its owner is deleted. An unchanged list (in any order) costs a comparison and nothing
else; users bound to no role with an annotation skip the rule.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter
from collections.abc import Mapping
from typing import Any, NamedTuple

from app.engine.context import Context
from app.engine.labels import check_labels, object_is_parent, who
from app.engine.model import ENFORCE, Authorization, Decision, Request, Resource, labels_of
from app.engine.workloads import check_workloads

OWNERS = "ownerReferences"
FINALIZERS = "finalizers"
OWNER_DENIED = "OwnerReferenceNotPermitted"
FINALIZER_DENIED = "FinalizerNotPermitted"

# The rules a DELETE meets once the label rule let it through, as ``decide.evaluate`` runs them.
DELETE_RULES = (check_labels, check_workloads)

# What each field makes the garbage collector do, in a denial's words (the compiled policy's too).
OWNER_EFFECT = (
    "the garbage collector deletes an object once its owners are gone (at once for an owner that "
    "does not exist) and whatever a deleted owner owns"
)
FINALIZER_EFFECT = (
    "a finalizer holds the object's deletion (a held ServiceAccount still authenticates its "
    "tokens) and, removed, completes it"
)
_EFFECT = {OWNERS: (OWNER_DENIED, OWNER_EFFECT), FINALIZERS: (FINALIZER_DENIED, FINALIZER_EFFECT)}
JUDGED_AS_DELETE = "so the write is judged as deleting the object"
ASK = "or ask someone who may delete the object to make the change"
# At most this many entries named in a message, each cut to this many characters: the lists are
# the writer's, and a message stays one line.
_SHOWN = 3
_CUT = 80


def check_owners(request: Request, ctx: Context) -> Decision | None:
    """Refuse a write that changes the owner references or finalizers of an object the user
    may not delete; else None."""
    if request.operation not in ("CREATE", "UPDATE") or not object_is_parent(request):
        return None
    stored = request.old_object if request.operation == "UPDATE" else None
    before, after = _metadata(stored), _metadata(request.object)
    written = [f for f in (OWNERS, FINALIZERS) if before.get(f) != after.get(f)]
    if not written or not ctx.snapshot.limited(request.user, request.namespace):
        return None  # the lists as written are unchanged (the usual case), or no label limits
    changed = [f for f in written if _entries(f, stored) != _entries(f, request.object)]
    if not changed:
        return None
    versions = [v for v in (stored, request.object) if v is not None]
    if len(versions) == 2 and _judged_alike(*versions):
        versions = versions[:1]  # what a delete is judged by did not change
    denial: Decision | None = None
    for version in versions:
        deleting = as_delete(request, ctx, version)
        for rule in DELETE_RULES:
            decided = rule(deleting, ctx)
            if decided is None or decided.allowed:
                continue
            if decided.mode == ENFORCE:
                return _denial(request, changed, stored, decided)
            denial = denial or decided  # a softer mode's: an enforced one may still follow
    return None if denial is None else _denial(request, changed, stored, denial)


def as_delete(request: Request, ctx: Context, version: Mapping[str, Any]) -> Request:
    """The request for deleting the object in ``version`` that the write stands for: judged by
    the roles granting the user ``delete`` on it, or, with none, by those granting the write."""
    authorized = request.authorized_resource
    whole = Resource(authorized.group, authorized.resource)
    name = request.name or _name(version)
    granting = ctx.snapshot.granting_roles(
        request.user, request.namespace, ("delete",), whole, name
    )
    judged: tuple[tuple[Authorization, ...], ...]
    if granting:
        judged, by = ((Authorization("delete", name),),), whole
    else:
        judged, by = request.authorizations, authorized
    resource = Resource(request.resource.group, request.resource.resource)
    return dataclasses.replace(
        request,
        operation="DELETE",
        resource=resource,
        request_resource=None if by == resource else by,
        name=name,
        object=None,
        old_object=version,
        judged_as=judged,
    )


def _judged_alike(stored: Mapping[str, Any], written: Mapping[str, Any]) -> bool:
    """Whether the delete rules judge both versions alike: of the metadata they read the labels
    only; the rest (a workload's templates, wherever its kind keeps them) must be equal."""
    if labels_of(stored) != labels_of(written) or len(stored) != len(written):
        return False
    return all(key == "metadata" or written.get(key) == value for key, value in stored.items())


def _metadata(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    metadata = obj.get("metadata") if obj else None
    return metadata if isinstance(metadata, Mapping) else {}


def _change(field: str, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> str:
    """What the write does to ``metadata.<field>``, in words."""
    before, after = _entries(field, old), _entries(field, new)
    added, removed = _describe(after - before), _describe(before - after)
    return "; ".join(
        part for part in (added and f"adds {added}", removed and f"removes {removed}") if part
    )


class _Owner(NamedTuple):
    """What an owner reference means to the garbage collector (an absent flag is false)."""

    api_version: str
    kind: str
    name: str
    uid: str
    controller: bool
    block: bool

    @classmethod
    def of(cls, ref: Mapping[str, Any]) -> _Owner:
        return cls(
            _text(ref.get("apiVersion")),
            _text(ref.get("kind")),
            _text(ref.get("name")),
            _text(ref.get("uid")),
            ref.get("controller") is True,
            ref.get("blockOwnerDeletion") is True,
        )

    def describe(self) -> str:
        flags = ", controller" * self.controller + ", blockOwnerDeletion" * self.block
        return (
            f'{_cut(self.kind) or "?"} "{_cut(self.name)}" '
            f'({_cut(self.api_version) or "no apiVersion"}, uid "{_cut(self.uid)}"{flags})'
        )


class _Malformed:
    """An entry of neither shape (or a field that is no list): never taken for nothing."""

    def describe(self) -> str:
        return "a malformed entry"


_MALFORMED = _Malformed()
Entry = str | _Owner | _Malformed


def _entries(field: str, obj: Mapping[str, Any] | None) -> Counter[Entry]:
    """``metadata.<field>`` as a multiset of comparable entries."""
    value = _metadata(obj).get(field)
    if value is None:
        return Counter()
    if not isinstance(value, list):
        return Counter({_MALFORMED: 1})
    if field == FINALIZERS:
        return Counter(item if isinstance(item, str) else _MALFORMED for item in value)
    return Counter(_Owner.of(ref) if isinstance(ref, Mapping) else _MALFORMED for ref in value)


def _describe(entries: Counter[Entry]) -> str:
    """The first few entries in words, and how many more."""
    shown = [
        f'"{_cut(entry)}"' if isinstance(entry, str) else entry.describe()
        for entry in itertools.islice(entries.elements(), _SHOWN)
    ]
    total = entries.total()
    if total > _SHOWN:
        shown.append(f"{total - _SHOWN} more")
    return ", ".join(shown)


def _denial(
    request: Request, changed: list[str], stored: Mapping[str, Any] | None, inner: Decision
) -> Decision:
    """The delete's refusal, as the refusal of the write that stands for it."""
    changes = {f: _change(f, stored, request.object) for f in changed}
    reason = _EFFECT[next(iter(changes))][0]
    effect = "; ".join(_EFFECT[f][1] for f in changes)
    described = " and ".join(f"metadata.{f} ({change})" for f, change in changes.items())
    fields = " and ".join(f"metadata.{f}" for f in changes)
    created = request.operation == "CREATE"
    fix = f"Create it without {fields}" if created else f"Leave {fields} as stored"
    return Decision(
        False,
        inner.code,
        reason,
        f"{who(request)}: it {'sets' if created else 'changes'} {described}, and {effect}, "
        f"{JUDGED_AS_DELETE}: {inner.message}. {fix}, {ASK}",
        (),
        (f"judged as deleting the object: {inner.reason}", *inner.explanation),
        inner.mode,
    )


def _name(obj: Mapping[str, Any]) -> str:
    return _text(_metadata(obj).get("name"))


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _cut(text: str) -> str:
    return text if len(text) <= _CUT else text[: _CUT - 3] + "..."
