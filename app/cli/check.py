"""``check``: one decision explained, as the webhooks would answer it. A write (flags, ``-f``
manifests or an AdmissionReview) goes through the admission pipeline; a read or an identity loan
(flags or a SubjectAccessReview) through the authorization pipeline, and so does any verb no
label permission narrows (``bind``, ``use``, a custom verb), which then RBAC alone answers.

The question is asked with flags or, as ``kubectl auth can-i`` asks it, positionally
(``check create configmaps NAME``: ``_from_words``); ``--list`` lists what the user may do
(``app.engine.rules``)."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from app import deepjson
from app.cli.inputs import (
    CliError,
    Loaded,
    context_namespace,
    known,
    load_rbac,
    policy_settings,
    served,
    verb_arg,
)
from app.engine.authorize import READ_CHECKS, authorize
from app.engine.catalog import ApiKind, Catalog
from app.engine.context import Check, Context, ObjectRef
from app.engine.decide import POST_CHECKS, PRE_CHECKS, apply_mode, evaluate
from app.engine.kinds import GRAPH_KINDS
from app.engine.labels import check_labels, find_grants, request_grants
from app.engine.model import (
    AUTHORIZED_VERBS,
    COLLECTION_VERBS,
    ENFORCE,
    SERVICE_ACCOUNT_PREFIX,
    Access,
    Request,
    Resource,
    UserInfo,
    Verdict,
)
from app.engine.nodeauthz import check_node_read
from app.engine.nodegraph import NodeGraph
from app.engine.rbac import Snapshot
from app.engine.rules import SUPERUSERS, allowances
from app.engine.selectors import parse_selector
from app.settings import Settings
from app.source.static import parse_manifests, read_manifests
from app.webhook.wire import ReviewError, parse_review
from app.webhook.wire_sar import AccessReview, parse_access_review

OPERATION_FOR_VERB = {
    "create": "CREATE",
    "update": "UPDATE",
    "patch": "UPDATE",
    "delete": "DELETE",
    "deletecollection": "DELETE",
    "connect": "CONNECT",
}


def _manifest(path: str) -> list[tuple[str, Mapping[str, Any]]]:
    """The objects of ``-f FILE`` (``-`` is stdin), or of every manifest in ``-f DIR``."""
    if path != "-" and Path(path).is_dir():
        try:
            objects = [(k, o) for k, o in read_manifests(Path(path)) if k]
        except OSError as exc:
            raise CliError(f"-f {path}: {exc.strerror or exc}") from None
    else:
        try:
            data = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
        except OSError as exc:
            raise CliError(f"-f {path}: {exc.strerror or exc}") from None
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CliError(f"-f {path}: not UTF-8 text (byte {exc.start})") from None
        objects = [(k, o) for k, o in parse_manifests(text, f"-f {path}") if k]
    if not objects:
        raise CliError(f"-f {path}: no Kubernetes object in it")
    return objects


def _kind_of(kind: str, obj: Mapping[str, Any], catalog: Catalog) -> ApiKind:
    """The served resource of a manifest's kind, or an error naming the resources close to it."""
    from app.cli.audit import group_of, plural

    group = group_of(obj)
    found = catalog.of_kind(group, kind)
    if found is not None:
        return found
    api_version = obj.get("apiVersion") or "v1"
    return known(catalog, Resource(group, plural(kind)), f"kind {kind} of {api_version}")


AUTHENTICATED, UNAUTHENTICATED, ANONYMOUS = (
    "system:authenticated",
    "system:unauthenticated",
    "system:anonymous",
)


def impersonated(username: str, groups: Sequence[str]) -> UserInfo:
    """The identity ``--as``/``--as-group`` stand for, as the API server completes it when
    impersonating: a service account without groups gets its default groups, and everyone
    ``system:authenticated`` (``system:unauthenticated`` for ``system:anonymous``)."""
    found = list(groups)
    if not found and username.startswith(SERVICE_ACCOUNT_PREFIX):
        namespace = username[len(SERVICE_ACCOUNT_PREFIX) :].partition(":")[0]
        found = ["system:serviceaccounts", f"system:serviceaccounts:{namespace}"]
    if username != ANONYMOUS:
        if AUTHENTICATED not in found and UNAUTHENTICATED not in found:
            found.append(AUTHENTICATED)
    elif UNAUTHENTICATED not in found:
        found.append(UNAUTHENTICATED)
    return UserInfo(username, tuple(found))


