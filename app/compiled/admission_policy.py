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

- ``parameterNotFoundAction: Deny``: a namespace the compiler has not rendered yet (just created,
  or the compiler is down) refuses the writes the policy matches, rather than letting a new
  restriction go unenforced;
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
request.

Only the compiler may write the parameters: ``label-rbac-params`` refuses everyone else
(``COMPILER``); ``label-rbac-marks`` holds it, on Namespaces, to the compiled mark; and
``label-rbac-registration`` holds it, on the webhook registration, to the conditions and
annotation it keeps there (``app.compiled.registration``). ``python -m app.compiled.admission_policy
[--modes | --webhook]`` prints the files it generates (``FILES``).
"""

from __future__ import annotations

import copy
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from app.compiled.registration import (
    ANNOTATION_SHAPE,
    COMPILED_ENTRY,
    CONDITION,
    LABEL_ENTRIES,
    LEFT_SHAPE,
    NODE,
    OPERATIONS,
    POLICY_CONDITION,
    SHAPE,
    left_expression,
)
from app.engine.context import UNJUDGED_ANNOTATION
from app.engine.model import AUDIT, ENFORCE, WARN
from app.engine.params import API_VERSION, DEFAULT, KIND, MARK, NAME, WEBHOOK_RESOURCES

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
# The namespaces label-rbac judges, as manifests/deploy/webhook.yaml selects them: never its own
# (a broken rollout stays repairable) or kube-system, and not those opted out.
JUDGED: Mapping[str, Any] = {
    "matchExpressions": [
        {
            "key": "kubernetes.io/metadata.name",
            "operator": "NotIn",
            "values": ["label-rbac", "kube-system"],
        },
        {"key": "labelrbac.io/exempt", "operator": "NotIn", "values": ["true"]},
    ]
}
# The webhook's label-rule entry (the split adds ``COMPILED_ENTRY`` for compiled namespaces).
LABEL_ENTRY = "labels.labelrbac.io"
WEBHOOK_YAML = Path(__file__).resolve().parents[2] / "manifests" / "deploy" / "webhook.yaml"


def _role_ids() -> str:
    """The ids of the roles bound to the user, in the webhook's order: the namespace's bindings
    (the user, then each group), then the cluster's. The optional chains stay inline (a variable
    holding an optional would lose ``?.`` semantics)."""
    user = "params.spec.?{}[?request.userInfo.username].orValue([])"
    groups = "request.userInfo.groups.map(g, params.spec.?{}[?g].orValue([])).flatten()"
    return " + ".join(
        (
            user.format("users"),
            groups.format("groups"),
            user.format("clusterUsers"),
            groups.format("clusterGroups"),
        )
    )


def _grants(entries: str, operation: str) -> str:
    """The grants of the user's roles (their ``entries``) for ``operation`` of the resource."""
    return f"{entries}.filter(m, {operation} in m).map(m, params.spec.grants[m[{operation}]])"


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


def _entries(key: str) -> str:
    """Per role bound to the user: operation → grant id for the requested resource (a role's
    DEFAULT entry covers the indexed resources it does not name)."""
    return (
        f"({_role_ids()}).map(r, params.spec.roles[r][?{key}]"
        f".orValue(params.spec.roles[r][?'{DEFAULT}'].orValue({{}})))"
    )


def _granting(entries: str, found: str, op: str, requested: str) -> str:
    """The grants that grant the request. A rule with resourceNames grants a create only to a
    user who may also update or patch that name (a PUT or an apply creating it):
    model.authorizations."""
    return (
        f"{op} != 'CREATE' ? "
        f"{found}.filter(g, !has(g.names) || {requested} in g.names) : "
        f"{found}.filter(g, !has(g.names)) + "
        f"({found}.exists(g, has(g.names) && {requested} in g.names) && "
        f"{_grants(entries, repr('UPDATE'))}.exists(g, !has(g.names) || {requested} in g.names) ? "
        f"{found}.filter(g, has(g.names) && {requested} in g.names) : [])"
    )


def _bound_granting() -> str:
    """``granting`` in one program: the request's parts bound, not read from variables."""
    granting = _granting("entries", "found", "op", "requested")
    found = _bind("found", _grants("entries", "op"), granting)
    indexed = f"!({_indexed('key')}) ? [] : " + _bind("entries", _entries("key"), found)
    return _bind(
        "requested", _REQUESTED, _bind("op", _op("requested"), _bind("key", _KEY, indexed))
    )


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
    value = f"{labels}[r.key]"
    return (
        f"r.key in {labels} ? ({value} in r.exact || "
        f"r.prefixes.exists(p, {value}.startsWith(p)) || "
        f"r.suffixes.exists(s, {value}.endsWith(s)) || "
        f"r.patterns.exists(p, {value}.matches(p))) : params.spec.allowUnlabeled"
    )


