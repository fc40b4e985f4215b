"""The compiled label rule as the API server runs it: ValidatingAdmissionPolicies and bindings.

The policies read the namespace's ``LabelRbacParams`` (``app.engine.params``) and give the verdict
and the message ``/validate`` gives for the same write (``app.engine.labels``): the roles granting
the request to the user, unrestricted or with label limits, the stored labels before the new ones,
the same words. One policy per enforcement mode, because a binding's ``validationActions`` are
fixed while the mode of a denial depends on the roles that caused it: ``label-rbac`` (Deny) judges
the denials enforced, ``label-rbac-warn`` (Warn) and ``label-rbac-audit`` (Audit) those a mode
softens; the latter two stop at one field unless the namespace has a softened role, and ship
apart (``manifests/compiled/modes``), since every bound policy costs an evaluation per write.

Fail closed:

- where there are no parameters the policy stands aside (``parameterNotFoundAction: Allow``), and
  the webhook judges: a namespace the compiler has not rendered yet (just created, or the compiler
  is down) is not marked compiled, so the webhook's label entry takes every write of it; a marked
  namespace has parameters unless it is being deleted (``mark_owner``), and there a change of
  labels is refused (``terminating``) while the deletion's own writes pass. With ``Deny``, every
  update and delete of a namespace being deleted was refused once the namespace controller had
  deleted its parameters (first, as often as not), and its deletion never ended;
- a subject RBAC authorizes for an indexed resource but the parameters do not list (bound after
  they were rendered) is refused with a retryable message: the API server's own authorizer is
  asked, so a just-bound subject never writes unchecked (``system:masters``, whom RBAC does not
  decide, is not asked about);
- a namespace too large to compile (``delegated``) is left to the webhook, which keeps judging it.

Cost: the API server evaluates a policy in passes (match conditions, validations, then every
message and audit annotation, allowed or not), each computing again the variables it reads, and
each variable as a program of its own (with its own cost tracker). So the policy matches only the
writes it may refuse (``_judgement``): a write it allows costs one pass, the match condition, which
spells out ``granting``, ``unlisted`` and ``denied`` (the request's parts bound inside them by
``_bind``); the validation reads them as variables, and the others serve the messages of refusals.
Every lookup is by key (resource, operation, user, each group), so the time does not grow with the
bindings of a namespace; a label value is looked up among literals, compared with the prefixes and
suffixes globs reduce to, and matched against at most one RE2 pattern per requirement (built from
globs of at most 63 characters, at most 64 per requirement and 256 per role: the annotation
schema); attacker-controlled labels are read once per requirement of each role granting the
request. A write that sets or changes owner references or finalizers stands for a delete
(``app.engine.owners``): the match condition compares those two lists first, and only a change
computes the DELETE grants (``deleteGranting``).

Only the compiler may write the parameters: ``label-rbac-params`` refuses everyone else
(``COMPILER``); ``label-rbac-marks`` holds it, on Namespaces, to the compiled mark, which
``label-rbac-mark-owner`` lets no one else put on; and
``label-rbac-registration`` holds it, on the webhook registration, to the conditions and
annotation it keeps there (``app.compiled.registration``). ``python -m app.compiled.admission_policy
[--modes | --webhook | --split]`` prints the files it generates (``FILES``).
"""

from __future__ import annotations

import copy
import json
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from app.compiled.registration import (
    ANNOTATION_SHAPE,
    COMPILED_ENTRY,
    CONDITION,
    LABEL_ENTRIES,
    OPERATIONS,
    RETIRED,
    SHAPE,
)
from app.engine.catalog import BUILTIN
from app.engine.context import UNJUDGED_ANNOTATION
from app.engine.model import AUDIT, ENFORCE, WARN
from app.engine.node import RESOURCES as NODE_RULED
from app.engine.owners import (
    ASK,
    FINALIZER_EFFECT,
    FINALIZERS,
    JUDGED_AS_DELETE,
    OWNER_EFFECT,
    OWNERS,
)
from app.engine.params import (
    API_VERSION,
    DEFAULT,
    KIND,
    LAYOUT,
    LAYOUT_ANNOTATION,
    MARK,
    MAX_CHUNKS,
    NAME,
    SOFTENED_MARK,
    WEBHOOK_RESOURCES,
    ClusterPart,
    namespace_marks,
    unjudged_literal,
)

POLICY = "label-rbac"
# Per policy: the mode of the denials it judges and the binding's validation action.
ACTIONS: Mapping[str, tuple[str, str]] = {
    POLICY: (ENFORCE, "Deny"),
    f"{POLICY}-warn": (WARN, "Warn"),
    f"{POLICY}-audit": (AUDIT, "Audit"),
}
SUPERUSERS = "system:masters"
# The compiler's identity (manifests/compiled/rbac.yaml): the one writer of parameters.
COMPILER = "system:serviceaccount:label-rbac:label-rbac-compiler"
GUARD = f"{POLICY}-params"
# Who deletes a namespace's content once it is being deleted: the namespace controller of
# kube-controller-manager, under its own ServiceAccount (--use-service-account-credentials, as
# kubeadm runs it) or the controller-manager's identity. Only they may delete parameters besides
# the compiler, and only while their namespace is terminating (else its deletion never ends).
NAMESPACE_CLEANERS = (
    "system:serviceaccount:kube-system:namespace-controller",
    "system:kube-controller-manager",
)
MARKS = f"{POLICY}-marks"
# The labels the compiler puts on a Namespace, which ``MARKS`` lets it change.
_MARKS = tuple(namespace_marks(True, softened=True))
REGISTRATION_GUARD = f"{POLICY}-registration"
# Every field of a v1 ValidatingWebhook but ``name`` and ``matchConditions``: the compiler may
# change none of them.
_WEBHOOK_FIELDS = (
    "clientConfig",
    "rules",
    "failurePolicy",
    "matchPolicy",
    "namespaceSelector",
    "objectSelector",
    "sideEffects",
    "timeoutSeconds",
    "admissionReviewVersions",
)
NODES = "system:nodes"
GROUP = API_VERSION.split("/")[0]
NAME_KEY = "kubernetes.io/metadata.name"  # the label the API server gives every namespace
# The namespaces label-rbac judges, as manifests/deploy/webhook.yaml selects them: never its own
# (a broken rollout stays repairable) or kube-system, and not those opted out.
JUDGED: Mapping[str, Any] = {
    "matchExpressions": [
        {
            "key": NAME_KEY,
            "operator": "NotIn",
            "values": ["label-rbac", "kube-system"],
        },
        {"key": "labelrbac.io/exempt", "operator": "NotIn", "values": ["true"]},
    ]
}
# The namespace of the shipped install, which every policy and entry leaves out.
(OWN_NAMESPACE,) = [v for e in JUDGED["matchExpressions"] for v in e["values"] if v == POLICY]


@dataclass(frozen=True)
class Install:
    """An install's names (the chart's ``name`` and namespace): the prefix of every policy and
    binding and of the compiler's ServiceAccount, and the namespace every policy leaves out. The
    documents here are generated for the shipped one (``label-rbac`` in ``label-rbac``);
    ``document`` gives one for another: the chart's template (``app.compiled.chart``), and the
    policies the compiler of a renamed install writes."""

    name: str = POLICY
    namespace: str = OWN_NAMESPACE

    @property
    def compiler(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.name}-compiler"

    def renamed(self, name: str) -> str:
        """``name`` (one of the shipped install's) in this install."""
        if name != POLICY and not name.startswith(POLICY + "-"):
            raise ValueError(f"{name}: not a name of this install")
        return self.name + name[len(POLICY) :]

    @property
    def unjudged(self) -> frozenset[str]:
        """The namespaces this install's policies never judge by name: kube-system and its own."""
        return frozenset(
            value
            for expression in JUDGED["matchExpressions"]
            if expression["key"] == NAME_KEY and expression["operator"] == "NotIn"
            for value in self._left_out(expression["values"])
        )

    def _left_out(self, values: Iterable[str]) -> list[str]:
        """The names a selector of the shipped install leaves out (``values``), in this one."""
        return [self.namespace if v == OWN_NAMESPACE else v for v in values]

    def document(self, document: Mapping[str, Any]) -> dict[str, Any]:
        """``document`` (a policy or binding generated here) with this install's names, the
        namespace its selectors leave out and the compiler's username."""
        found = copy.deepcopy(dict(document))
        found["metadata"]["name"] = self.renamed(found["metadata"]["name"])
        spec = found["spec"]
        if "policyName" in spec:
            spec["policyName"] = self.renamed(spec["policyName"])
        # A policy's matchConstraints, and a binding's own copy of its policy's (matchResources).
        for match in (spec.get("matchConstraints", {}), spec.get("matchResources", {})):
            for expression in match.get("namespaceSelector", {}).get("matchExpressions", ()):
                if expression["key"] == NAME_KEY:
                    expression["values"] = self._left_out(expression["values"])
        replaced: dict[str, Any] = _replace_strings(
            found, lambda s: s.replace(COMPILER, self.compiler)
        )
        return replaced


