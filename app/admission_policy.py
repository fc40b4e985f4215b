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

Cost: every lookup is by key (resource, operation, user, each group), so the time does not grow
with the bindings of a namespace; label values are matched against RE2 patterns built from globs
of at most 63 characters; attacker-controlled labels are read once per requirement of each role
granting the request.

Only the compiler may write the parameters: ``label-rbac-params`` refuses everyone else
(``COMPILER``); and ``label-rbac-registration`` holds the compiler, on the webhook registration,
to the conditions and annotation it keeps there (``app.coverage``).
``python -m app.admission_policy [--modes]`` prints ``manifests/compiled/policy.yaml``
(``manifests/compiled/modes/policy.yaml``).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import yaml

from app.coverage import ANNOTATION_SHAPE, CONDITION, LABEL_ENTRIES, SHAPE
from app.engine.context import UNJUDGED_ANNOTATION
from app.engine.model import AUDIT, ENFORCE, WARN
from app.engine.params import API_VERSION, KIND, NAME, WEBHOOK_RESOURCES

POLICY = "label-rbac"
# Per policy: the mode of the denials it judges and the binding's validation action.
ACTIONS: Mapping[str, tuple[str, str]] = {
    POLICY: (ENFORCE, "Deny"),
    f"{POLICY}-warn": (WARN, "Warn"),
    f"{POLICY}-audit": (AUDIT, "Audit"),
}
OPERATIONS = ("CREATE", "UPDATE", "DELETE")
SUPERUSERS = "system:masters"
# The compiler's identity (manifests/compiled/rbac.yaml): the one writer of parameters.
COMPILER = "system:serviceaccount:label-rbac:label-rbac-compiler"
GUARD = f"{POLICY}-params"
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


def _lookup(field: str, subject: str, operation: str = "variables.op") -> str:
    """Grant ids of one subject; the optional chain stays inline (a variable holding an optional
    would lose ``?.`` semantics)."""
    return f"params.spec.?rules[?variables.key][?{operation}].?{field}[?{subject}].orValue([])"


def _ids(operation: str = "variables.op") -> str:
    """The user's grant ids in the webhook's order: the namespace's bindings (user, then each
    group), then the cluster's."""
    groups = "request.userInfo.groups.map(g, {}).flatten()"
    return " + ".join(
        (
            _lookup("users", "request.userInfo.username", operation),
            groups.format(_lookup("groups", "g", operation)),
            _lookup("clusterUsers", "request.userInfo.username", operation),
            groups.format(_lookup("clusterGroups", "g", operation)),
        )
    )


def _permitted(labels: str) -> str:
    """Whether a grant's requirements all permit the label set ``labels`` (a variable)."""
    return f"g.labels.all(r, {_requirement(labels)})"


