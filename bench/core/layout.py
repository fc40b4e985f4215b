"""The synthetic RBAC layout of the scale, churn, traffic and HTTP benchmarks.

About N objects: per tenant namespace a Namespace, three Roles (one with an annotation shared by
every namespace, one with its own, one without) and four RoleBindings with users, groups and
service accounts; cluster-wide, ClusterRoles with wildcard annotations and their bindings.
Written as YAML files, like a cluster's exported RBAC (``write_dir``), or as JSON lists.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

PER_NAMESPACE = 8  # a Namespace, three Roles, four RoleBindings
ANNOTATION = "labelrbac.io/permissions"
SHARED = json.dumps({"configmaps": {"team": ["a", "b"]}, "secrets": {"team": ["a"]},
                     "deployments.apps": {"team": ["a", "b"]}})  # fmt: skip
DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def layout(objects: int) -> tuple[int, int]:
    """(namespaces, cluster roles) for about ``objects`` objects: one ClusterRole and one
    ClusterRoleBinding per 500 objects, the rest namespaces of eight objects each."""
    cluster_roles = max(2, objects // 500)
    return max(1, (objects - 2 * cluster_roles) // PER_NAMESPACE), cluster_roles


def namespace_objects(i: int, cluster_roles: int) -> list[dict[str, Any]]:
    ns = f"tenant-{i}"
    own = json.dumps({"configmaps": {"team": [f"t{i}-*"]}, "pods": {"team": [f"t{i}-*"]}})
    rules = [{"apiGroups": ["", "apps"], "resources": ["configmaps", "secrets", "pods",
                                                       "deployments"], "verbs": ["*"]}]  # fmt: skip
    read = [{"apiGroups": [""], "resources": ["configmaps", "pods"],
             "verbs": ["get", "list", "watch"]}]  # fmt: skip

    def role(name: str, annotation: str | None, role_rules: list[Any]) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": name, "namespace": ns}
        if annotation is not None:
            meta["annotations"] = {ANNOTATION: annotation}
        return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta,
                "rules": role_rules}  # fmt: skip

    def binding(name: str, ref_kind: str, ref: str, subjects: list[Any]) -> dict[str, Any]:
        return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": {"name": name, "namespace": ns},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": ref_kind,
                            "name": ref},
                "subjects": subjects}  # fmt: skip

    users = [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": f"user-{i}-{u}"}
             for u in range(6)]  # fmt: skip
    groups = [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": f"team-{i}-{g}"}
              for g in range(3)]  # fmt: skip
    accounts = [{"kind": "ServiceAccount", "name": f"sa-{s}", "namespace": ns} for s in range(4)]
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        role("team-shared", SHARED, rules),
        role("team-own", own, rules),
        role("reader", None, read),
        binding("team-shared", "Role", "team-shared", users[:3] + groups[:1]),
        binding("team-own", "Role", "team-own", users[3:] + groups[1:]),
        binding("reader", "Role", "reader", accounts + groups),
        binding("platform", "ClusterRole", f"platform-{i % cluster_roles}", users[:1] + accounts),
    ]


def cluster_objects(cluster_roles: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for c in range(cluster_roles):
        annotation = json.dumps({"*": {"team": ["*"]}, f"crd{c}-*.example.com": {"env": ["prod-*"]},
                                 "configmaps": {"team": ["*-a", "*-b"]}})  # fmt: skip
        meta = {"name": f"platform-{c}", "annotations": {ANNOTATION: annotation}}
        rules = [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]
        out.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                    "metadata": meta, "rules": rules})  # fmt: skip
        out.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                    "metadata": {"name": f"platform-{c}"},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                "name": f"platform-{c}"},
                    "subjects": [{"kind": "Group", "name": f"platform-{c}"},
                                 {"kind": "User", "name": f"operator-{c}"}]})  # fmt: skip
    return out


def write_dir(directory: Path, objects: int, per_file: int = 100) -> int:
    """Write about ``objects`` objects as YAML files of ``per_file`` namespaces; the count."""
    namespaces, cluster_roles = layout(objects)
    directory.mkdir(parents=True, exist_ok=True)
    docs = cluster_objects(cluster_roles)
    count = len(docs)
    (directory / "cluster.yaml").write_text(yaml.dump_all(docs, Dumper=DUMPER))
    for start in range(0, namespaces, per_file):
        docs = [o for i in range(start, min(start + per_file, namespaces))
                for o in namespace_objects(i, cluster_roles)]  # fmt: skip
        count += len(docs)
        (directory / f"ns-{start:07d}.yaml").write_text(yaml.dump_all(docs, Dumper=DUMPER))
    return count


def write_json_dir(yaml_dir: Path, directory: Path) -> None:
    """The same objects as JSON: each YAML file as one ``kind: List`` (``kubectl get -o json``)."""
    directory.mkdir(parents=True, exist_ok=True)
    for path in sorted(yaml_dir.glob("*.yaml")):
        items = list(yaml.load_all(path.read_text(), Loader=LOADER))
        document = {"apiVersion": "v1", "kind": "List", "items": items}
        (directory / f"{path.stem}.json").write_text(json.dumps(document))


# ``--cluster-grants``: the resources each ClusterRole restricts (and the API server serves).
CLUSTER_RESOURCES = ("configmaps", "secrets", "services", "endpoints", "persistentvolumeclaims",
                     "limitranges", "resourcequotas")  # fmt: skip


def cluster_role(name: str, labels: dict[str, list[str]], user: str) -> list[dict[str, Any]]:
    """A ClusterRole restricting CLUSTER_RESOURCES to ``labels``, bound cluster-wide to
    ``user``."""
    permissions = {r: labels for r in CLUSTER_RESOURCES}
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": name,
                         "annotations": {"labelrbac.io/permissions": json.dumps(permissions)}},
            "rules": [{"apiGroups": [""], "resources": list(CLUSTER_RESOURCES), "verbs": ["*"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": name},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        },
    ]  # fmt: skip


def cluster_grant(index: int) -> list[dict[str, Any]]:
    """A ClusterRole restricting CLUSTER_RESOURCES by label values of its own, bound
    cluster-wide to a user of its own."""
    # One label rule for all seven: one grant, as a role restricting a set of resources alike.
    labels = {"team": [f"c{index}"], "tier": [f"t{index}-*"]}
    return cluster_role(f"bench-cluster-{index}", labels, f"cluster-user-{index}")