# The shipped install (manifests/compiled).
SHIPPED = Install()


def _replace_strings(value: Any, change: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return change(value)
    if isinstance(value, list):
        return [_replace_strings(v, change) for v in value]
    if isinstance(value, dict):
        return {k: _replace_strings(v, change) for k, v in value.items()}
    return value


# The webhook's label-rule entry (the split adds ``COMPILED_ENTRY`` for compiled namespaces).
LABEL_ENTRY = "labels.labelrbac.io"
WEBHOOK_YAML = Path(__file__).resolve().parents[2] / "manifests" / "deploy" / "webhook.yaml"


def _role_ids(holder: str = "params.spec") -> str:
    """The ids of the roles the namespace's RoleBindings bind to the user, in the webhook's
    order: the user's, then each group's (the ClusterRoleBindings' come after them, from the
    policy's constants: ``_cluster_found``); with ``holder`` a constant of those, theirs. The
    optional chains stay inline (a variable holding an optional would lose ``?.``
    semantics)."""
    return (
        f"{holder}.?users[?request.userInfo.username].orValue([]) + "
        f"request.userInfo.groups.map(g, {holder}.?groups[?g].orValue([])).flatten()"
    )


def _grant_id(entry: str, operation: str) -> str:
    """CEL: the id of the grant a namespace's role ``entry`` for the resource points
    ``operation`` to ('' for none). An entry is a grant id where every operation points to it
    (layout 2, ``app.engine.params.LAYOUT``), else a map of operation to grant id. The checker
    takes an entry for a map (its default is ``{}``): ``dyn`` lets it be a string."""
    return f"(type({entry}) == string ? dyn({entry}) : {entry}[?{operation}].orValue(''))"


def _grants(entries: str, operation: str) -> str:
    """The grants of the user's roles (their ``entries``) for ``operation`` of the resource."""
    return (
        f"{entries}.filter(m, type(m) == string || {operation} in m)"
        f".map(m, params.spec.grants[{_grant_id('m', operation)}])"
    )


# The request's parts, each written once and used both as a variable (read by the messages) and
# bound inside the variables a write always evaluates (``_bind``): the API server evaluates each
# variable as a program of its own, with its own cost tracker, so the common path reads as few of
# them as it can.
_REQUESTED = "request.?name.orValue('')"
_KEY = (
    "request.requestResource.resource + (request.requestResource.group == '' ? '' : "
    "'.' + request.requestResource.group)"
)


def _bind(name: str, value: str, body: str) -> str:
    """CEL: ``body`` with ``name`` standing for ``value``, evaluated once. (The API server's
    CEL has no ``cel.bind``: a one-element list mapped does the same.)"""
    return f"[{value}].map({name}, {body})[0]"


def _op(requested: str) -> str:
    # A collection delete's objects reach admission without a name.
    return (
        f"request.operation == 'DELETE' && {requested} == '' ? 'DELETECOLLECTION' : "
        "request.operation"
    )


def _indexed(key: str) -> str:
    return f"{key} in params.spec.?indexed.orValue([])"


def _role_entry(key: str, holder: str = "c") -> str:
    """CEL: the entry of role ``r`` of ``holder`` (the namespace's parameters, or a constant of
    the cluster part) for the resource ``key``: operation → grant id (its DEFAULT entry covers
    the indexed resources it does not name)."""
    return f"{holder}.roles[r][?{key}].orValue({holder}.roles[r][?'{DEFAULT}'].orValue({{}}))"


def _entries(key: str) -> str:
    """Per role bound to the user: operation → grant id for the requested resource (a role's
    DEFAULT entry covers the indexed resources it does not name)."""
    return f"({_role_ids()}).map(r, {_role_entry(key, 'params.spec')})"


# The cluster part's constants (``app.engine.params.cluster_chunks``), as one list.
CHUNKS = "clusterChunks"
# The constant of the served resources no annotation restricts (``unjudged_literal``).
UNJUDGED = "unjudged"


def _cluster_found(op: str, key: str) -> str:
    """The grants for ``op`` of the roles the ClusterRoleBindings bind to the user (the user's,
    then each group's, each subject in one chunk): read from the policy's constants, only when
    the resource is indexed."""

    def found(subjects: str) -> str:
        per_chunk = (
            f"c.{subjects}.orValue([]).map(r, {_role_entry(key)})"
            f".filter(m, {op} in m).map(m, {_cluster_grant('c', f'm[{op}]')})"
        )
        return f"variables.{CHUNKS}.map(c, {per_chunk}).flatten()"

    user = found("users[?request.userInfo.username]")
    groups = f"request.userInfo.groups.map(g, {found('groups[?g]')}).flatten()"
    return f"{user} + {groups}"


def _cluster_grant(chunk: str, grant_id: str) -> str:
    """CEL: the grant ``grant_id`` of ``chunk`` as a namespace's parameters hold one, built
    from the maps of one type each the constants hold it in (``params.grant_maps``: a literal
    mixing types costs the API server seconds to check, through a ``dyn`` per value), a
    requirement's empty lists put back."""
    lists = ", ".join(
        f"'{name}': dyn(q.?{name}.orValue([]))"
        for name in ("exact", "prefixes", "suffixes", "patterns")
    )
    labels = f"{chunk}.labels[x].map(q, {{'key': dyn(q.key[0]), {lists}}})"
    kinds = {
        "unrestricted": "'role': dyn(s.role), 'unrestricted': dyn(true)",
        "invalid": "'role': dyn(s.role), 'invalid': dyn(s.invalid)",
        "labels": (
            f"'role': dyn(s.role), 'mode': dyn(s.mode), 'allows': dyn(s.allows), "
            f"'labels': dyn({labels})"
        ),
    }
    named = f"x in {chunk}.names"
    names = f"'names': dyn({chunk}.names[x])"
    variants = {
        kind: f"({named} ? {{{fields}, {names}}} : {{{fields}}})" for kind, fields in kinds.items()
    }
    body = (
        f"s.kind == 'unrestricted' ? {variants['unrestricted']} : "
        f"s.kind == 'invalid' ? {variants['invalid']} : {variants['labels']}"
    )
    return f"dyn({_bind('x', grant_id, _bind('s', f'{chunk}.grants[x]', body))})"


def _found(op: str, key: str, cluster: bool) -> str:
    """The grants for ``op`` of the user's roles (``entries``: the namespace's), and with
    ``cluster`` those of the ClusterRoleBindings'."""
    own = _grants("entries", op)
    return f"({own} + {_cluster_found(op, key)})" if cluster else own


def _cluster_updatable(key: str, requested: str) -> str:
    """CEL: whether a grant of the ClusterRoleBindings' roles for UPDATE of ``key`` covers the
    object ``requested``: names no object, or names it. Only the grants' names are read, not
    the grants built whole (``_cluster_found``): the API server checks every expression of a
    policy on each write of it and again before judging by it, and that text is most of what
    it checks. A grant id the constant does not hold covers nothing."""
    covers = f"x in c.grants && (!(x in c.names) || {requested} in c.names[x])"
    per_role = f"[{_role_entry(key)}].exists(m, 'UPDATE' in m && [m['UPDATE']].exists(x, {covers}))"
    return f"variables.{CHUNKS}.exists(c, ({_role_ids('c')}).exists(r, {per_role}))"


def _granting(found: str, updatable: str | None, op: str, requested: str) -> str:
    """The grants that grant the request (``found``: for its operation; ``updatable``: whether
    a grant for UPDATE covers the object, None where ``op`` is never a create). A rule with
    resourceNames grants a create only to a user who may also update or patch that name (a PUT
    or an apply creating it): model.authorizations."""
    named = f"{found}.filter(g, !has(g.names) || {requested} in g.names)"
    if updatable is None:
        return named
    return (
        f"{op} != 'CREATE' ? {named} : "
        f"{found}.filter(g, !has(g.names)) + "
        f"({found}.exists(g, has(g.names) && {requested} in g.names) && ({updatable}) ? "
        f"{found}.filter(g, has(g.names) && {requested} in g.names) : [])"
    )


def _bound_granting(op: str = _op("requested"), cluster: bool = True) -> str:
    """``granting`` in one program: the request's parts bound, not read from variables. ``op``:
    the operation judged (the request's, or the DELETE a write stands for: ``deleteGranting``,
    which is never a create, so it is spelled without the create's case); without
    ``cluster``, the namespace's grants only (a match condition, which cannot read the
    policy's constants)."""
    updatable = None
    if op != repr("DELETE"):
        own = _grants("entries", repr("UPDATE"))
        updatable = f"{own}.exists(g, !has(g.names) || requested in g.names)"
        if cluster:
            updatable += f" || {_cluster_updatable('key', 'requested')}"
    granting = _granting("found", updatable, "op", "requested")
    found = _bind("found", _found("op", "key", cluster), granting)
    indexed = f"!({_indexed('key')}) ? [] : " + _bind("entries", _entries("key"), found)
    return _bind("requested", _REQUESTED, _bind("op", op, _bind("key", _KEY, indexed)))


NEW_LABELS = "object.metadata.?labels.orValue({})"
OLD_LABELS = "oldObject.metadata.?labels.orValue({})"


def _old_ok(restricted: str) -> str:
    """Whether some ``restricted`` grant permits the stored labels (a create has none)."""
    permitted = _bind("stored", OLD_LABELS, f"{restricted}.exists(g, {_permitted('stored')})")
    return f"request.operation == 'CREATE' || {permitted}"


def _new_ok(restricted: str) -> str:
    """Whether some ``restricted`` grant permits the labels written (a delete writes none)."""
    permitted = _bind("written", NEW_LABELS, f"{restricted}.exists(g, {_permitted('written')})")
    return f"request.operation != 'CREATE' && request.operation != 'UPDATE' || {permitted}"


def _distinct(strings: str) -> str:
    """The list ``strings`` without repeats, in order of first appearance."""
    return f"{strings}.transformList(i, s, {strings}.indexOf(s) == i, s)"


def _permitted(labels: str) -> str:
    """Whether a grant's requirements all permit the label set ``labels`` (a variable)."""
    return f"g.labels.all(r, {_requirement(labels)})"


def _requirement(labels: str) -> str:
    # Cheapest test first (``params.value_tests``): a lookup, string ends, and only then the one
    # pattern of the globs no string test expresses (a ``matches`` compiles it on every call).
    # A list of tests may be left out where empty (layout 2).
    value = f"{labels}[r.key]"
    return (
        f"r.key in {labels} ? ({value} in r.?exact.orValue([]) || "
        f"r.?prefixes.orValue([]).exists(p, {value}.startsWith(p)) || "
        f"r.?suffixes.orValue([]).exists(s, {value}.endsWith(s)) || "
        f"r.?patterns.orValue([]).exists(p, {value}.matches(p))) : params.spec.allowUnlabeled"
    )


def _violation(labels: str, existing: bool, restricted: str = "variables.restricted") -> str:
    """The first requirement of the first restricted role that ``labels`` fails, in words."""
    first = f"{restricted}[0].labels.filter(r, !({_requirement(labels)}))[0]"
    if existing:
        present = (
            "\"the existing object's label \" + v.key + '=\"' + {l}[v.key] + '\" is not permitted'"
        )
        missing = "'the existing object has no label ' + v.key"
    else:
        present = "'label ' + v.key + '=\"' + {l}[v.key] + '\" is not permitted'"
        missing = "'missing label ' + v.key"
    return f"[{first}].map(v, v.key in {labels} ? {present.format(l=labels)} : {missing})[0]"


def _changed(field: str) -> str:
    """CEL: whether the write sets (a create) or changes (an update) ``metadata.<field>``, in
    order: the policy's lists compare as written, so a reordering counts too (stricter than the
    webhook, which compares them as multisets, ``app.engine.owners``)."""
    new = f"object.metadata.?{field}.orValue([])"
    return (
        f"(request.operation == 'CREATE' ? {new}.size() > 0 : request.operation == 'UPDATE' && "
        f"{new} != oldObject.metadata.?{field}.orValue([]))"
    )


def _mode_of(restricted: str, invalid: str) -> str:
    """CEL: the strictest mode of the roles that failed (a void role never softens a denial),
    then the softer of that and the global mode: decide.apply_mode."""
    return (
        f"{invalid}.size() > 0 || {restricted}.exists(g, g.mode == 'enforce') ? "
        f"(params.spec.mode) : {restricted}.exists(g, g.mode == 'warn') ? "
        "(params.spec.mode == 'audit' ? 'audit' : 'warn') : 'audit'"
    )


def _who(verb: str) -> str:
    """CEL: ``user "alice" may not <verb> configmaps "c" in namespace "t1"``."""
    return (
        f"'user \"' + request.userInfo.username + '\" may not ' + {verb} + ' ' + variables.key + "
        "(variables.name != '' ? ' \"' + variables.name + '\"' : '') + "
        "(request.namespace != '' ? ' in namespace \"' + request.namespace + '\"' : '')"
    )


def _refused_labels(granting: str, restricted: str) -> str:
    """CEL: the label rule's refusal by ``granting`` (unless a grant is unrestricted): only
    void roles, or no restricted one permitting the stored and the written labels."""
    return (
        f"{granting}.size() > 0 && !{granting}.exists(g, has(g.unrestricted)) && ("
        f"{restricted}.size() == 0 || !({_old_ok(restricted)}) || !({_new_ok(restricted)}))"
    )


# A write that sets or changes owner references or finalizers stands for a delete of the object
# (``app.engine.owners``): the roles granting the user ``delete`` on it must permit its labels as
# stored and as written; without one, the roles granting the write (judged above) decide.
_OWNERS_CHANGED = f"{_changed(OWNERS)} || {_changed(FINALIZERS)}"


def _text(text: str) -> str:
    """``text`` as a CEL string literal (the effects' words hold apostrophes)."""
    if '"' in text or "\\" in text:
        raise ValueError(f"{text!r}: not a plain text")
    return f'"{text}"'


_EFFECTS = {OWNERS: OWNER_EFFECT, FINALIZERS: FINALIZER_EFFECT}


def _delete_message() -> str:
    """CEL: the refusal of the delete a write stands for, in the webhook's words (which also
    name each entry added or removed: ``app.engine.owners``)."""
    fields = ", ".join(f"{_changed(f)} ? 'metadata.{f}' : ''" for f in _EFFECTS)
    effects = " : ".join(f"f == 'metadata.{f}' ? {_text(e)}" for f, e in _EFFECTS.items())
    restricted, invalid = "variables.deleteRestricted", "variables.deleteInvalid"
    broken = _distinct(f"{invalid}.map(g, g.invalid)") + ".join('; ')"
    violation = (
        f"(!({_old_ok(restricted)}) ? {_violation('variables.oldLabels', True, restricted)} : "
        f"{_violation('variables.newLabels', True, restricted)})"
    )
    allows = _distinct(f"{restricted}.map(g, g.allows)") + ".join('; ')"
    creating = "request.operation == 'CREATE'"
    body = (
        f"variables.who + ': it ' + ({creating} ? 'sets ' : 'changes ') + fields.join(' and ') + "
        f"', and ' + fields.map(f, {effects} : '').join('; ') + ', {JUDGED_AS_DELETE}: ' + "
        f"{_who(repr('delete'))} + ': ' + ({restricted}.size() == 0 ? {broken} : "
        f"{violation} + ' (' + {allows} + ({invalid}.size() > 0 ? '; ' + {broken} : '') + ')') "
        f"+ '. ' + ({creating} ? 'Create it without ' : 'Leave ') + fields.join(' and ') + "
        f"({creating} ? '' : ' as stored') + ', {ASK}'"
    )
    return _bind("fields", f"[{fields}].filter(f, f != '')", body)


VARIABLES: tuple[tuple[str, str], ...] = (
    # The name in the URL; a collection delete's objects reach admission without one.
    ("requested", _REQUESTED),
    ("key", _KEY),
    ("op", _op("variables.requested")),
    ("delegated", "has(params.spec.delegated)"),
    ("marked", f"namespaceObject.metadata.?labels[?'{MARK}'].orValue('') == 'true'"),
    ("indexed", _indexed("variables.key")),
    (
        # Neither judged here nor known to need no judging: served since the compiler last
        # looked (a CRD just created, say), which an annotation may restrict. Not asked of
        # system:masters, whom no label-rbac role restricts.
        "unknown",
        "!variables.delegated && !variables.indexed && "
        f"!(variables.key in variables.{UNJUDGED}) && "
        f"!('{SUPERUSERS}' in request.userInfo.groups)",
    ),
    ("granting", _bound_granting()),
    # A role bound twice (to the user and a group, say) is granting twice: harmless to the
    # verdict, and said once in the message (``allows``, ``broken``).
    ("restricted", "variables.granting.filter(g, has(g.labels))"),
    ("invalid", "variables.granting.filter(g, has(g.invalid))"),
    (
        "newLabels",
        f"request.operation == 'CREATE' || request.operation == 'UPDATE' ? {NEW_LABELS} : {{}}",
    ),
    ("oldLabels", f"request.operation == 'CREATE' ? {{}} : {OLD_LABELS}"),
    ("oldOk", _old_ok("variables.restricted")),
    ("newOk", _new_ok("variables.restricted")),
    (
        # In one program, as every write evaluates it: no variable but ``granting`` is read.
        "denied",
        "!has(params.spec.delegated) && variables.granting.size() > 0 && "
        "!variables.granting.exists(g, has(g.unrestricted)) && "
        + _bind(
            "restricted",
            "variables.granting.filter(g, has(g.labels))",
            f"restricted.size() == 0 || !({_old_ok('restricted')}) || !({_new_ok('restricted')})",
        ),
    ),
    (
        # The strictest mode of the roles that failed (a void role never softens a denial), then
        # the softer of that and the global mode: decide.apply_mode.
        "mode",
        _mode_of("variables.restricted", "variables.invalid"),
    ),
    (
        "name",
        "variables.requested != '' ? variables.requested : oldObject != null ? "
        "oldObject.metadata.?name.orValue('') : object.metadata.?name.orValue('')",
    ),
    (
        "who",
        _who(
            "{'CREATE': 'create', 'UPDATE': 'update', 'DELETE': 'delete', "
            "'DELETECOLLECTION': 'deletecollection'}[variables.op]"
        ),
    ),
    (
        "broken",
        _distinct("variables.invalid.map(g, g.invalid)") + ".join('; ')",
    ),
    (
        "allows",
        _distinct("variables.restricted.map(g, g.allows)") + ".join('; ')",
    ),
    (
        "message",
        "variables.restricted.size() == 0 ? variables.who + ': ' + variables.broken : "
        "variables.who + ': ' + (!variables.oldOk ? "
        f"{_violation('variables.oldLabels', True)} : "
        f"{_violation('variables.newLabels', False)}) + "
        "' (' + variables.allows + "
        "(variables.invalid.size() > 0 ? '; ' + variables.broken : '') + ')'",
    ),
    (
        # Authorized by RBAC for an indexed resource, yet unknown to the parameters: they are
        # older than the binding. Asked only in that case (variables are evaluated lazily).
        "unlisted",
        "variables.granting.size() == 0 && !variables.delegated && variables.indexed && "
        f"!('{SUPERUSERS}' in request.userInfo.groups) && "
        "(variables.op == 'CREATE' ? authorizer.requestResource.check('create').allowed() : "
        "variables.op == 'UPDATE' ? "
        "authorizer.requestResource.name(variables.requested).check('update').allowed() || "
        "authorizer.requestResource.name(variables.requested).check('patch').allowed() : "
        "variables.op == 'DELETE' ? "
        "authorizer.requestResource.name(variables.requested).check('delete').allowed() : "
        "authorizer.requestResource.check('deletecollection').allowed())",
    ),
    # The delete a change of owner references or finalizers stands for (``_OWNERS_CHANGED``).
    ("changed", _OWNERS_CHANGED),
    ("deleteGranting", f"variables.changed ? {_bound_granting(repr('DELETE'))} : []"),
    ("deleteRestricted", "variables.deleteGranting.filter(g, has(g.labels))"),
    ("deleteInvalid", "variables.deleteGranting.filter(g, has(g.invalid))"),
    (
        "deleteDenied",
        "variables.changed && !has(params.spec.delegated) && "
        + _refused_labels("variables.deleteGranting", "variables.deleteRestricted"),
    ),
    ("deleteMode", _mode_of("variables.deleteRestricted", "variables.deleteInvalid")),
    ("deleteMessage", _delete_message()),
)


_VARIABLE = re.compile(r"\bvariables\.([A-Za-z]+)\b")
_DEFINITIONS = dict(VARIABLES)


def _inline(
    expression: str, bound: frozenset[str] = frozenset(), constants: Mapping[str, str] | None = None
) -> str:
    """``expression`` with each variable it reads spelled out (those in ``bound`` read by their
    bare name, bound by ``_bind``; the policy's ``constants`` by their literal): a match
    condition may not read variables."""

    def spelled(found: re.Match[str]) -> str:
        name = found.group(1)
        if name in bound:
            return name
        text = (constants or {}).get(name) or _DEFINITIONS[name]
        return f"({_inline(text, bound, constants)})"

    return _VARIABLE.sub(spelled, expression)


def _refusals(mode: str, deletes: bool = True) -> str:
    """CEL: the refusals of the policy bound with ``mode`` that read the granting roles, and
    (``deletes``) those of the delete a change of owner references or finalizers stands for."""
    judged = f"variables.denied && variables.mode == '{mode}'"
    if deletes:
        judged += f" || {_delete_refusal(mode)}"
    return f"variables.unlisted || {judged}" if mode == ENFORCE else judged


def _delete_refusal(mode: str) -> str:
    return f"variables.deleteDenied && variables.deleteMode == '{mode}'"


def _allowed(mode: str) -> str:
    """CEL: the validation of the policy bound with ``mode``: whether it lets the write pass."""
    if mode != ENFORCE:
        return f"!({_refusals(mode)})"
    # A namespace marked compiled is not sent to the webhook for what this policy matches, so
    # the policy may not stand aside there: parameters delegated under the mark (the compiler
    # removes it first, so only during that hop or when someone else set it) refuse, and so does
    # a resource the parameters do not know yet.
    return f"!({_UNJUDGED}) && !({_UNKNOWN}) && !({_refusals(mode)})"


def _may_refuse(mode: str, unjudged: str = unjudged_literal(())) -> str:
    """CEL: the policy's match condition, variables spelled out: whether ``_allowed`` may be
    false. It reads the namespace's parameters and, spelled out again, the constant of the
    resources no annotation restricts (``unjudged``, a literal the API server folds once per
    policy); it does not read the policy's constants holding the ClusterRoleBindings' grants
    (``cluster_conditions`` copy those), so it matches every write
    those could decide: one no role of the namespace grants (``granting`` empty, the resource
    indexed), and one they refuse whatever the mode (a grant of the cluster's may permit it, or
    enforce what they soften). Adding grants never turns a write the namespace's grants permit
    into a refusal (the label rule is a union), so what it lets pass, the validation would.
    A kubelet is judged by its labels as anyone (what the webhook's node rules decide of the
    resources the policy judges, the compiled entry sends the webhook: ``NODE_RESOURCES``);
    ``granting`` is computed once, after the checks that do not need it. A match condition
    cannot see the namespace, so delegated parameters match and the validation reads the
    namespace's mark."""
    indexed = _inline("variables.indexed")
    denied = _inline(_DEFINITIONS["denied"], frozenset({"granting"}))
    refused = _bind(
        "granting",
        _bound_granting(cluster=False),
        f"granting.size() == 0 ? {indexed} : {denied}",
    )
    # A write the fast path allows may still stand for a delete the user may not make: judged
    # first, and only when the write changes owner references or finalizers (``changed``).
    deletes = _bind(
        "granting",
        _bound_granting(repr("DELETE"), cluster=False),
        f"granting.size() == 0 ? {indexed} : "
        + _refused_labels("granting", "granting.filter(g, has(g.labels))"),
    )
    deletes = f"({_inline('variables.changed')}) && ({deletes})"
    if mode != ENFORCE:
        # Nothing softened in the namespace (the usual case): one field read and done.
        return f"has(params.spec.softened) && ({deletes} || !({fast_allowed()}) && {refused})"
    unknown = _inline("variables.unknown", constants={UNJUDGED: unjudged})
    return (
        f"(has(params.spec.delegated) || {deletes} || "
        f"!({fast_allowed()}) && ({unknown} || {refused}))"
    )


def _role_allows(role: str) -> str:
    """CEL: whether the grant of ``role`` (an id) for the operation on the requested resource
    permits the write by itself (``_permits_by_itself``). The request's parts are spelled out
    where they are read, once each on this path: binding them (``_bind``) would cost a
    comprehension each."""
    key = f"({_KEY})"
    entry = (
        f"params.spec.roles[{role}][?{key}].orValue({_indexed(key)} ? "
        f"params.spec.roles[{role}][?'{DEFAULT}'].orValue({{}}) : {{}})"
    )
    grant = f"params.spec.grants[?{_grant_id('e', f'({_op(_REQUESTED)})')}].orValue({{}})"
    return f"[{entry}].exists(e, {_permits_by_itself(grant)})"


def _permits_by_itself(grant: str) -> str:
    """CEL: whether ``grant`` (a grant as the parameters hold one) permits the write by itself:
    names no object (``names`` grants are left to ``granting``), and is unrestricted or its
    requirements permit both the stored and the written labels."""
    both = (
        f"(request.operation == 'CREATE' || g.labels.all(r, {_requirement(f'({OLD_LABELS})')}))"
        " && (request.operation == 'DELETE' || "
        f"g.labels.all(r, {_requirement(f'({NEW_LABELS})')}))"
    )
    return f"[{grant}].exists(g, !has(g.names) && (has(g.unrestricted) || has(g.labels) && {both}))"


def fast_allowed() -> str:
    """CEL: a write some single role the namespace binds to the user permits by itself, found
    by key lookups and short-circuiting ``exists`` (no list built): the allowed path of a match
    condition (the ClusterRoleBindings' roles are the validation's: ``_may_refuse``).

    It implies ``!denied && !unlisted``: a grant of the user's for the request, unrestricted or
    whose requirements permit the labels before and after, is granting and permits both. The
    converse does not hold (grants naming objects, old and new labels permitted by different
    roles): those writes fall through to ``granting``, which decides them exactly. A role's
    entry for the resource is looked up first: the index is read only for its ``DEFAULT``."""
    user = "request.userInfo.username"
    groups = "request.userInfo.?groups.orValue([])"
    role = _role_allows("id")
    return " || ".join(
        (
            f"params.spec.?users[?{user}].orValue([]).exists(id, {role})",
            f"{groups}.exists(s, params.spec.?groups[?s].orValue([]).exists(id, {role}))",
        )
    )


# Parameters delegated in a namespace marked compiled, and a resource they do not know there (see
# ``_allowed``).
_UNJUDGED = "variables.delegated && variables.marked"
_UNKNOWN = "variables.unknown && variables.marked"


def _not_yet(what: str) -> str:
    """CEL: the refusal of a write the namespace's parameters cannot judge yet; ``what`` says
    what they lack, as the inside of a CEL string literal."""
    return (
        "variables.who + ': the compiled label permissions of namespace \"' + "
        f"request.namespace + '\" {what}; retry in a moment'"
    )


def _message(mode: str) -> str:
    """CEL: the message of a refusal, saying which check failed. A message may not ask the
    authorizer (``unlisted`` does): once refused, no grant means the user is unlisted, a grant
    that the labels failed."""
    message = (
        f"(variables.denied && variables.mode == '{mode}' ? variables.message : "
        "variables.deleteMessage)"
    )
    if mode == WARN:  # the warning the webhook gives (``decide.apply_mode``)
        return f"{message} + ' (not enforced: {WARN} mode)'"
    if mode != ENFORCE:
        return message
    unjudged = (
        "variables.who + ': namespace \"' + request.namespace + '\" is labeled "
        f"{MARK}=true, which leaves its writes to the compiled policy, but it is too large "
        "to compile; the compiler removes the label in a moment (or: kubectl label namespace "
        f"' + request.namespace + ' {MARK}-)'"
    )
    stale = _not_yet("do not list this user yet")
    unknown = _not_yet(
        "do not know ' + variables.key + ' yet (served or restricted since the compiler last "
        "looked)"
    )
    return (
        f"{_UNJUDGED} ? {unjudged} : {_UNKNOWN} ? {unknown} : "
        f"variables.granting.size() == 0 ? {stale} : {message}"
    )


# The compiler's proof that the enforcing policy is in force: a dry-run update of a namespace's
# parameters carrying this label, which that policy alone refuses (with ``PROBE_MESSAGE``), and
# only where it finds the namespace's parameters. The compiler marks a namespace compiled only
# once it has seen that refusal: a policy just created (or written again after a deletion) is
# not in force until the API server has loaded it, and a marked namespace's plain writes are
# judged by the policy alone.
PROBE_LABEL = "labelrbac.io/probe"
PROBE_MESSAGE = "the compiled label policy is in force here"
_PROBED = (
    f"request.userInfo.username == '{COMPILER}' && request.dryRun == true && "
    f"object.metadata.?labels[?'{PROBE_LABEL}'].orValue('') == 'true'"
)
_OWN_GROUP = f"request.resource.group == '{GROUP}'"


def _cluster_allows(chunk: str) -> str:
    """CEL: whether a grant of ``chunk`` (a literal of the cluster part, ``cluster_chunks``)
    bound to the user or one of the groups permits the write by itself, as ``_role_allows``
    asks of the namespace's roles, the grant built as the validation builds it
    (``_cluster_grant``). Every lookup is optional: a match condition failing would refuse the
    write."""
    key, op = f"({_KEY})", f"({_op(_REQUESTED)})"
    role = "c.roles[?r].orValue({})"
    entry = f"{role}[?{key}].orValue({role}[?'{DEFAULT}'].orValue({{}}))"
    grant = f"c.grants[?x].hasValue() && {_permits_by_itself(_cluster_grant('c', 'x'))}"
    found = f"({_role_ids('c')}).exists(r, [({entry})[?{op}].orValue('')].exists(x, {grant}))"
    return _bind("c", chunk, found)


def cluster_conditions(chunks: Sequence[str]) -> list[dict[str, str]]:
    """The enforcing policy's match conditions over the cluster part: one per constant of it,
    each false where a grant it holds permits the write by itself. A match condition cannot
    read the policy's constants (``variables``), so each holds its constant again; the API
    server folds a literal once per policy. Match conditions are ANDed: a write one of them
    lets pass is allowed after one pass, as a write the namespace's roles permit is
    (``_may_refuse``), where without them the validation and its message each looked up the
    grants again. Where the policy is delegated, the resource not indexed, or the write stands
    for a delete (``changed``), they leave the write to the validation. Copies of the constants
    are written while the policy stays within ``MAX_CHUNKS`` constants' size: a constant
    without one is judged by the validation alone, exactly and more slowly."""
    escape = (
        f"{_OWN_GROUP} || has(params.spec.delegated) || !({_indexed(f'({_KEY})')}) || "
        f"({_inline('variables.changed')})"
    )
    copied = chunks[: max(0, MAX_CHUNKS - len(chunks))]
    return [
        {"name": f"cluster-{i}", "expression": f"{escape} || !({_cluster_allows(chunk)})"}
        for i, chunk in enumerate(copied)
    ]


def _judgement(
    mode: str, chunks: Sequence[str] = (), unjudged: str = unjudged_literal(())
) -> dict[str, Any]:
    """The policy's match conditions and validation.

    The API server evaluates a policy in passes, each a context of its own that computes again
    the variables it reads: the match conditions, the validations, then every messageExpression
    and audit annotation whether the validation failed or not. The conditions match only the
    writes the policy may refuse, so a write it allows costs one pass; a refused one is judged
    again by the validation and its message built. The enforcing policy also matches the
    compiler's probe (``PROBE_LABEL``) and nothing else of its own group, and has a condition
    per constant of the cluster part (``cluster_conditions``).
    """
    judged = {
        "expression": _allowed(mode),
        "messageExpression": _message(mode),
        "reason": "Forbidden",
    }
    if mode != ENFORCE:
        return {
            "matchConditions": [{"name": "may-refuse", "expression": _may_refuse(mode)}],
            "validations": [judged],
        }
    probe = {"expression": f"!({_PROBED})", "message": PROBE_MESSAGE, "reason": "Forbidden"}
    judged["expression"] = f"{_OWN_GROUP} || {judged['expression']}"
    condition = f"{_OWN_GROUP} ? {_PROBED} : {_may_refuse(mode, unjudged)}"
    return {
        "matchConditions": [
            {"name": "may-refuse", "expression": condition},
            *cluster_conditions(chunks),
        ],
        "validations": [probe, judged],
    }


# The subresources of the resources the policy judges that the webhook keeps judging in compiled
# namespaces: every one kube-apiserver v1.36 serves on a namespaced resource, but those of
# ``WEBHOOK_RESOURCES`` (sent whole): a CRD's status and scale, a Service's proxy, the status of
# the built-ins. Any other subresource is refused there (``subresource_policy``).
SUBRESOURCES = ("proxy", "scale", "status")
# The namespaced resources the webhook's node rules decide that the policy judges too (a kubelet
# may update a claim's status, never write the claim): in compiled namespaces the compiled entry
# sends the webhook their writes as well, so a kubelet meets those rules there too.
NODE_RESOURCES = tuple(
    sorted(
        (kind.group, kind.resource)
        for kind in BUILTIN
        if kind.namespaced and (kind.group, kind.resource) in NODE_RULED - WEBHOOK_RESOURCES
    )
)


def _rules(
    groups: Mapping[str, list[str]], operations: list[str], scope: str = "Namespaced"
) -> list[dict[str, Any]]:
    """One rule per API group of ``groups`` (group → resources)."""
    return [
        {
            "apiGroups": [group],
            "apiVersions": ["*"],
            "operations": operations,
            "resources": resources,
            "scope": scope,
        }
        for group, resources in groups.items()
    ]


def _by_group(resources: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    """(group, resource) pairs as resource names by API group, sorted: one rule per group."""
    groups: dict[str, list[str]] = {}
    for group, resource in sorted(resources):
        groups.setdefault(group, []).append(resource)
    return groups


def _kept() -> dict[str, list[str]]:
    """What the policy never judges, whole, by API group: ``WEBHOOK_RESOURCES`` and their
    subresources, and the compiler's own group."""
    groups = {
        group: [name for resource in resources for name in (resource, f"{resource}/*")]
        for group, resources in _by_group(WEBHOOK_RESOURCES).items()
    }
    return {**groups, GROUP: ["*/*"]}


def compiled_rules() -> list[dict[str, Any]]:
    """The rules of the webhook entry for compiled namespaces: only what the compiled policy does
    not judge, spelled as rules so that no match condition runs on the writes it judges (a
    program per request, bench vap ``split``). What the policy does not match, it leaves to these
    rules or refuses: every connect, the resources it never judges whole, and the subresources
    ``SUBRESOURCES`` names (any other subresource is refused by ``subresource_policy``); and,
    judged by both, the writes the node rules decide (``NODE_RESOURCES``)."""
    return [
        *_rules(_kept(), list(OPERATIONS)),
        *_rules(_by_group(NODE_RESOURCES), list(OPERATIONS)),
        *_rules({"*": [f"*/{name}" for name in SUBRESOURCES]}, list(OPERATIONS)),
        *_rules({"*": ["*/*"]}, ["CONNECT"]),
    ]


def _marked(operator: str) -> dict[str, Any]:
    return {
        "matchExpressions": [
            *JUDGED["matchExpressions"],
            {"key": MARK, "operator": operator, "values": ["true"]},
        ]
    }


# The compiled entry's one condition standing for the shipped entry's own skips.
SHIPPED_SKIPS = "shipped-skips"


def _all_of(conditions: list[Mapping[str, str]]) -> list[dict[str, str]]:
    """``conditions`` as one condition, true when each is: the API server evaluates every match
    condition of an entry as a program of its own on each request its rules and selectors
    match, so fewer programs cost less."""
    if len(conditions) < 2:
        return [dict(c) for c in conditions]
    expression = " && ".join(f"({c['expression']})" for c in conditions)
    return [{"name": SHIPPED_SKIPS, "expression": expression}]


def webhook_patch(config: Mapping[str, Any]) -> dict[str, Any]:
    """The patch splitting the webhook's label rule (``manifests/compiled/split/webhook.yaml``).

    ``config`` is the shipped ValidatingWebhookConfiguration: its label-rule entry keeps the
    namespaces not marked compiled, and a copy of it, failing closed, takes the marked ones for
    what the policy does not judge (``compiled_rules``), its own skips as one condition.
    """
    (labels,) = [w for w in config["webhooks"] if w["name"] == LABEL_ENTRY]
    if labels.get("namespaceSelector") != JUDGED:
        raise ValueError(f"{LABEL_ENTRY} selects other namespaces than the policy ({JUDGED})")
    compiled = copy.deepcopy(labels)
    compiled.update(
        name=COMPILED_ENTRY,
        failurePolicy="Fail",
        namespaceSelector=_marked("In"),
        rules=compiled_rules(),
        matchConditions=_all_of(labels.get("matchConditions", [])),
    )
    return {
        "apiVersion": config["apiVersion"],
        "kind": config["kind"],
        "metadata": {"name": config["metadata"]["name"]},
        "webhooks": [{"name": LABEL_ENTRY, "namespaceSelector": _marked("NotIn")}, compiled],
    }


SUBRESOURCE_GUARD = f"{POLICY}-subresources"


def subresource_policy() -> list[dict[str, Any]]:
    """``manifests/compiled/split/policy.yaml``: in compiled namespaces, the writes of a
    subresource that neither the policy nor the webhook entry for those namespaces sees (one
    ``SUBRESOURCES`` does not name, served by an aggregated API or a newer API server) are
    refused, rather than judged by no one. Its rules exclude everything else, so it costs no
    other request anything."""
    covered = {"*": ["*", *(f"*/{name}" for name in SUBRESOURCES)], **_kept()}
    return _guard(
        SUBRESOURCE_GUARD,
        _rules({"*": ["*/*"]}, list(OPERATIONS)),
        {"namespaceSelector": _marked("In"), "excludeResourceRules": _rules(covered, ["*"])},
        validations=[
            {
                "expression": "false",
                "messageExpression": (
                    "'user \"' + request.userInfo.username + '\" may not ' + "
                    "request.operation.lowerAscii() + ' ' + request.resource.resource + '/' + "
                    "request.subResource + (request.resource.group == '' ? '' : '.' + "
                    "request.resource.group) + ' in namespace \"' + request.namespace + "
                    "'\": namespace \"' + request.namespace + '\" is labeled "
                    f"{MARK}=true, and label-rbac judges there no subresource but "
                    f"{', '.join(SUBRESOURCES)} and those of the resources its webhook keeps "
                    "(an administrator may exempt the namespace: labelrbac.io/exempt=true)'"
                ),
                "reason": "Forbidden",
            }
        ],
    )


def _excluded(own: bool = True) -> list[dict[str, Any]]:
    """What the policies reading parameters never match: the compiler's own objects (``own``),
    so it can write parameters where there are none yet, and what the webhook keeps
    (app.engine.params.WEBHOOK_RESOURCES); a rule per group, as the API server tries each on
    every write."""
    groups = _by_group(WEBHOOK_RESOURCES)
    return _rules({GROUP: ["*"], **groups} if own else groups, ["*"])


def cluster_variables(chunks: Sequence[str], unjudged: str) -> list[dict[str, str]]:
    """The policy's constants holding the ClusterRoleBindings' part (``ClusterPart.chunks``),
    and their list, which ``_cluster_found`` reads: the API server builds a constant once per
    policy, not per write, and refuses an expression over 100,000 code points, hence several.
    Then the resources no annotation restricts (``unjudged``, a literal), which ``unknown``
    reads."""
    names = [f"cluster{i}" for i in range(len(chunks))]
    listed = "[" + ", ".join(f"variables.{n}" for n in names) + "]"
    return [
        *({"name": n, "expression": c} for n, c in zip(names, chunks, strict=True)),
        {"name": CHUNKS, "expression": listed if names else "dyn([])"},
        {"name": UNJUDGED, "expression": unjudged},
    ]


def unjudged_of(stored: Mapping[str, Any]) -> frozenset[str] | None:
    """What the policy ``stored`` (an object as the API server returns it) lets pass unjudged:
    its ``UNJUDGED`` constant read back (``unjudged_literal`` writes a CEL map of strings to
    true, which is JSON). None where it holds no such constant (a release before 0.3.4's);
    ValueError where the constant is not such a map."""
    variables = (stored.get("spec") or {}).get("variables") or ()
    entry = next((v for v in variables if v.get("name") == UNJUDGED), None)
    if entry is None:
        return None
    literal = entry.get("expression")
    try:
        found = json.loads(literal) if isinstance(literal, str) else None
    except ValueError:
        found = None
    if not isinstance(found, dict) or not all(isinstance(k, str) for k in found):
        raise ValueError(f"the policy's {UNJUDGED} constant is not a map of resources")
    return frozenset(found)


def policy(name: str, part: ClusterPart | None = None) -> dict[str, Any]:
    """The policy ``name`` (one of ``ACTIONS``) holding the cluster ``part``: the
    ClusterRoleBindings' grants (``chunks``) and the served resources no annotation restricts
    (``unjudged``). The compiler writes it (``app.compiled.compiler.PolicyWriter``). Without a
    part it knows no grant of theirs, and refuses the writes only those would permit, and every
    write in a namespace marked compiled of a resource the parameters there do not index."""
    mode, _ = ACTIONS[name]
    chunks = part.chunks if part is not None else ()
    literal = unjudged_literal(part.unjudged if part is not None else ())
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {
            "name": name,
            "labels": {"app.kubernetes.io/name": "label-rbac"},
            "annotations": {LAYOUT_ANNOTATION: LAYOUT},
        },
        "spec": {
            "failurePolicy": "Fail",
            "paramKind": {"apiVersion": API_VERSION, "kind": KIND},
            "matchConstraints": _judged(mode),
            "variables": [
                *cluster_variables(chunks, literal),
                *({"name": n, "expression": e} for n, e in VARIABLES),
            ],
            **_judgement(mode, chunks, literal),
        },
    }


def _judged(mode: str) -> dict[str, Any]:
    """What the policy bound with ``mode`` matches, and its binding too: the binding's own copy
    keeps the policy, which the compiler writes, from reaching anything else. The enforcing
    policy matches the parameters' own group too, for the compiler's probe (``PROBE_LABEL``).
    The warn and audit policies match only namespaces labeled ``SOFTENED_MARK``: elsewhere
    their match condition is false (nothing is softened), and each policy the API server
    evaluates costs it a pass of its own on every write."""
    selector = copy.deepcopy(dict(JUDGED))
    if mode != ENFORCE:
        softened = {"key": SOFTENED_MARK, "operator": "In", "values": ["true"]}
        selector["matchExpressions"] = [*selector["matchExpressions"], softened]
    return {
        "namespaceSelector": selector,
        "resourceRules": [
            {
                "apiGroups": ["*"],
                "apiVersions": ["*"],
                "operations": list(OPERATIONS),
                "resources": ["*"],
                "scope": "Namespaced",
            }
        ],
        "excludeResourceRules": _excluded(own=mode != ENFORCE),
    }


def binding(name: str) -> dict[str, Any]:
    mode, action = ACTIONS[name]
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "label-rbac"}},
        "spec": {
            "policyName": name,
            "validationActions": [action],
            "matchResources": _judged(mode),
            # No parameters: the policy stands aside (``policy_scope``'s docstring says why
            # that leaves no write unjudged, and how a namespace being deleted is held).
            "paramRef": {"name": NAME, "parameterNotFoundAction": "Allow"},
        },
    }