def _review_document(path: Path) -> Any:
    deepjson.prepare()  # a review may be nested as deep as the API server allows
    try:
        return deepjson.loads(path.read_bytes().decode("utf-8"))
    except OSError as exc:
        raise CliError(f"--review {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise CliError(f"--review {path}: not JSON: {exc}") from None


def _is_read(args: argparse.Namespace) -> bool:
    """A SubjectAccessReview file, or a read or identity loan asked with flags: decided by the
    authorization pipeline."""
    if args.review:
        document = _review_document(args.review)
        return isinstance(document, Mapping) and document.get("kind") == "SubjectAccessReview"
    if args.verb == "deletecollection":
        return args.selector is not None
    # A verb admission never sees (``bind``, ``escalate``, ``use``, a custom verb) is the
    # authorizers' alone: the webhook's (which has no opinion on it), then RBAC's.
    return args.verb in AUTHORIZED_VERBS or (
        args.verb is not None and args.verb not in OPERATION_FOR_VERB
    )


def _access(args: argparse.Namespace) -> AccessReview:
    if args.review:
        try:
            return parse_access_review(_review_document(args.review))
        except ReviewError as exc:
            raise CliError(f"--review {args.review}: {exc}") from None
    if not args.user or args.resource is None:
        raise CliError("--as USER and --resource are required (or --review FILE)")
    access = Access(
        impersonated(args.user, args.group),
        args.verb,
        args.resource,
        "v1",  # the version kubectl asks for of every built-in resource label-rbac restricts
        args.namespace,
        args.name,
        labels=args.selector,
    )
    return AccessReview("authorization.k8s.io/v1", access, None)


def _node_graph(loaded: Loaded) -> NodeGraph:
    """The node graph of the directory's Pods, PVs and VolumeAttachments, or the cluster's."""
    if loaded.client is None:
        return NodeGraph.from_objects(loaded.objects)
    from app.source.api import KubeError, object_path

    objects: list[tuple[str, Mapping[str, Any]]] = []
    for spec in GRAPH_KINDS:
        path = object_path(spec.group, spec.version, spec.resource)
        try:
            items, _ = loaded.client.list(path, 500, (10.0, 60.0))
        except KubeError as exc:
            raise CliError(f"could not list {spec.resource} for the node graph: {exc}") from None
        objects += [(spec.kind, item) for item in items]
    return NodeGraph.from_objects(objects)


def _rbac_refusal(snapshot: Snapshot, access: Access) -> str | None:
    """Why RBAC refuses ``access`` (no bound role grants it), or None: the API server asks the
    webhook only about requests RBAC lets through, so the webhook's answer alone is not the
    cluster's. ``system:masters`` passes every authorizer, as in the API server."""
    if SUPERUSERS in access.user.groups:
        return None
    # A create (a POST) and a collection delete name no object to RBAC.
    name = "" if access.verb in ("create", "deletecollection") else access.name
    grants = find_grants(
        snapshot, access.user, access.namespace, (access.verb,), access.resource, name
    )
    if grants.any:
        return None
    where = f' in namespace "{access.namespace}"' if access.namespace else ""
    return (
        f'RBAC refuses it: no role bound to "{access.user.username}" grants {access.verb} on '
        f"{access.resource}{where}"
    )


def _answer(
    access: Access, allowed: bool, reason: str, message: str = "", **more: Any
) -> dict[str, Any]:
    """One decision, the same shape whatever was asked (flags, -f, AdmissionReview or
    SubjectAccessReview)."""
    return {
        "user": access.user.username,
        "groups": list(access.user.groups),
        "verb": access.verb,
        "resource": str(access.resource),
        "namespace": access.namespace,
        "name": access.name,
        "allowed": allowed,
        "reason": reason,
        "code": 200 if allowed else more.get("code", 403),
        "mode": more.get("mode", ENFORCE),
        "message": message,
        "explanation": list(more.get("explanation", ())),
        "warnings": list(more.get("warnings", ())),
        "violations": list(more.get("violations", [message] if not allowed else [])),
    }


def _refused(access: Access, refusal: str, explanation: Sequence[str]) -> dict[str, Any]:
    return _answer(access, False, "NoGrantingRole", refusal, explanation=explanation)


def _read_answer(args: argparse.Namespace, settings: Settings, loaded: Loaded) -> dict[str, Any]:
    """A read as the cluster answers it: the authorization webhook, then RBAC."""
    review = _access(args)
    metadata = loaded.metadata
    if args.label:  # -l states the named object's labels, instead of reading them
        labels = dict(args.label)

        def metadata(ref: ObjectRef) -> Mapping[str, Any]:
            return {"metadata": {"name": ref.name, "labels": labels}}

    graph = _node_graph(loaded) if args.node_authorizer else None
    ctx = Context(loaded.snapshot, settings.engine_options, loaded.lookup, metadata, graph)
    checks = (check_node_read, *READ_CHECKS) if args.node_authorizer else READ_CHECKS
    if review.access is None:
        raise CliError(
            f"--review {args.review}: a non-resource request is RBAC's alone; "
            "ask kubectl auth can-i"
        )
    access = review.access
    decision = authorize(access, ctx, checks)
    explanation = list(decision.explanation)
    if decision.verdict is Verdict.DENY:
        return _answer(access, False, decision.reason, decision.message, explanation=explanation)
    if decision.verdict is Verdict.NO_OPINION:  # RBAC decides
        refusal = _rbac_refusal(loaded.snapshot, access)
        if refusal is not None:
            return _refused(access, refusal, explanation)
    return _answer(access, True, decision.reason, explanation=explanation)


def _requests(args: argparse.Namespace, loaded: Loaded, catalog: Catalog) -> list[Request]:
    if args.review:
        document = _review_document(args.review)
        try:
            return [parse_review(document).request]
        except ReviewError as exc:
            raise CliError(f"--review {args.review}: {exc}") from None
    if not args.user:
        raise CliError("--as USER is required (or --review FILE)")
    verb = args.verb or ("create" if args.filename else None)
    if verb is None or (args.resource is None and not args.filename):
        raise CliError("--verb and --resource are required (or -f FILE, or --review FILE)")
    operation = OPERATION_FOR_VERB[verb]
    user = impersonated(args.user, args.group)
    if args.filename:
        targets = _manifest(args.filename)
    else:
        labels = dict(args.label)
        targets = [("", {"metadata": {"name": args.name, "labels": labels}})]
    requests = []
    fallback: tuple[str, str] | None = None
    for kind, obj in targets:
        meta = obj.get("metadata") or {}
        served = known(catalog, args.resource, "--resource") if args.resource else None
        served = served or _kind_of(kind, obj, catalog)
        namespace = str(meta.get("namespace") or "") if served.namespaced else ""
        if served.namespaced and not namespace:
            fallback = fallback or _default_namespace(args)
            namespace = fallback[0]
        # A collection delete reaches admission as one DELETE per object, naming none.
        name = "" if verb == "deletecollection" else args.name or str(meta.get("name") or "")
        requests.append(
            Request(
                uid="cli",
                operation=operation,
                user=user,
                resource=args.resource or served.as_resource,
                kind=kind,
                namespace=args.namespace if served.namespaced and args.namespace else namespace,
                name=name,
                object=None if operation == "DELETE" else obj,
                old_object=obj if operation in ("UPDATE", "DELETE") else None,
            )
        )
    if fallback is not None and not args.namespace:  # -n says it already
        print(
            f'check: an object names no namespace: judged in "{fallback[0]}" ({fallback[1]})',
            file=sys.stderr,
        )
    return requests


def _default_namespace(args: argparse.Namespace) -> tuple[str, str]:
    """The namespace kubectl would create a namespaced object in, and where it came from."""
    if args.namespace:
        return args.namespace, "-n"
    namespace = context_namespace(args)
    if namespace:
        return namespace, "the kubeconfig context's namespace"
    return "default", "no -n and no namespace in the kubeconfig context"


def _violations(request: Request, ctx: Context, post_checks: Sequence[Check]) -> list[str]:
    """Every enforced denial of the request, not only the first the pipeline stops at."""
    found = []
    for check in (*PRE_CHECKS, check_labels, *post_checks):
        decision = check(request, ctx)
        if decision is not None and not apply_mode(decision, ctx.options.mode).allowed:
            found.append(decision.message)
    return list(dict.fromkeys(found))


def _write_answer(
    request: Request, ctx: Context, post_checks: Sequence[Check], flags_verb: str | None
) -> dict[str, Any]:
    """A write as the cluster answers it: RBAC, then the admission webhook."""
    verb = flags_verb or request.verb
    access = Access(
        request.user, verb, request.authorized_resource, "v1", request.namespace, request.name
    )
    if flags_verb in (None, "connect"):
        # A review (or a CONNECT, whose HTTP method picks the verb) passed RBAC on some grant
        # of each authorization the API server made.
        granted = any(g.any for g in request_grants(request, ctx.snapshot))
        refusal = (
            None
            if granted or SUPERUSERS in request.user.groups
            else _rbac_refusal(ctx.snapshot, access)
        )
    else:
        refusal = _rbac_refusal(ctx.snapshot, access)
    if refusal is not None:
        return _refused(access, refusal, ())
    decision = evaluate(request, ctx, post_checks=tuple(post_checks))
    violations = [] if decision.allowed else _violations(request, ctx, post_checks)
    return _answer(
        access,
        decision.allowed,
        decision.reason,
        decision.message,
        code=decision.code,
        mode=decision.mode,
        explanation=decision.explanation,
        warnings=decision.warnings,
        violations=violations,
    )


def _print_answer(answer: Mapping[str, Any]) -> None:
    if answer["allowed"] and answer["mode"] != ENFORCE:
        print(
            f"allowed in {answer['mode']} mode, would be denied ({answer['reason']}): "
            f"{answer['message']}"
        )
    elif answer["allowed"]:
        print(f"allowed ({answer['reason']})")
    else:
        print(f"denied ({answer['code']} {answer['reason']}): {answer['message']}")
    for line in answer["explanation"]:
        print(f"  - {line}")
    for more in answer["violations"][1:]:
        print(f"  also denied: {more}")
    for warning in answer["warnings"]:
        print(f"  warning: {warning}")


def answers(
    args: argparse.Namespace, settings: Settings, loaded: Loaded, catalog: Catalog
) -> list[dict[str, Any]]:
    """The cluster's answer to what ``args`` ask, one per object (see ``_answer``)."""
    args = _asked(args, catalog)
    if args.resource is not None:
        known(catalog, args.resource, "--resource")
    if _is_read(args):
        return [_read_answer(args, settings, loaded)]
    requests = _requests(args, loaded, catalog)
    ctx = Context(loaded.snapshot, settings.engine_options, loaded.lookup, loaded.metadata)
    # Flags describe only the object's labels: what a write makes controllers do (its pod
    # template, selector, references) is judged for a whole object, from -f or --review.
    post = POST_CHECKS if args.review or args.filename else ()
    verb = None if args.review else (args.verb or "create")
    return [_write_answer(request, ctx, post, verb) for request in requests]


def _asked(args: argparse.Namespace, catalog: Catalog) -> argparse.Namespace:
    """The flags ``args`` stand for: the positional words as ``--verb``, ``--resource`` and
    ``--name``, ``-A`` as no namespace, and ``-l`` of a collection verb as its selector."""
    args = argparse.Namespace(**vars(args))
    if args.request:
        _from_words(args, catalog)
    elif args.subresource:
        raise CliError("--subresource goes with the positional form: check VERB RESOURCE")
    if args.all_namespaces:
        if args.namespace:
            raise CliError("-n and -A (--all-namespaces) ask different questions: give one")
        args.namespace = ""
    if args.label and args.verb in COLLECTION_VERBS:
        # What kubectl -l gives a list; an object's labels are its selector's equalities.
        if args.selector is not None:
            raise CliError("-l and --selector both give the selector of a list: give one")
        args.selector = parse_selector(",".join(f"{k}={v}" for k, v in args.label))
    return args


def _from_words(args: argparse.Namespace, catalog: Catalog) -> None:
    """``VERB RESOURCE[/NAME]`` or ``VERB RESOURCE NAME``, as ``kubectl auth can-i`` reads
    them: the resource typed as kubectl resolves it (``cm``, ``configmap``, ``deploy``,
    ``deployments.v1.apps``), a namespaced one asked in ``-n`` or the context's namespace."""
    words = args.request
    if args.verb or args.resource or args.name or args.review or args.filename:
        raise CliError(
            "give VERB RESOURCE[/NAME] or --verb/--resource/--name/-f/--review, not both"
        )
    if len(words) not in (2, 3):
        raise CliError(
            f"expected VERB RESOURCE[/NAME] or VERB RESOURCE NAME, as kubectl auth can-i takes "
            f"them; got {len(words)} word{'s' if len(words) != 1 else ''}: {' '.join(words)}"
        )
    try:
        verb = verb_arg(words[0])
    except argparse.ArgumentTypeError as exc:
        raise CliError(str(exc)) from None
    typed, slash, name = words[1].partition("/")
    if len(words) == 3:
        if slash:
            raise CliError(f"give the name once: {words[1]} or {typed} {words[2]}")
        name = words[2]
    if (slash and not name) or "/" in name:
        raise CliError(f"invalid name {name!r}: an object's name has no '/'")
    kind = _resolve(catalog, typed)
    args.verb, args.name = verb, name
    args.resource = Resource(kind.group, kind.resource, args.subresource or "")
    if kind.namespaced and not args.namespace and not args.all_namespaces:
        args.namespace = _default_namespace(args)[0]


def _resolve(catalog: Catalog, typed: str) -> ApiKind:
    """The served resource ``typed`` names as ``kubectl auth can-i`` resolves it: lower-cased,
    ``res.version.group`` first when it has the dots for it, then ``res.group``."""
    text = typed.lower()
    if not _TYPED.fullmatch(text):
        raise CliError(
            f"invalid resource {typed!r}: expected RESOURCE[.GROUP], e.g. configmaps, cm or "
            "deployments.apps"
        )
    base, _, group = text.partition(".")
    tries = [Resource(group, base)]
    version, dot, rest = group.partition(".")
    if dot and version.startswith("v") and version[1:2].isdigit():
        tries.insert(0, Resource(rest, base))
    for asked in tries:
        found = catalog.resolve(asked)
        if len(found) > 1:
            named = " or ".join(str(k.as_resource) for k in found)
            raise CliError(f"resource {typed!r} is ambiguous: say which, {named}")
        if found:
            return found[0]
    return known(catalog, tries[-1], "RESOURCE")


_TYPED = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-.a-z0-9]*[a-z0-9])?)?")