def _requirement(labels: str) -> str:
    return (
        f"r.key in {labels} ? ({labels}[r.key] in r.exact || "
        f"r.patterns.exists(p, {labels}[r.key].matches(p))) : params.spec.allowUnlabeled"
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
    ("requested", "request.?name.orValue('')"),
    (
        "key",
        "request.requestResource.resource + (request.requestResource.group == '' ? '' : "
        "'.' + request.requestResource.group)",
    ),
    (
        "op",
        "request.operation == 'DELETE' && variables.requested == '' ? 'DELETECOLLECTION' : "
        "request.operation",
    ),
    ("delegated", "has(params.spec.delegated)"),
    ("indexed", "params.spec.?rules[?variables.key].hasValue()"),
    ("found", f"({_ids()}).map(id, params.spec.grants[id])"),
    (
        # A rule with resourceNames grants a create only to a user who may also update or patch
        # that name (a PUT or an apply creating it): model.authorizations.
        "granting",
        "variables.op != 'CREATE' ? "
        "variables.found.filter(g, !has(g.names) || variables.requested in g.names) : "
        "variables.found.filter(g, !has(g.names)) + "
        "(variables.found.exists(g, has(g.names) && variables.requested in g.names) && "
        f"({_ids(repr('UPDATE'))}).map(id, params.spec.grants[id])"
        ".exists(g, !has(g.names) || variables.requested in g.names) ? "
        "variables.found.filter(g, has(g.names) && variables.requested in g.names) : [])",
    ),
    ("roles", "variables.granting.map(g, g.role)"),
    (
        # Each role once, where it first appears (a role bound twice is one grant).
        "applicable",
        "variables.granting.transformList(i, g, variables.roles.indexOf(g.role) == i, g)",
    ),
    ("unrestricted", "variables.applicable.exists(g, has(g.unrestricted))"),
    ("restricted", "variables.applicable.filter(g, has(g.labels))"),
    ("invalid", "variables.applicable.filter(g, has(g.invalid))"),
    (
        "newLabels",
        "variables.op == 'CREATE' || variables.op == 'UPDATE' ? "
        "object.metadata.?labels.orValue({}) : {}",
    ),
    (
        "oldLabels",
        "variables.op == 'CREATE' ? {} : oldObject.metadata.?labels.orValue({})",
    ),
    (
        "oldOk",
        "variables.op == 'CREATE' || "
        f"variables.restricted.exists(g, {_permitted('variables.oldLabels')})",
    ),
    (
        "newOk",
        "variables.op != 'CREATE' && variables.op != 'UPDATE' || "
        f"variables.restricted.exists(g, {_permitted('variables.newLabels')})",
    ),
    (
        "denied",
        "!variables.delegated && variables.applicable.size() > 0 && !variables.unrestricted && "
        "(variables.restricted.size() == 0 || !variables.oldOk || !variables.newOk)",
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
        "variables.invalid.map(g, g.invalid).join('; ')",
    ),
    (
        "message",
        "variables.restricted.size() == 0 ? variables.who + ': ' + variables.broken : "
        "variables.who + ': ' + (!variables.oldOk ? "
        f"{_violation('variables.oldLabels', True)} : "
        f"{_violation('variables.newLabels', False)}) + "
        "' (' + variables.restricted.map(g, g.allows).join('; ') + "
        "(variables.invalid.size() > 0 ? '; ' + variables.broken : '') + ')'",
    ),
    (
        # Authorized by RBAC for an indexed resource, yet unknown to the parameters: they are
        # older than the binding. Asked only in that case (variables are evaluated lazily).
        "unlisted",
        "!variables.delegated && variables.indexed && variables.applicable.size() == 0 && "
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


def _validations(mode: str) -> list[dict[str, Any]]:
    judged = {
        "expression": f"!(variables.denied && variables.mode == '{mode}')",
        "messageExpression": "variables.message",
        "reason": "Forbidden",
    }
    if mode != ENFORCE:
        # Nothing softened in the namespace (the usual case): one field read and done.
        judged["expression"] = (
            f"!has(params.spec.softened) || !(variables.denied && variables.mode == '{mode}')"
        )
        return [judged]
    stale = {
        "expression": "!variables.unlisted",
        "messageExpression": (
            "variables.who + ': the compiled label permissions of namespace \"' + "
            "request.namespace + '\" do not list this user yet; retry in a moment'"
        ),
        "reason": "Forbidden",
    }
    return [stale, judged]


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
                    _rule(API_VERSION.split("/")[0], "*"),
                    *(_rule(group, resource) for group, resource in sorted(WEBHOOK_RESOURCES)),
                ],
            },
            # Kubelets are judged by the webhook's node rules.
            "matchConditions": [
                {"name": "not-a-node", "expression": f"!('{NODES}' in request.userInfo.groups)"}
            ],
            "variables": [{"name": n, "expression": e} for n, e in VARIABLES],
            "validations": _validations(mode),
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