def _guard(
    name: str,
    rules: list[dict[str, Any]],
    constraints: Mapping[str, Any] | None = None,
    **spec: Any,
) -> list[dict[str, Any]]:
    """A policy of this component's (no parameters read), bound to deny; ``constraints``: more
    of its matchConstraints."""
    labels = {"app.kubernetes.io/name": "label-rbac"}
    match = {**(constraints or {}), "resourceRules": rules}
    return [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name, "labels": labels},
            "spec": {"failurePolicy": "Fail", "matchConstraints": match, **spec},
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name, "labels": labels},
            "spec": {"policyName": name, "validationActions": ["Deny"]},
        },
    ]


def _cleaners() -> str:
    return "[" + ", ".join(f"'{user}'" for user in NAMESPACE_CLEANERS) + "]"


def _unchanged(field: str, but: Sequence[str] = ()) -> str:
    """CEL: the metadata map ``field`` is the same before and after, but for the keys ``but``."""
    new, old = (f"{o}.metadata.?{field}.orValue({{}})" for o in ("object", "oldObject"))
    skip = f"k in {list(but)!r} || " if but else ""
    return f"{new}.all(k, {skip}{old}[?k] == {new}[?k]) && {old}.all(k, {skip}k in {new})"


def guard() -> list[dict[str, Any]]:
    """The policies keeping the compiler to what it is for (they hold when there are no
    parameters yet): only it writes parameters (``GUARD``; the namespace controller deletes them
    from a namespace being deleted); on a Namespace it writes, it changes
    nothing but its marks (``namespace_marks``), each to ``true`` or away (``MARKS``)."""
    parameters = _guard(
        GUARD,
        [
            {
                "apiGroups": [GROUP],
                "apiVersions": ["*"],
                "operations": list(OPERATIONS),
                "resources": ["labelrbacparams", "labelrbacparams/status"],
            }
        ],
        validations=[
            {
                "expression": (
                    f"request.userInfo.username == '{COMPILER}' || "
                    f"request.operation == 'DELETE' && request.userInfo.username in {_cleaners()} "
                    "&& namespaceObject != null "
                    "&& has(namespaceObject.metadata.deletionTimestamp)"
                ),
                "messageExpression": (
                    "'user \"' + request.userInfo.username + '\" may not write the "
                    "compiled label permissions: only the compiler (" + COMPILER + ") does, "
                    "and the namespace controller deletes them with their namespace'"
                ),
                "reason": "Forbidden",
            }
        ],
    )
    marks = _guard(
        MARKS,
        _rules({"": ["namespaces"]}, ["*"], scope="*"),
        matchConditions=[
            {"name": "the-compiler", "expression": f"request.userInfo.username == '{COMPILER}'"}
        ],
        validations=[
            {
                "expression": (
                    "request.operation == 'UPDATE' && "
                    + "".join(
                        f"object.metadata.?labels[?'{mark}'].orValue('true') == 'true' && "
                        for mark in _MARKS
                    )
                    + f"{_unchanged('labels', but=_MARKS)} && {_unchanged('annotations')} && "
                    "object.spec == oldObject.spec && "
                    "object.metadata.?finalizers == oldObject.metadata.?finalizers"
                ),
                "message": (
                    "the compiler may change nothing on a Namespace but its labels "
                    + " and ".join(f"{mark}=true" for mark in _MARKS)
                ),
                "reason": "Forbidden",
            }
        ],
    )
    return parameters + marks + mark_owner() + visible() + terminating()