def cmd_check(args: argparse.Namespace) -> int:
    from app.cli.audit import dump

    settings = policy_settings(args)
    loaded = load_rbac(args, settings)
    if args.list:
        return _list(args, settings, loaded)
    found = answers(args, settings, loaded, served(loaded))
    if args.quiet:  # the exit status is the answer
        return 0 if all(a["allowed"] for a in found) else 1
    if args.output == "text":
        for answer in found:
            if len(found) > 1:  # several objects from -f: say which one each answer is for
                print(f"{_describe(answer)}:")
            _print_answer(answer)
    else:
        print(dump(found[0] if len(found) == 1 else found, args.output), end="")
    return 0 if all(a["allowed"] for a in found) else 1


def _list(args: argparse.Namespace, settings: Settings, loaded: Loaded) -> int:
    """``--list``: every rule the user holds in the namespace, with its label limits."""
    from app.cli.audit import dump, table
    from app.engine.reverse import binding_dict, labels_dict, role_dict

    asked = (args.request, args.verb, args.resource, args.name, args.filename, args.review)
    if any(asked) or args.label or args.selector is not None:
        raise CliError("--list takes no question: only --as, --as-group and -n (or -A)")
    if args.quiet:
        raise CliError("--list and -q (--quiet) do not go together: --list prints a list")
    if not args.user:
        raise CliError("--list needs --as USER")
    if args.all_namespaces and args.namespace:
        raise CliError("-n and -A (--all-namespaces) ask different questions: give one")
    namespace = "" if args.all_namespaces else _default_namespace(args)[0]
    user = impersonated(args.user, args.group)
    rows = allowances(loaded.snapshot, user, namespace, settings.engine_options.reads_unrestricted)
    if args.output == "text":
        cells = [
            [a.resource, f"[{' '.join(a.names)}]", f"[{' '.join(a.verbs)}]", a.limits,
             str(a.role) if a.role else SUPERUSERS]
            for a in rows
        ]  # fmt: skip
        print(table(["RESOURCES", "RESOURCE NAMES", "VERBS", "LABELS", "THROUGH"], cells), end="")
        return 0
    data = {
        "user": user.username,
        "groups": list(user.groups),
        "namespace": namespace,
        "rules": [
            {
                "resource": a.resource,
                "resourceNames": list(a.names),
                "verbs": list(a.verbs),
                "labelScoped": a.scoped,
                "labels": labels_dict(a.entries) if a.scoped and a.error is None else None,
                "limits": a.limits,
                "mode": a.mode,
                "role": role_dict(a.role) if a.role else None,
                "binding": binding_dict(a.binding) if a.binding else None,
            }
            for a in rows
        ],
    }
    print(dump(data, args.output), end="")
    return 0


def _describe(answer: Mapping[str, Any]) -> str:
    text = str(answer["resource"])
    if answer["name"]:
        text += f' "{answer["name"]}"'
    if answer["namespace"]:
        text += f' in namespace "{answer["namespace"]}"'
    return text