def _violation(labels: str, existing: bool) -> str:
    """The first requirement of the first restricted role that ``labels`` fails, in words."""
    first = f"variables.restricted[0].labels.filter(r, !({_requirement(labels)}))[0]"
    if existing:
        present = (
            "\"the existing object's label \" + v.key + '=\"' + {l}[v.key] + '\" is not permitted'"
        )
        missing = "'the existing object has no label ' + v.key"
    else:
        present = "'label ' + v.key + '=\"' + {l}[v.key] + '\" is not permitted'"
        missing = "'missing label ' + v.key"
    return f"[{first}].map(v, v.key in {labels} ? {present.format(l=labels)} : {missing})[0]"


VARIABLES: tuple[tuple[str, str], ...] = (
    # The name in the URL; a collection delete's objects reach admission without one.
    ("requested", _REQUESTED),
    ("key", _KEY),
    ("op", _op("variables.requested")),
    ("delegated", "has(params.spec.delegated)"),
    ("marked", f"namespaceObject.metadata.?labels[?'{MARK}'].orValue('') == 'true'"),
    ("indexed", _indexed("variables.key")),
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
        "variables.invalid.size() > 0 || variables.restricted.exists(g, g.mode == 'enforce') ? "
        "(params.spec.mode) : variables.restricted.exists(g, g.mode == 'warn') ? "
        "(params.spec.mode == 'audit' ? 'audit' : 'warn') : 'audit'",
    ),
    (
        "name",
        "variables.requested != '' ? variables.requested : oldObject != null ? "
        "oldObject.metadata.?name.orValue('') : object.metadata.?name.orValue('')",
    ),
    (
        "who",
        "'user \"' + request.userInfo.username + '\" may not ' + "
        "{'CREATE': 'create', 'UPDATE': 'update', 'DELETE': 'delete', "
        "'DELETECOLLECTION': 'deletecollection'}[variables.op] + ' ' + variables.key + "
        "(variables.name != '' ? ' \"' + variables.name + '\"' : '') + "
        "(request.namespace != '' ? ' in namespace \"' + request.namespace + '\"' : '')",
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
)


_VARIABLE = re.compile(r"\bvariables\.([A-Za-z]+)\b")
_DEFINITIONS = dict(VARIABLES)


def _inline(expression: str, bound: frozenset[str] = frozenset()) -> str:
    """``expression`` with each variable it reads spelled out (those in ``bound`` read by their
    bare name, bound by ``_bind``): a match condition may not read variables."""

    def spelled(found: re.Match[str]) -> str:
        name = found.group(1)
        return name if name in bound else f"({_inline(_DEFINITIONS[name], bound)})"

    return _VARIABLE.sub(spelled, expression)


def _refusals(mode: str) -> str:
    """CEL: the refusals of the policy bound with ``mode`` that read the granting roles."""
    judged = f"variables.denied && variables.mode == '{mode}'"
    return f"variables.unlisted || {judged}" if mode == ENFORCE else judged


def _allowed(mode: str) -> str:
    """CEL: the validation of the policy bound with ``mode``: whether it lets the write pass."""
    if mode != ENFORCE:
        return f"!({_refusals(mode)})"
    # A namespace marked compiled is not sent to the webhook for what this policy matches, so
    # the policy may not stand aside there: parameters delegated under the mark (the compiler
    # removes it first, so only during that hop or when someone else set it) refuse.
    return f"!({_UNJUDGED}) && !({_refusals(mode)})"


def _may_refuse(mode: str) -> str:
    """CEL: the policy's match condition, variables spelled out: whether ``_allowed`` may be
    false. Kubelets are never refused (the webhook's node rules judge them); ``granting`` is
    computed once, after the checks that do not need it. A match condition cannot see the
    namespace, so delegated parameters match and the validation reads the namespace's mark."""
    granting = frozenset({"granting"})
    refused = _bind("granting", _inline("variables.granting"), _inline(_refusals(mode), granting))
    if mode != ENFORCE:
        # Nothing softened in the namespace (the usual case): one field read and done.
        return f"has(params.spec.softened) && !({_NODE}) && {refused}"
    return f"!({_NODE}) && (has(params.spec.delegated) || {refused})"


# Parameters delegated in a namespace marked compiled (see ``_allowed``).
_UNJUDGED = "variables.delegated && variables.marked"