MARK_OWNER = f"{POLICY}-mark-owner"
# Writes of a Namespace that carry its labels: the namespace controller's included.
NAMESPACE_SUBRESOURCES = ("namespaces/status", "namespaces/finalize")


def mark_owner() -> list[dict[str, Any]]:
    """Only the compiler puts the compiled mark on a Namespace (anyone allowed to may take it
    off, which only sends the webhook more): the compiler marks a namespace once its parameters
    are written, and the parameters are deleted by no one but the compiler and, in a namespace
    being deleted, the namespace controller, so a marked namespace has parameters unless it is
    being deleted. The policy needs that, since it stands aside where there are none."""
    marked = f"object.metadata.?labels[?'{MARK}'].orValue('') == 'true'"
    was = f"oldObject.metadata.?labels[?'{MARK}'].orValue('') == 'true'"
    return _guard(
        MARK_OWNER,
        _rules({"": ["namespaces", *NAMESPACE_SUBRESOURCES]}, ["CREATE", "UPDATE"], scope="*"),
        matchConditions=[
            {"name": "not-the-compiler", "expression": f"request.userInfo.username != '{COMPILER}'"}
        ],
        validations=[
            {
                "expression": f"!({marked}) || request.operation == 'UPDATE' && {was}",
                "messageExpression": (
                    "'user \"' + request.userInfo.username + '\" may not label namespace \"' + "
                    f"request.name + '\" {MARK}=true: only the compiler ({COMPILER}) does, once "
                    "it has written the compiled label permissions of the namespace'"
                ),
                "reason": "Forbidden",
            }
        ],
    )


