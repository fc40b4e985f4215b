"""Enforcement modes through a real API server (README "Enforcement modes").

A role in ``warn`` mode lets the write through and kubectl prints the webhook's warning; in
``audit`` mode nothing shows, and the API server's audit event carries the would-deny
annotations.
"""

from __future__ import annotations

import json

import yaml

from tests.kube.cluster import LabelRbacCluster
from tests.kube.controlplane import ADMIN
from tests.kube.support import eventually, obj


def bucket_role(ns: str, user: str, mode: str) -> list[dict[str, object]]:
    """A Role granting configmaps within team=a in ``mode``, bound to ``user``."""
    role = obj(
        "Role",
        f"team-a-{mode}",
        ns,
        api_version="rbac.authorization.k8s.io/v1",
        rules=[{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["*"]}],
    )
    role["metadata"]["annotations"] = {  # type: ignore[index]
        "labelrbac.io/permissions": json.dumps({"configmaps": {"team": ["a"]}}),
        "labelrbac.io/mode": mode,
    }
    binding = obj(
        "RoleBinding",
        f"team-a-{mode}",
        ns,
        api_version="rbac.authorization.k8s.io/v1",
        subjects=[{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": user}],
        roleRef={"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": f"team-a-{mode}"},
    )
    return [role, binding]


def create_until_judged(kube: LabelRbacCluster, user: str, ns: str, name: str) -> str:
    """Create a team=b ConfigMap as ``user`` once the webhook knows the new role (until then
    the API server's RBAC or the webhook refuses); kubectl's stderr."""
    document = yaml.safe_dump(obj("ConfigMap", name, ns, {"team": "b"}))

    def created() -> str:
        done = kube.kubectl(user, "create", "-f", "-", input=document)
        assert done.returncode == 0, done.stderr
        return done.stderr

    return eventually(created)


def test_warn_mode_allows_and_kubectl_prints_the_warning(
    kube: LabelRbacCluster, namespace: str
) -> None:
    kube.apply(ADMIN, bucket_role(namespace, "carol", "warn"))
    stderr = create_until_judged(kube, "carol", namespace, "c")
    assert stderr.strip() == (
        f'Warning: user "carol" may not create configmaps "c" in namespace "{namespace}": '
        f'label team="b" is not permitted (role {namespace}/team-a-warn allows team in [a]) '
        "(not enforced: warn mode)"
    )


def test_audit_mode_allows_silently_and_the_audit_log_says_why(
    kube: LabelRbacCluster, namespace: str
) -> None:
    kube.apply(ADMIN, bucket_role(namespace, "erin", "audit"))
    stderr = create_until_judged(kube, "erin", namespace, "c")
    assert stderr == ""

    def recorded() -> dict[str, str]:
        events = [
            e
            for e in kube.control_plane.audit_events()
            if e.get("stage") == "ResponseComplete"
            and e["verb"] == "create"
            and e["user"]["username"] == "erin"
            and e.get("objectRef", {}).get("namespace") == namespace
            and e.get("responseStatus", {}).get("code") == 201
        ]
        assert events, "no audit event for erin's create yet"
        return dict(events[-1].get("annotations", {}))

    annotations = eventually(recorded)
    assert annotations["labels.labelrbac.io/mode"] == "audit"
    assert annotations["labels.labelrbac.io/would-deny-reason"] == "LabelNotPermitted"
    assert annotations["labels.labelrbac.io/would-deny"] == (
        f'user "erin" may not create configmaps "c" in namespace "{namespace}": label '
        f'team="b" is not permitted (role {namespace}/team-a-audit allows team in [a])'
    )