def guard() -> list[dict[str, Any]]:
    """The policy and binding letting only the compiler write parameters (no parameters read:
    it holds when there are none yet)."""
    group = API_VERSION.split("/")[0]
    labels = {"app.kubernetes.io/name": "label-rbac"}
    return [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": GUARD, "labels": labels},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": [group],
                            "apiVersions": ["*"],
                            "operations": list(OPERATIONS),
                            "resources": ["labelrbacparams", "labelrbacparams/status"],
                        }
                    ]
                },
                "validations": [
                    {
                        "expression": f"request.userInfo.username == '{COMPILER}'",
                        "messageExpression": (
                            "'user \"' + request.userInfo.username + '\" may not write the "
                            "compiled label permissions: only the compiler (" + COMPILER + ") does'"
                        ),
                        "reason": "Forbidden",
                    }
                ],
            },
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": GUARD, "labels": labels},
            "spec": {"policyName": GUARD, "validationActions": ["Deny"]},
        },
    ]


def _registration_checks() -> list[tuple[str, str]]:
    """(expression, message) pairs: the compiler's update of the webhook registration changes
    nothing but the ``skip-unjudged`` conditions of the label-rule entries, in their generated
    shape, and the unjudged annotation."""
    entries = "[" + ", ".join(f"'{e}'" for e in LABEL_ENTRIES) + "]"

    def others(hook: str) -> str:  # the conditions the compiler does not own
        return (
            f"{hook}.?matchConditions.orValue([]).filter(c, "
            f"!(c.name == '{CONDITION}' && {hook}.name in {entries}))"
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
    """The policy and binding holding the compiler, on any webhook registration (its RBAC names
    one), to the ``skip-unjudged`` conditions and the unjudged annotation (``app.coverage``): a
    compromised compiler cannot turn the webhook off."""
    labels = {"app.kubernetes.io/name": "label-rbac"}
    who = f"'the compiler ({COMPILER}) '"
    return [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": REGISTRATION_GUARD, "labels": labels},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": ["admissionregistration.k8s.io"],
                            "apiVersions": ["*"],
                            "operations": list(OPERATIONS),
                            "resources": ["validatingwebhookconfigurations"],
                        }
                    ]
                },
                "matchConditions": [
                    {
                        "name": "the-compiler",
                        "expression": f"request.userInfo.username == '{COMPILER}'",
                    }
                ],
                "validations": [
                    {
                        "expression": expression,
                        "messageExpression": (
                            f"{who} + 'may not change ' + request.name + ': it {message}'"
                        ),
                        "reason": "Forbidden",
                    }
                    for expression, message in _registration_checks()
                ],
            },
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": REGISTRATION_GUARD, "labels": labels},
            "spec": {"policyName": REGISTRATION_GUARD, "validationActions": ["Deny"]},
        },
    ]


def manifests() -> list[dict[str, Any]]:
    """``manifests/compiled/policy.yaml``: the enforcing policy and binding, then the guard."""
    return [policy(POLICY), binding(POLICY), *guard(), *registration_guard()]


def mode_manifests() -> list[dict[str, Any]]:
    """``manifests/compiled/modes/policy.yaml``: the warn and audit policies and bindings.

    Optional: each policy bound costs the API server its own evaluation on every write it
    matches. Without them a denial that a mode softens is allowed, as by the webhook, but
    without the policy's warning or audit annotation.
    """
    soft = [name for name in ACTIONS if name != POLICY]
    return [policy(name) for name in soft] + [binding(name) for name in soft]


def render_yaml(modes: bool = False) -> str:
    """The file ``manifests()`` (or, with ``modes``, ``mode_manifests()``) makes."""
    flag = " --modes" if modes else ""
    header = (
        f"# Generated by `python -m app.admission_policy{flag}` from app/admission_policy.py: "
        "edit that.\n"
    )
    documents = mode_manifests() if modes else manifests()
    return header + yaml.safe_dump_all(documents, sort_keys=False, width=100)


if __name__ == "__main__":
    print(render_yaml("--modes" in sys.argv), end="")