VISIBLE = f"{POLICY}-params-visible"
# The compiler's proof that the informer of parameters the policies read has caught up with a
# batch of creates (``ParamsWriter._prove``): it sets the annotation ``EPOCH`` on one
# namespace's parameters after the batch's creates were answered, then sends a dry-run update
# carrying the same value as the label ``EPOCH``, which ``VISIBLE`` refuses (``EPOCH_MESSAGE``)
# until the parameters it reads carry that epoch.
EPOCH = "labelrbac.io/epoch"
EPOCH_MESSAGE = "the parameters the policies read have not reached this epoch yet"
_EPOCH_ASKED = f"object.metadata.?labels[?'{EPOCH}']"


def visible() -> list[dict[str, Any]]:
    """The compiler's update of a namespace's parameters passes only once the API server's
    informer of them, which the policies read, holds them (``parameterNotFoundAction: Deny``):
    the compiler writes parameters it has just created a second time before it marks the
    namespace, so a namespace is never marked compiled while the policy would find no parameters
    there and stand aside (its informer of Namespaces, which routes the webhook's entries, may
    be ahead of its informer of parameters). A dry-run update asking for an epoch (the label
    ``EPOCH``) passes only once that informer holds the parameters at that epoch: one such
    proof stands for every namespace created before the epoch was set."""
    found = _guard(
        VISIBLE,
        [
            {
                "apiGroups": [GROUP],
                "apiVersions": ["*"],
                "operations": ["UPDATE"],
                "resources": ["labelrbacparams"],
                "scope": "Namespaced",
            }
        ],
        # Where the policies judge: a mark elsewhere sends nothing anywhere.
        {"namespaceSelector": copy.deepcopy(JUDGED)},
        matchConditions=[
            {"name": "the-compiler", "expression": f"request.userInfo.username == '{COMPILER}'"}
        ],
        validations=[
            {
                "expression": (
                    f"!{_EPOCH_ASKED}.hasValue() || "
                    f"params.metadata.?annotations[?'{EPOCH}'] == {_EPOCH_ASKED}"
                ),
                "message": EPOCH_MESSAGE,
                "reason": "Forbidden",
            }
        ],
    )
    found[0]["spec"]["paramKind"] = {"apiVersion": API_VERSION, "kind": KIND}
    found[1]["spec"]["paramRef"] = {"name": NAME, "parameterNotFoundAction": "Deny"}
    return found


