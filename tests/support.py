"""Helpers shared by the test suites: the recorded fixtures and small object builders."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.engine.kinds import snapshot_from_objects
from app.engine.model import Resource
from app.engine.placement import DEFAULT_PLACEMENT_KEY
from app.engine.policy import DEFAULT_ANNOTATION_KEY
from app.engine.rbac import MODE_ANNOTATION, Compiler, Snapshot
from app.settings import Settings
from app.source.static import StaticSource
from app.webhook.server import create_app

if TYPE_CHECKING:
    from flask.testing import FlaskClient

ROOT = Path(__file__).resolve().parent.parent
# The recorded kube-apiserver traffic lives beside the repository (../shared/fixtures).
FIXTURES = Path(
    os.environ.get(
        "LABEL_RBAC_FIXTURES", ROOT.parent / "shared" / "fixtures" / "kube-apiserver-v1.24"
    )
)
REVIEWS = FIXTURES / "admission-reviews"
API = FIXTURES / "api"
# The same recordings from a current API server (server-side apply, real deletecollection...).
RECENT = FIXTURES.parent / "kube-apiserver-v1.35"


def load_review(name: str, fixtures: Path = FIXTURES) -> dict[str, Any]:
    """One recorded AdmissionReview by file stem, e.g. ``a003-create-mwan3policies``."""
    return json.loads((fixtures / "admission-reviews" / f"{name}.json").read_text())


# Every character Python's ``re`` counts as whitespace or a line end, and a few more that look
# like nothing: what a validator must not let through around a valid text.
WHITESPACE = ["\n", "\r", "\r\n", " ", "\t", "\x0b", "\x0c", "\x1c", "\x85", "\xa0", "\u2028",
              "\u3000", "\ufeff", "\x00"]  # fmt: skip


def meta(name: str, namespace: str = "", **extra: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"name": name, **extra}
    if namespace:
        data["namespace"] = namespace
    return data


def role(
    name: str,
    namespace: str = "",
    rules: list[dict[str, Any]] | None = None,
    permissions: Any = None,
    annotation_key: str = DEFAULT_ANNOTATION_KEY,
    mode: str | None = None,
    placement: Any = None,
) -> tuple[str, dict[str, Any]]:
    """A Role (namespace given) or ClusterRole, with an optional permission annotation,
    enforcement mode (``labelrbac.io/mode``) and placement (``labelrbac.io/placement``)."""
    annotations = {}
    if permissions is not None:
        annotations[annotation_key] = (
            permissions if isinstance(permissions, str) else json.dumps(permissions)
        )
    if placement is not None:
        annotations[DEFAULT_PLACEMENT_KEY] = (
            placement if isinstance(placement, str) else json.dumps(placement)
        )
    if mode is not None:
        annotations[MODE_ANNOTATION] = mode
    kind = "Role" if namespace else "ClusterRole"
    obj = {
        "kind": kind,
        "metadata": meta(name, namespace, annotations=annotations),
        "rules": rules or [],
    }
    return kind, obj


def rule(verbs: str, resources: str, groups: str = "", names: str = "") -> dict[str, Any]:
    """A PolicyRule from space-separated lists (``rule("create update", "configmaps")``)."""
    data: dict[str, Any] = {
        "verbs": verbs.split(),
        "resources": resources.split(),
        "apiGroups": groups.split() or [""],
    }
    if names:
        data["resourceNames"] = names.split()
    return data


def binding(
    name: str, role_name: str, *subjects: str, namespace: str = "", role_kind: str | None = None
) -> tuple[str, dict[str, Any]]:
    """A RoleBinding (namespace given) or ClusterRoleBinding.

    Subjects are ``User:alice``, ``Group:tenants`` or ``ServiceAccount:ns:name``.
    """
    parsed = []
    for text in subjects:
        kind, _, rest = text.partition(":")
        if kind == "ServiceAccount":
            ns, _, sa = rest.partition(":")
            parsed.append({"kind": kind, "name": sa, "namespace": ns})
        else:
            parsed.append({"kind": kind, "name": rest, "apiGroup": "rbac.authorization.k8s.io"})
    kind = "RoleBinding" if namespace else "ClusterRoleBinding"
    ref_kind = role_kind or ("Role" if namespace else "ClusterRole")
    return kind, {
        "kind": kind,
        "metadata": meta(name, namespace),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": ref_kind, "name": role_name},
        "subjects": parsed,
    }


def snapshot(
    *objects: tuple[str, dict[str, Any]],
    default_label_key: str | None = None,
    annotation_keys: tuple[str, ...] = (DEFAULT_ANNOTATION_KEY,),
) -> Snapshot:
    return snapshot_from_objects(objects, Compiler(annotation_keys, default_label_key))


def make_review(
    user: str,
    operation: str,
    resource: str,
    *,
    groups: tuple[str, ...] = (),
    namespace: str = "",
    name: str = "obj",
    labels: dict[str, str] | None = None,
    old_labels: dict[str, str] | None = None,
    kind: str = "",
    api_version: str = "admission.k8s.io/v1",
    uid: str = "0f0e0d0c-0000-4000-8000-000000000001",
    extra_object: dict[str, Any] | None = None,
    request_resource: str = "",
    dry_run: bool = False,
    user_extra: dict[str, list[str]] | None = None,
    object_metadata: dict[str, Any] | None = None,
    old_metadata: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """An AdmissionReview as the API server would send it (``resource`` is ``res[.group][/sub]``).

    ``labels`` builds ``object`` (omitted for DELETE); ``old_labels`` builds ``oldObject``;
    ``object_metadata``/``old_metadata`` add fields to their metadata (``ownerReferences``...).
    ``request_resource`` is what the client asked for when the API server converted the request
    to ``resource`` (``matchPolicy: Equivalent``); by default the same, as the API server sends.
    """
    base, _, sub = resource.partition("/")
    res, _, group = base.partition(".")

    def obj(obj_labels: dict[str, str], extra: dict[str, Any] | None) -> dict[str, Any]:
        metadata: dict[str, Any] = {"name": name, "labels": obj_labels, **(extra or {})}
        if namespace:
            metadata["namespace"] = namespace
        return {
            "apiVersion": "v1",
            "kind": kind or "Object",
            "metadata": metadata,
            **(extra_object or {}),
        }

    request: dict[str, Any] = {
        "uid": uid,
        "kind": {"group": group, "version": "v1", "kind": kind or "Object"},
        "resource": {"group": group, "version": "v1", "resource": res},
        "operation": operation,
        "userInfo": {"username": user, "groups": [*groups, "system:authenticated"]},
        "name": name,
        "object": None if labels is None else obj(labels, object_metadata),
        "oldObject": None if old_labels is None else obj(old_labels, old_metadata),
        "dryRun": False,
    }
    if sub:
        request["subResource"] = sub
    req_base, _, req_sub = (request_resource or resource).partition("/")
    req_res, _, req_group = req_base.partition(".")
    request["requestKind"] = {"group": req_group, "version": "v1", "kind": kind or "Object"}
    request["requestResource"] = {"group": req_group, "version": "v1", "resource": req_res}
    if req_sub:
        request["requestSubResource"] = req_sub
    if dry_run:
        request["dryRun"] = True
    if user_extra:
        request["userInfo"]["extra"] = user_extra
    if namespace:
        request["namespace"] = namespace
    return {"apiVersion": api_version, "kind": "AdmissionReview", "request": request}


# An owner reference naming a uid that does not exist: the garbage collector deletes what it owns.
GHOST_OWNER = {
    "apiVersion": "v1",
    "kind": "ConfigMap",
    "name": "ghost",
    "uid": "00000000-0000-4000-8000-000000000000",
}


# The v1.35 recording: SubjectAccessReviews to an authorization webhook, and AdmissionReviews.
V135 = FIXTURES.parent / "kube-apiserver-v1.35"
ACCESS_REVIEWS = V135 / "subject-access-reviews"
V135_REVIEWS = V135 / "admission-reviews"
# The recording's RBAC, written from its README.
V135_RBAC = ROOT / "tests" / "scenarios" / "v135-rbac.yaml"


def load_access_review(name: str) -> dict[str, Any]:
    """One recorded SubjectAccessReview by file stem, e.g. ``c005-tenant-list-configmaps``."""
    return json.loads((ACCESS_REVIEWS / f"{name}.json").read_text())


def make_access_review(
    user: str,
    verb: str,
    resource: str,
    *,
    groups: tuple[str, ...] = (),
    namespace: str = "",
    name: str = "",
    version: str = "v1",
    selector: list[tuple[str, str, list[str]]] | None = None,
    raw_selector: str | None = None,
    api_version: str = "authorization.k8s.io/v1",
) -> dict[str, Any]:
    """A SubjectAccessReview as the API server sends it (``resource`` is ``res[.group][/sub]``).

    ``selector`` is the parsed label selector as ``(key, operator, values)`` requirements;
    ``raw_selector`` is what the server sends instead when it could not parse one.
    """
    parsed = Resource.parse(resource)
    attributes: dict[str, Any] = {"verb": verb, "resource": parsed.resource, "version": version}
    for key, value in (
        ("group", parsed.group),
        ("subresource", parsed.subresource),
        ("namespace", namespace),
        ("name", name),
    ):
        if value:
            attributes[key] = value
    if selector is not None or raw_selector is not None:
        label_selector: dict[str, Any] = {}
        if selector is not None:
            label_selector["requirements"] = [
                {"key": k, "operator": op, **({"values": v} if v else {})} for k, op, v in selector
            ]
        if raw_selector is not None:
            label_selector["rawSelector"] = raw_selector
        attributes["labelSelector"] = label_selector
    all_groups = [*groups, "system:authenticated"]
    spec: dict[str, Any] = {"user": user, "uid": user, "resourceAttributes": attributes}
    spec["group" if api_version.endswith("v1beta1") else "groups"] = all_groups
    return {
        "apiVersion": api_version,
        "kind": "SubjectAccessReview",
        "metadata": {},
        "spec": spec,
        "status": {"allowed": False},
    }


BASE_UNITS = ("seconds", "bytes", "ratio", "info")
NON_BASE_UNITS = {"milliseconds", "microseconds", "minutes", "hours", "kilobytes", "megabytes",
                  "percent", "ms", "sec", "mb", "kb"}  # fmt: skip


def lint_metric_family(family: Any) -> list[str]:
    """Prometheus naming conventions, as ``promtool check metrics`` checks them."""
    problems: list[str] = []
    name = family.name
    if name.endswith("_created"):
        return problems  # prometheus_client's own creation timestamps (single-process only)
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        problems.append(f"{name}: not snake_case")
    if not name.startswith(("label_rbac_", "process_")):
        problems.append(f"{name}: no label_rbac_ namespace")
    if not family.documentation:
        problems.append(f"{name}: no help")
    if re.search(r"_(counter|gauge|histogram|summary|total)$", name):
        problems.append(f"{name}: type in the name")
    if NON_BASE_UNITS.intersection(name.split("_")):
        problems.append(f"{name}: not a base unit")
    for unit in BASE_UNITS:
        if f"_{unit}_" in f"{name}_" and not name.endswith(f"_{unit}"):
            problems.append(f"{name}: unit {unit} not at the end")
    for sample in family.samples:
        if family.type == "counter" and not sample.name.endswith(("_total", "_created")):
            problems.append(f"{sample.name}: counter without _total")
        for label in sample.labels:
            if not re.fullmatch(r"[a-z][a-z0-9_]*", label):
                problems.append(f"{sample.name}: label {label}")
    return problems


def pod(
    name: str,
    node: str = "node1",
    namespace: str = "t1",
    uid: str = "",
    annotations: dict[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """A Pod as the API server stores it: bound to ``node`` (empty: unscheduled), ``spec`` extra."""
    metadata = meta(name, namespace, uid=uid or f"uid-{namespace}-{name}-{node}")
    if annotations:
        metadata["annotations"] = annotations
    body: dict[str, Any] = {"containers": [{"name": "c", "image": "nginx"}], **spec}
    if node:
        body["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": body}


def persistent_volume(
    name: str, claim: str = "", namespace: str = "t1", **spec: Any
) -> dict[str, Any]:
    """A PersistentVolume, bound to claim ``namespace/claim`` when ``claim`` is given."""
    body: dict[str, Any] = dict(spec)
    if claim:
        body["claimRef"] = {"kind": "PersistentVolumeClaim", "namespace": namespace, "name": claim}
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": meta(name), "spec": body}


@contextmanager
def served(
    directory: Path,
    objects: Iterable[Mapping[str, Any]] = (),
    source: type[StaticSource] = StaticSource,
) -> Iterator[FlaskClient]:
    """The webhook over the RBAC manifests in ``directory`` (``objects`` written there first, as
    one ``List``), served to a Flask test client; ``source`` may answer lookups too."""
    if objects:
        (directory / "rbac.json").write_text(json.dumps({"kind": "List", "items": list(objects)}))
    settings = Settings(rbac_dir=directory)
    running = source(directory, settings.compiler)
    running.start()
    app = create_app(settings, running)
    app.config["TESTING"] = True
    try:
        yield app.test_client()
    finally:
        running.stop()