def _message(mode: str) -> str:
    """CEL: the message of a refusal, saying which check failed. A message may not ask the
    authorizer (``unlisted`` does): once refused, no grant means the user is unlisted, a grant
    that the labels failed."""
    if mode == WARN:  # the warning the webhook gives (``decide.apply_mode``)
        return f"variables.message + ' (not enforced: {WARN} mode)'"
    if mode != ENFORCE:
        return "variables.message"
    unjudged = (
        "variables.who + ': namespace \"' + request.namespace + '\" is labeled "
        f"{MARK}=true, which leaves its writes to the compiled policy, but it is too large "
        "to compile; the compiler removes the label in a moment (or: kubectl label namespace "
        f"' + request.namespace + ' {MARK}-)'"
    )
    stale = (
        "variables.who + ': the compiled label permissions of namespace \"' + "
        "request.namespace + '\" do not list this user yet; retry in a moment'"
    )
    return (
        f"{_UNJUDGED} ? {unjudged} : variables.granting.size() == 0 ? {stale} : variables.message"
    )


def _judgement(mode: str) -> dict[str, Any]:
    """The policy's match condition and validation.

    The API server evaluates a policy in passes, each a context of its own that computes again
    the variables it reads: the match conditions, the validations, then every messageExpression
    and audit annotation whether the validation failed or not. The condition matches only the
    writes the policy may refuse, so a write it allows costs one pass; a refused one is judged
    again by the validation and its message built.
    """
    return {
        "matchConditions": [{"name": "may-refuse", "expression": _may_refuse(mode)}],
        "validations": [
            {
                "expression": _allowed(mode),
                "messageExpression": _message(mode),
                "reason": "Forbidden",
            }
        ],
    }


# A kubelet, as the policy and the split webhook entry both say it.
_NODE = NODE


def left_to_webhook() -> str:
    """CEL: the condition of the webhook entry for compiled namespaces as shipped: whatever the
    compiled policy does not judge (the complement of its match, generated from the same
    constants as ``policy()``'s ``matchConstraints`` and the kubelets its validations let pass),
    and every plain write too, until the compiler lists the resources every namespace's
    parameters index (``app.compiled.registration.left_expression``). So every request in such a
    namespace is
    judged by one of them, and a resource the parameters do not index by the webhook."""
    return left_expression(())


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
    match, so in the compiled entry, which every write of a compiled namespace reaches, fewer
    programs cost less (bench vap ``split``)."""
    if len(conditions) < 2:
        return [dict(c) for c in conditions]
    expression = " && ".join(f"({c['expression']})" for c in conditions)
    return [{"name": SHIPPED_SKIPS, "expression": expression}]


def webhook_patch(config: Mapping[str, Any]) -> dict[str, Any]:
    """The patch splitting the webhook's label rule (``manifests/compiled/split/webhook.yaml``).

    ``config`` is the shipped ValidatingWebhookConfiguration: its label-rule entry keeps the
    namespaces not marked compiled, and a copy of it, failing closed, takes the marked ones for
    what the policy does not judge (``left_to_webhook``), its own skips as one condition.
    """
    (labels,) = [w for w in config["webhooks"] if w["name"] == LABEL_ENTRY]
    if labels.get("namespaceSelector") != JUDGED:
        raise ValueError(f"{LABEL_ENTRY} selects other namespaces than the policy ({JUDGED})")
    compiled = copy.deepcopy(labels)
    compiled.update(name=COMPILED_ENTRY, failurePolicy="Fail", namespaceSelector=_marked("In"))
    compiled["matchConditions"] = [
        *_all_of(labels.get("matchConditions", [])),
        {"name": POLICY_CONDITION, "expression": left_to_webhook()},
    ]
    return {
        "apiVersion": config["apiVersion"],
        "kind": config["kind"],
        "metadata": {"name": config["metadata"]["name"]},
        "webhooks": [{"name": LABEL_ENTRY, "namespaceSelector": _marked("NotIn")}, compiled],
    }


def _rule(group: str, resource: str) -> dict[str, Any]:
    return {
        "apiGroups": [group],
        "apiVersions": ["*"],
        "operations": ["*"],
        "resources": [resource],
    }


def policy(name: str) -> dict[str, Any]:
    mode, _ = ACTIONS[name]
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "label-rbac"}},
        "spec": {
            "failurePolicy": "Fail",
            "paramKind": {"apiVersion": API_VERSION, "kind": KIND},
            "matchConstraints": {
                "namespaceSelector": copy.deepcopy(JUDGED),
                "resourceRules": [
                    {
                        "apiGroups": ["*"],
                        "apiVersions": ["*"],
                        "operations": list(OPERATIONS),
                        "resources": ["*"],
                        "scope": "Namespaced",
                    }
                ],
                # The compiler's own objects, so it can write parameters where there are none
                # yet, and what the webhook keeps (app.engine.params.WEBHOOK_RESOURCES).
                "excludeResourceRules": [
                    _rule(GROUP, "*"),
                    *(_rule(group, resource) for group, resource in sorted(WEBHOOK_RESOURCES)),
                ],
            },
            "variables": [{"name": n, "expression": e} for n, e in VARIABLES],
            **_judgement(mode),
        },
    }


def binding(name: str) -> dict[str, Any]:
    _, action = ACTIONS[name]
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "label-rbac"}},
        "spec": {
            "policyName": name,
            "validationActions": [action],
            "paramRef": {"name": NAME, "parameterNotFoundAction": "Deny"},
        },
    }


def _guard(name: str, rules: list[dict[str, Any]], **spec: Any) -> list[dict[str, Any]]:
    """A policy of this component's (no parameters read), bound to deny."""
    labels = {"app.kubernetes.io/name": "label-rbac"}
    return [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name, "labels": labels},
            "spec": {"failurePolicy": "Fail", "matchConstraints": {"resourceRules": rules}, **spec},
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