TERMINATING = f"{POLICY}-terminating"


def terminating() -> list[dict[str, Any]]:
    """In a namespace marked compiled and being deleted, a change of an object's labels is
    refused: the namespace controller deletes the parameters with the rest of the namespace's
    content, in no set order, and the policy stands aside once they are gone, so it may no longer
    judge that change (nor may the webhook, which the mark sends no plain write). The deletion
    itself needs none: a DELETE, and an update that keeps the labels (a controller removing its
    finalizer), pass, and no object can be created there (NamespaceLifecycle). An administrator
    may take the mark off, which sends the namespace's writes to the webhook."""
    relabels = f"{NEW_LABELS} != {OLD_LABELS}"
    key = (
        "request.resource.resource + (request.resource.group == '' ? '' : '.' + "
        "request.resource.group)"
    )
    return _guard(
        TERMINATING,
        _rules({"*": ["*"]}, ["UPDATE"]),
        {"namespaceSelector": _marked("In"), "excludeResourceRules": _excluded()},
        matchConditions=[{"name": "relabels", "expression": relabels}],
        validations=[
            {
                "expression": (
                    "namespaceObject != null && !has(namespaceObject.metadata.deletionTimestamp)"
                ),
                "messageExpression": (
                    "'user \"' + request.userInfo.username + '\" may not change the labels of ' + "
                    f"{key} + ' \"' + request.name + '\" in namespace \"' + request.namespace + "
                    "'\": the namespace is being deleted, and its compiled label permissions, "
                    "deleted with it, no longer judge a change of labels there (an administrator "
                    "may hand its writes to the webhook: kubectl label namespace ' + "
                    f"request.namespace + ' {MARK}-)'"
                ),
                "reason": "Forbidden",
            }
        ],
    )


