"""``check``: one decision explained, as the webhooks would answer it. A write (flags, ``-f``
manifests or an AdmissionReview) goes through the admission pipeline; a read or an identity loan
(flags or a SubjectAccessReview) through the authorization pipeline."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from app import deepjson
from app.cli.inputs import CliError, Loaded, load_rbac, policy_settings
from app.engine.authorize import READ_CHECKS, authorize
from app.engine.context import Context, ObjectRef
from app.engine.decide import POST_CHECKS, evaluate
from app.engine.kinds import GRAPH_KINDS
from app.engine.model import (
    AUTHORIZED_VERBS,
    SERVICE_ACCOUNT_PREFIX,
    Access,
    AccessDecision,
    Decision,
    Request,
    Resource,
    UserInfo,
    Verdict,
)
from app.engine.nodeauthz import check_node_read
from app.engine.nodegraph import NodeGraph
from app.settings import Settings
from app.source.static import parse_manifests
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
    """The objects of ``-f FILE`` (``-`` is stdin)."""
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


def _resource_of(kind: str, obj: Mapping[str, Any], loaded: Loaded) -> Resource:
    """The resource a manifest's kind is served as: by discovery against a cluster."""
    from app.cli.audit import group_of, plural
    from app.source.api import KubeError
    from app.source.listing import discover

    group = group_of(obj)
    if loaded.client is not None:
        try:
            resources = discover(loaded.client)
        except KubeError as exc:
            raise CliError(f"cannot read API discovery at {loaded.where}: {exc}") from None
        for found in resources:
            if found.kind == kind and found.group == group:
                return found.as_resource
    return Resource(group, plural(kind))


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
    return args.verb in AUTHORIZED_VERBS


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


def _cmd_check_read(args: argparse.Namespace, settings: Settings, loaded: Loaded) -> int:
    """Explain a read as the authorization webhook answers it."""
    from app.cli.audit import dump

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
        decision = AccessDecision.no_opinion("NonResource", "non-resource requests are RBAC's")
    else:
        decision = authorize(review.access, ctx, checks)
    if args.output != "text":
        data = {
            "verdict": decision.verdict.value,
            "reason": decision.reason,
            "message": decision.message,
            "explanation": list(decision.explanation),
        }
        print(dump(data, args.output), end="")
    else:
        words = {"Allow": "allowed", "Deny": "denied", "NoOpinion": "no opinion"}
        detail = decision.message or (
            "RBAC decides" if decision.verdict is Verdict.NO_OPINION else ""
        )
        print(
            f"{words[decision.verdict.value]} ({decision.reason}){': ' if detail else ''}{detail}"
        )
        for line in decision.explanation:
            print(f"  - {line}")
    return 1 if decision.verdict is Verdict.DENY else 0


def _requests(args: argparse.Namespace, loaded: Loaded) -> list[Request]:
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
    labels = dict(args.label)
    operation = OPERATION_FOR_VERB[verb]
    user = impersonated(args.user, args.group)
    if args.filename:
        targets = _manifest(args.filename)
    else:
        targets = [("", {"metadata": {"name": args.name, "labels": labels}})]
    requests = []
    for kind, obj in targets:
        meta = obj.get("metadata") or {}
        resource = args.resource or _resource_of(kind, obj, loaded)
        # A collection delete reaches admission as one DELETE per object, naming none.
        name = "" if verb == "deletecollection" else args.name or str(meta.get("name") or "")
        requests.append(
            Request(
                uid="cli",
                operation=operation,
                user=user,
                resource=resource,
                kind=kind,
                namespace=args.namespace or str(meta.get("namespace") or ""),
                name=name,
                object=None if operation == "DELETE" else obj,
                old_object=obj if operation in ("UPDATE", "DELETE") else None,
            )
        )
    return requests


def _decision_dict(request: Request, decision: Decision) -> dict[str, Any]:
    return {
        "resource": str(request.resource),
        "namespace": request.namespace,
        "name": request.name,
        "allowed": decision.allowed,
        "mode": decision.mode,
        "reason": decision.reason,
        "code": decision.code,
        "message": decision.message,
        "explanation": list(decision.explanation),
        "warnings": list(decision.warnings),
    }


def _print_decision(decision: Decision) -> None:
    if decision.softened:
        print(
            f"allowed in {decision.mode} mode, would be denied ({decision.reason}): "
            f"{decision.message}"
        )
    elif decision.allowed:
        print(f"allowed ({decision.reason})")
    else:
        print(f"denied ({decision.code} {decision.reason}): {decision.message}")
    for line in decision.explanation:
        print(f"  - {line}")
    for warning in decision.warnings:
        print(f"  warning: {warning}")


def cmd_check(args: argparse.Namespace) -> int:
    from app.cli.audit import dump

    settings = policy_settings(args)
    loaded = load_rbac(args, settings)
    if _is_read(args):
        return _cmd_check_read(args, settings, loaded)
    requests = _requests(args, loaded)
    ctx = Context(loaded.snapshot, settings.engine_options, loaded.lookup, loaded.metadata)
    # Flags describe only the object's labels: what a write makes controllers do (its pod
    # template, selector, references) is judged for a whole object, from -f or --review.
    whole = bool(args.review or args.filename)
    results = [
        (request, evaluate(request, ctx, post_checks=POST_CHECKS if whole else ()))
        for request in requests
    ]
    if args.output == "text":
        for request, decision in results:
            if len(results) > 1:  # several objects from -f: say which one each answer is for
                print(f"{request.describe()}:")
            _print_decision(decision)
    else:
        data = [_decision_dict(r, d) for r, d in results]
        print(dump(data[0] if len(data) == 1 else data, args.output), end="")
    return 0 if all(d.allowed for _, d in results) else 1