def _unchanged(field: str, but: str = "") -> str:
    """CEL: the metadata map ``field`` is the same before and after, but for the key ``but``."""
    new, old = (f"{o}.metadata.?{field}.orValue({{}})" for o in ("object", "oldObject"))
    skip = f"k == '{but}' || " if but else ""
    return f"{new}.all(k, {skip}{old}[?k] == {new}[?k]) && {old}.all(k, {skip}k in {new})"


def guard() -> list[dict[str, Any]]:
    """The policies keeping the compiler to what it is for (they hold when there are no
    parameters yet): only it writes parameters (``GUARD``; the namespace controller deletes them
    from a namespace being deleted); on a Namespace it writes, it changes
    nothing but the compiled mark, to ``true`` or away (``MARKS``)."""
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
        [_rule("", "namespaces") | {"operations": ["*"]}],
        matchConditions=[
            {"name": "the-compiler", "expression": f"request.userInfo.username == '{COMPILER}'"}
        ],
        validations=[
            {
                "expression": (
                    "request.operation == 'UPDATE' && "
                    f"object.metadata.?labels[?'{MARK}'].orValue('true') == 'true' && "
                    f"{_unchanged('labels', but=MARK)} && {_unchanged('annotations')} && "
                    "object.spec == oldObject.spec && "
                    "object.metadata.?finalizers == oldObject.metadata.?finalizers"
                ),
                "message": (
                    f"the compiler may change nothing on a Namespace but its label {MARK}=true"
                ),
                "reason": "Forbidden",
            }
        ],
    )
    return parameters + marks


def _registration_checks() -> list[tuple[str, str]]:
    """(expression, message) pairs: the compiler's update of the webhook registration changes
    nothing but the ``skip-unjudged`` conditions of the label-rule entries and the
    ``left-by-the-policy`` condition of the compiled entry, in their generated shapes, and the
    unjudged annotation."""
    entries = "[" + ", ".join(f"'{e}'" for e in LABEL_ENTRIES) + "]"

    def others(hook: str) -> str:  # the conditions the compiler does not own
        return (
            f"{hook}.?matchConditions.orValue([]).filter(c, "
            f"!(c.name == '{CONDITION}' && {hook}.name in {entries}) && "
            f"!(c.name == '{POLICY_CONDITION}' && {hook}.name == '{COMPILED_ENTRY}'))"
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
            f"may change no webhook but the {CONDITION} condition of {', '.join(LABEL_ENTRIES)} "
            f"and the {POLICY_CONDITION} condition of {COMPILED_ENTRY}",
        ),
        (
            "object.webhooks.all(w, w.?matchConditions.orValue([]).all(c, "
            f'c.name != \'{CONDITION}\' || c.expression.matches(r"""{SHAPE}""")))',
            f"may write the {CONDITION} condition only in its generated shape",
        ),
        (
            f"object.webhooks.all(w, w.name != '{COMPILED_ENTRY}' || "
            "w.?matchConditions.orValue([]).all(c, "
            f'c.name != \'{POLICY_CONDITION}\' || c.expression.matches(r"""{LEFT_SHAPE}""")))',
            f"may write the {POLICY_CONDITION} condition only in its generated shape",
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
    """``manifests/compiled/policy.yaml``: the enforcing policy and binding, then the guards."""
    return [policy(POLICY), binding(POLICY), *guard(), *registration_guard()]


def mode_manifests() -> list[dict[str, Any]]:
    """``manifests/compiled/modes/policy.yaml``: the warn and audit policies and bindings.

    Optional: each policy bound costs the API server its own evaluation on every write it
    matches. Without them a denial that a mode softens is allowed, as by the webhook, but
    without the policy's warning or audit annotation.
    """
    soft = [name for name in ACTIONS if name != POLICY]
    return [policy(name) for name in soft] + [binding(name) for name in soft]


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