def _registration_checks() -> list[tuple[str, str]]:
    """(expression, message) pairs: the compiler's update of the webhook registration changes
    nothing but the ``skip-unjudged`` conditions of the label-rule entries, in their generated
    shape, and the unjudged annotation, and may remove a condition of ``RETIRED`` (an entry
    without it receives more, never less)."""
    entries = "[" + ", ".join(f"'{e}'" for e in LABEL_ENTRIES) + "]"
    retired = "[" + ", ".join(f"'{name}'" for name in RETIRED) + "]"

    def others(hook: str) -> str:  # the conditions the compiler does not own
        return (
            f"{hook}.?matchConditions.orValue([]).filter(c, "
            f"!(c.name == '{CONDITION}' && {hook}.name in {entries}) && !(c.name in {retired}))"
        )

    same_fields = " && ".join(f"w.?{f} == o.?{f}" for f in _WEBHOOK_FIELDS)
    old_ann = "oldObject.metadata.?annotations.orValue({})"
    new_ann = "object.metadata.?annotations.orValue({})"
    key = f"'{UNJUDGED_ANNOTATION}'"
    checks = [
        (
            "object.webhooks.size() == oldObject.webhooks.size() && object.webhooks.all(w, "
            f"oldObject.webhooks.exists(o, o.name == w.name && {same_fields} "
            f"&& {others('w')} == {others('o')}))",
            f"may change no webhook but the {CONDITION} condition of {', '.join(LABEL_ENTRIES)}",
        ),
        (
            "object.webhooks.all(w, w.?matchConditions.orValue([]).all(c, "
            f'c.name != \'{CONDITION}\' || c.expression.matches(r"""{SHAPE}""")))',
            f"may write the {CONDITION} condition only in its generated shape",
        ),
        (
            f"object.webhooks.all(w, w.?matchConditions.orValue([]).all(c, !(c.name in {retired}) "
            "|| oldObject.webhooks.exists(o, o.name == w.name && "
            "o.?matchConditions.orValue([]).exists(d, d == c))))",
            f"may remove the {', '.join(RETIRED)} condition, never add or change it",
        ),
        (
            f"{new_ann}.all(k, k == {key} || ({old_ann}.exists(j, j == k) && {new_ann}[k] == "
            f"{old_ann}[k])) && {old_ann}.all(k, k == {key} || {new_ann}.exists(j, j == k)) "
            f'&& (!({key} in {new_ann}) || {new_ann}[{key}].matches(r"""{ANNOTATION_SHAPE}"""))',
            f"may change no annotation but {UNJUDGED_ANNOTATION}, a JSON list of resources",
        ),
        (
            "object.metadata.?labels == oldObject.metadata.?labels "
            "&& object.metadata.?ownerReferences == oldObject.metadata.?ownerReferences "
            "&& object.metadata.?finalizers == oldObject.metadata.?finalizers",
            "may change no label, owner reference or finalizer",
        ),
    ]
    # The others compare with oldObject, which only an update has.
    return [("request.operation == 'UPDATE'", "may only update it")] + [
        (f"request.operation != 'UPDATE' || ({expression})", message)
        for expression, message in checks
    ]


def registration_guard() -> list[dict[str, Any]]:
    """The policy holding the compiler, on any webhook registration (its RBAC names one), to the
    ``skip-unjudged`` conditions and the unjudged annotation (``app.compiled.registration``): a
    compromised compiler cannot turn the webhook off."""
    who = f"'the compiler ({COMPILER}) '"
    return _guard(
        REGISTRATION_GUARD,
        [
            {
                "apiGroups": ["admissionregistration.k8s.io"],
                "apiVersions": ["*"],
                "operations": list(OPERATIONS),
                "resources": ["validatingwebhookconfigurations"],
            }
        ],
        matchConditions=[
            {"name": "the-compiler", "expression": f"request.userInfo.username == '{COMPILER}'"}
        ],
        validations=[
            {
                "expression": expression,
                "messageExpression": f"{who} + 'may not change ' + request.name + ': it {message}'",
                "reason": "Forbidden",
            }
            for expression, message in _registration_checks()
        ],
    )


def manifests() -> list[dict[str, Any]]:
    """``manifests/compiled/policy.yaml``: the enforcing policy's binding, then the guards. The
    policy itself is the compiler's to write (``PolicyWriter``): it holds the
    ClusterRoleBindings' part, which changes with them."""
    return [binding(POLICY), *guard(), *registration_guard()]


def mode_manifests() -> list[dict[str, Any]]:
    """``manifests/compiled/modes/policy.yaml``: the warn and audit policies' bindings (the
    compiler run with ``--compile-softened`` writes the policies).

    Optional: each policy bound costs the API server its own evaluation on every write it
    matches. Without them a denial that a mode softens is allowed, as by the webhook, but
    without the policy's warning or audit annotation.
    """
    return [binding(name) for name in ACTIONS if name != POLICY]


def shipped_webhook() -> dict[str, Any]:
    """manifests/deploy/webhook.yaml, as shipped."""
    config: dict[str, Any] = yaml.safe_load(WEBHOOK_YAML.read_text())
    return config


# What ``python -m app.compiled.admission_policy [FLAG]`` prints: the file it generates.
FILES = {
    "": ("manifests/compiled/policy.yaml", manifests),
    "--modes": ("manifests/compiled/modes/policy.yaml", mode_manifests),
    "--webhook": (
        "manifests/compiled/split/webhook.yaml",
        lambda: [webhook_patch(shipped_webhook())],
    ),
    "--split": ("manifests/compiled/split/policy.yaml", subresource_policy),
}


def render_yaml(flag: str = "") -> str:
    """The file ``python -m app.compiled.admission_policy FLAG`` prints (``FILES``)."""
    _, documents = FILES[flag]
    header = (
        f"# Generated by `python -m app.compiled.admission_policy{' ' + flag if flag else ''}` "
        "from app/compiled/admission_policy.py: edit that.\n"
    )
    return header + yaml.dump_all(documents(), Dumper=_Plain, sort_keys=False, width=100)


class _Plain(yaml.SafeDumper):
    """YAML without anchors: a copied entry reads as the API server will store it."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


if __name__ == "__main__":
    print(render_yaml(sys.argv[1] if len(sys.argv) > 1 else ""), end="")
