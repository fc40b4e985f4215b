"""The shipped manifests: what the API server sends to the webhook, how it fails, and how the
pieces refer to each other, for the default namespace and for a configured one.

Which requests reach which webhook entry is worked out as the API server does it: rules
(operations, groups, versions, resources, scope), then the namespaceSelector, then the
matchConditions, evaluated as CEL (cel-python) against the same AdmissionReview the API server
would send. Rendering with another namespace uses ``kubectl kustomize`` (built into kubectl,
offline); without kubectl those tests are skipped and the default-namespace checks, which read
the files directly, still run.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.compiled.admission_policy import ACTIONS, COMPILER, policy, registration_guard
from app.engine.context import Context
from app.engine.node import check_node
from app.engine.rbac import Snapshot
from app.source.static import read_manifests
from app.webhook.wire import parse_review
from tests.cel import conditions_pass
from tests.support import ROOT, make_review

MANIFESTS = ROOT / "manifests"
DEPLOY = MANIFESTS / "deploy"
ENFORCE = MANIFESTS / "enforce"
COMPILER_ALERTS = MANIFESTS / "compiled" / "monitoring" / "alerts.yaml"
NAMESPACE = "label-rbac"
NODE = ("system:nodes",)

Objects = dict[tuple[str, str], dict[str, Any]]


def index(objects: list[tuple[str, Any]]) -> Objects:
    return {(kind, obj["metadata"]["name"]): dict(obj) for kind, obj in objects}


def raw_objects() -> Objects:
    """manifests/deploy as written (the default namespace and names need no rendering)."""
    return index([(k, o) for k, o in read_manifests(DEPLOY) if k != "Kustomization"])


def kustomize(directory: Path) -> Objects:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl (kustomize) not installed")
    rendered = subprocess.run(
        [kubectl, "kustomize", str(directory)], capture_output=True, text=True, check=True
    ).stdout
    return index([(doc["kind"], doc) for doc in yaml.safe_load_all(rendered) if doc])


def only(objects: Objects, kind: str) -> dict[str, Any]:
    """The one object of ``kind``, the narrowing's compiler's (``*-compiler``) aside."""
    (found,) = [
        obj for (k, name), obj in objects.items() if k == kind and not name.endswith("-compiler")
    ]
    return found


def entries(objects: Objects) -> dict[str, dict[str, Any]]:
    config = only(objects, "ValidatingWebhookConfiguration")
    return {entry["name"]: entry for entry in config["webhooks"]}


# --- which entry receives a request: the API server's matching, step by step -------------


def _rule_matches(rule: dict[str, Any], request: dict[str, Any]) -> bool:
    resource = request["resource"]
    name = resource["resource"] + ("/" + request["subResource"] if "subResource" in request else "")
    scope = "Namespaced" if request.get("namespace") else "Cluster"

    def resource_matches(pattern: str) -> bool:
        if pattern == "*/*":
            return True
        res, _, sub = pattern.partition("/")
        if res == "*":
            return "/" in name and name.split("/", 1)[1] == sub if sub else "/" not in name
        return pattern == name

    return (
        ("*" in rule["operations"] or request["operation"] in rule["operations"])
        and ("*" in rule["apiGroups"] or resource["group"] in rule["apiGroups"])
        and ("*" in rule["apiVersions"] or resource["version"] in rule["apiVersions"])
        and any(resource_matches(p) for p in rule["resources"])
        and rule.get("scope", "*") in ("*", scope)
    )


def _selector_matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    for expression in selector.get("matchExpressions", []):
        present, value = expression["key"] in labels, labels.get(expression["key"])
        operator = expression["operator"]
        if operator == "NotIn" and present and value in expression["values"]:
            return False
        if operator == "In" and not (present and value in expression["values"]):
            return False
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def _conditions_match(entry: dict[str, Any], request: dict[str, Any]) -> bool:
    return conditions_pass(entry.get("matchConditions", []), request)


def receivers(
    objects: Objects, review: dict[str, Any], namespace_labels: dict[str, str] | None = None
) -> set[str]:
    """The entries the API server would send this review to."""
    request = review["request"]
    labels = {"kubernetes.io/metadata.name": request.get("namespace", "")}
    labels |= namespace_labels or {}
    return {
        name
        for name, entry in entries(objects).items()
        if any(_rule_matches(rule, request) for rule in entry["rules"])
        # Cluster-scoped objects other than Namespaces are never skipped by a selector.
        and (not request.get("namespace") or _selector_matches(entry["namespaceSelector"], labels))
        and _conditions_match(entry, request)
    }


def node_review(operation: str, resource: str, namespace: str = "", user: str = "node1") -> Any:
    return make_review(
        f"system:node:{user}", operation, resource, groups=NODE, namespace=namespace, labels={}
    )


ROUTING = [
    pytest.param(
        make_review("bob", "CREATE", "configmaps", namespace="t1", labels={}),
        {"labels.labelrbac.io"},
        id="tenant-configmap",
    ),
    pytest.param(
        make_review("bob", "CONNECT", "pods/exec", namespace="t1"),
        {"labels.labelrbac.io"},
        id="tenant-exec",
    ),
    pytest.param(
        make_review("bob", "UPDATE", "deployments.apps/scale", namespace="t1", labels={}),
        {"labels.labelrbac.io"},
        id="tenant-scale",
    ),
    pytest.param(
        make_review("bob", "CREATE", "roles.rbac.authorization.k8s.io", namespace="t1", labels={}),
        {"rbac.labelrbac.io"},
        id="role",
    ),
    pytest.param(
        make_review("alice", "UPDATE", "clusterrolebindings.rbac.authorization.k8s.io", labels={}),
        {"rbac.labelrbac.io"},
        id="clusterrolebinding",
    ),
    pytest.param(
        make_review(
            "system:apiserver",
            "UPDATE",
            "clusterroles.rbac.authorization.k8s.io",
            groups=("system:masters",),
            labels={},
        ),
        set(),
        id="apiserver-bootstrap-roles",
    ),
    pytest.param(
        make_review("admin", "CREATE", "configmaps", namespace="kube-system", labels={}),
        set(),
        id="kube-system-configmap",
    ),
    pytest.param(
        make_review("admin", "CREATE", "roles.rbac.authorization.k8s.io", namespace="kube-system"),
        set(),
        id="kube-system-role",
    ),
    pytest.param(
        make_review("admin", "CREATE", "persistentvolumes", labels={}),
        set(),
        id="cluster-scoped-kind",
    ),
    pytest.param(
        make_review("bob", "UPDATE", "leases.coordination.k8s.io", namespace="t1", labels={}),
        set(),
        id="lease",
    ),
    pytest.param(
        make_review("bob", "CREATE", "events", namespace="t1", labels={}),
        set(),
        id="event",
    ),
    pytest.param(
        node_review("CREATE", "pods", namespace="kube-system"),
        {"nodes.labelrbac.io"},
        id="mirror-pod-in-kube-system",
    ),
    pytest.param(
        node_review("UPDATE", "nodes/status"),
        {"nodes.labelrbac.io"},
        id="node-status",
    ),
    pytest.param(
        node_review("DELETE", "pods", namespace="t1"),
        {"nodes.labelrbac.io"},
        id="node-deletes-tenant-pod",
    ),
    pytest.param(
        node_review("UPDATE", "pods/status", namespace="t1"),
        {"pod-status.labelrbac.io"},
        id="pod-status",
    ),
    pytest.param(
        node_review("CREATE", "configmaps", namespace="t1"),
        {"labels.labelrbac.io"},
        id="node-writes-configmap",
    ),
    pytest.param(
        make_review(COMPILER, "CREATE", "labelrbacparams.labelrbac.io", namespace="t1", labels={}),
        set(),
        id="compiler-writes-parameters",
    ),
    pytest.param(
        make_review("bob", "UPDATE", "labelrbacparams.labelrbac.io", namespace="t1", labels={}),
        {"labels.labelrbac.io"},
        id="tenant-writes-parameters",
    ),
    pytest.param(
        make_review(COMPILER, "CREATE", "configmaps", namespace="t1", labels={}),
        {"labels.labelrbac.io"},
        id="compiler-writes-another-group",
    ),
    pytest.param(
        node_review("UPDATE", "leases.coordination.k8s.io", namespace="kube-node-lease"),
        {"node-objects.labelrbac.io"},
        id="node-lease",
    ),
    pytest.param(
        node_review("CREATE", "certificatesigningrequests.certificates.k8s.io"),
        {"node-objects.labelrbac.io"},
        id="node-csr",
    ),
    pytest.param(
        node_review("CREATE", "resourceslices.resource.k8s.io"),
        {"node-objects.labelrbac.io"},
        id="node-resourceslice",
    ),
    pytest.param(
        node_review("UPDATE", "csinodes.storage.k8s.io"),
        {"node-objects.labelrbac.io"},
        id="node-csinode",
    ),
    pytest.param(
        node_review("UPDATE", "persistentvolumeclaims/status", namespace="t1"),
        {"labels.labelrbac.io"},
        id="node-pvc-status",
    ),
    pytest.param(
        make_review("bob", "CREATE", "certificatesigningrequests.certificates.k8s.io", labels={}),
        set(),
        id="user-csr",
    ),
    pytest.param(
        make_review("system:node:x", "UPDATE", "nodes", labels={}),
        set(),
        id="node-name-without-group",
    ),
    pytest.param(
        make_review("mallory", "UPDATE", "nodes", groups=NODE, labels={}),
        set(),
        id="group-without-node-name",
    ),
    pytest.param(
        make_review("bob", "UPDATE", "pods/status", namespace="t1", labels={}),
        {"labels.labelrbac.io"},
        id="user-pod-status",
    ),
]


@pytest.mark.parametrize(("review", "expected"), ROUTING)
def test_each_request_reaches_the_entry_meant_for_it(
    review: dict[str, Any], expected: set[str]
) -> None:
    assert receivers(raw_objects(), review) == expected


OWN_NAMESPACE_REVIEWS = [
    pytest.param(make_review("bob", "CREATE", "configmaps", labels={}), id="configmap"),
    pytest.param(make_review("bob", "CREATE", "roles.rbac.authorization.k8s.io"), id="role"),
    pytest.param(node_review("UPDATE", "pods/status"), id="node-pod-status"),
    pytest.param(node_review("CREATE", "pods"), id="node-pod"),
]


@pytest.mark.parametrize("review", OWN_NAMESPACE_REVIEWS)
def test_own_namespace_is_never_judged(review: dict[str, Any]) -> None:
    review["request"]["namespace"] = NAMESPACE
    assert receivers(raw_objects(), review) == set()


@pytest.mark.parametrize(
    ("review", "expected"),
    [
        pytest.param(make_review("bob", "CREATE", "configmaps", labels={}), set(), id="configmap"),
        pytest.param(
            make_review("bob", "CREATE", "roles.rbac.authorization.k8s.io"), set(), id="role"
        ),
        # The opt-out is for tenancy: a kubelet stays under the node rules everywhere.
        pytest.param(node_review("CREATE", "pods"), {"nodes.labelrbac.io"}, id="node-pod"),
    ],
)
def test_opted_out_namespaces_skip_the_label_rule(
    review: dict[str, Any], expected: set[str]
) -> None:
    review["request"]["namespace"] = "legacy"
    assert receivers(raw_objects(), review, {"labelrbac.io/exempt": "true"}) == expected


def test_node_conditions_match_the_engine_definition_of_a_node() -> None:
    """The CEL condition and the node rules agree on who is a node, for every recorded user.

    The probe is a write to another node's Node, which the node rules refuse to a node and
    leave alone for anyone else.
    """
    users = set()
    for path in sorted((ROOT.parent / "shared" / "fixtures").rglob("admission-reviews/*.json")):
        request = json.loads(path.read_text()).get("request") or {}
        info = request.get("userInfo") or {}
        users.add((info.get("username", ""), tuple(info.get("groups", []))))
    users |= {("system:node:n1", NODE), ("system:node:n1", ()), ("n1", NODE)}
    users |= {("system:node:", NODE)}
    assert any(u.startswith("system:node:") for u, _ in users), "fixtures without a kubelet"
    objects = raw_objects()
    context = Context(Snapshot.build((), ()))
    for username, groups in sorted(users):
        review = make_review(username, "UPDATE", "nodes", name="zz-other", labels={})
        review["request"]["userInfo"]["groups"] = list(groups)
        refused = check_node(parse_review(review).request, context) is not None
        assert ("nodes.labelrbac.io" in receivers(objects, review)) == refused, username


# --- failure policy: Ignore while installing, Fail once switched ---------------------------


def test_install_never_refuses_writes_while_the_webhook_starts() -> None:
    for name, entry in entries(raw_objects()).items():
        assert entry["failurePolicy"] == "Ignore", name


def test_enforce_overlay_fails_closed_except_pod_status() -> None:
    policies = {name: e["failurePolicy"] for name, e in entries(kustomize(ENFORCE)).items()}
    assert policies == {
        "labels.labelrbac.io": "Fail",
        "rbac.labelrbac.io": "Fail",
        "nodes.labelrbac.io": "Fail",
        "pod-status.labelrbac.io": "Ignore",
        "node-objects.labelrbac.io": "Ignore",
    }


def test_enforce_overlay_changes_nothing_else() -> None:
    base, enforced = kustomize(DEPLOY), kustomize(ENFORCE)
    for entry in only(enforced, "ValidatingWebhookConfiguration")["webhooks"]:
        entry["failurePolicy"] = "Ignore"
    assert enforced == base


# --- wiring: names and namespace, default and configured ------------------------------------


def check_wiring(objects: Objects, namespace: str) -> None:
    """Everything that spells out the namespace or a name agrees with the objects it means."""
    service = only(objects, "Service")["metadata"]
    assert service["namespace"] == namespace
    ns = only(objects, "Namespace")["metadata"]
    assert ns["name"] == namespace and ns["labels"]["labelrbac.io/exempt"] == "true"

    certificates = {c["metadata"]["name"]: c for (k, _), c in objects.items() if k == "Certificate"}
    (ca,) = [c for c in certificates.values() if c["spec"].get("isCA")]
    (serving,) = [c for c in certificates.values() if not c["spec"].get("isCA")]
    assert serving["spec"]["dnsNames"] == [
        f"{service['name']}.{namespace}.svc",
        f"{service['name']}.{namespace}.svc.cluster.local",
    ]
    issuers = {i["metadata"]["name"]: i for (k, _), i in objects.items() if k == "Issuer"}
    ca_issuer = issuers[serving["spec"]["issuerRef"]["name"]]
    assert ca_issuer["spec"]["ca"]["secretName"] == ca["spec"]["secretName"]
    assert "selfSigned" in issuers[ca["spec"]["issuerRef"]["name"]]["spec"]

    config = only(objects, "ValidatingWebhookConfiguration")
    assert config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == (
        f"{namespace}/{ca['metadata']['name']}"
    )
    for entry in config["webhooks"]:
        assert entry["clientConfig"]["service"] == {
            "name": service["name"],
            "namespace": namespace,
            "path": "/validate",
            "port": 443,
        }
        (by_name,) = [
            e
            for e in entry["namespaceSelector"]["matchExpressions"]
            if e["key"] == "kubernetes.io/metadata.name"
        ]
        assert by_name["operator"] == "NotIn" and namespace in by_name["values"], entry["name"]

    deployment = only(objects, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "tls"]
    assert volume["secret"]["secretName"] == serving["spec"]["secretName"]
    account = only(objects, "ServiceAccount")["metadata"]
    assert pod["serviceAccountName"] == account["name"]
    assert pod["priorityClassName"] == only(objects, "PriorityClass")["metadata"]["name"]
    binding = only(objects, "ClusterRoleBinding")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["name"], "namespace": namespace}
    ]
    assert binding["roleRef"]["name"] == only(objects, "ClusterRole")["metadata"]["name"]
    assert service.get("namespace") == deployment["metadata"]["namespace"] == namespace


def test_wiring_as_written() -> None:
    check_wiring(raw_objects(), NAMESPACE)


def test_wiring_as_rendered() -> None:
    check_wiring(kustomize(DEPLOY), NAMESPACE)


@pytest.fixture
def configured(tmp_path: Path) -> Iterator[Path]:
    """A copy of manifests/ whose one place sets another namespace and a name prefix."""
    shutil.copytree(MANIFESTS, tmp_path / "manifests")
    kustomization = tmp_path / "manifests" / "deploy" / "kustomization.yaml"
    text = kustomization.read_text()
    text = re.sub(r"(?m)^namespace: .*$", "namespace: platform-admission", text)
    text = re.sub(r"(?m)^# namePrefix: .*$", "namePrefix: acme-", text)
    kustomization.write_text(text)
    yield tmp_path / "manifests"


def test_namespace_and_names_are_configured_in_one_place(configured: Path) -> None:
    for overlay in ("deploy", "enforce"):
        objects = kustomize(configured / overlay)
        check_wiring(objects, "platform-admission")
        assert only(objects, "Service")["metadata"]["name"] == "acme-label-rbac"
        (compiler,) = objects[("Deployment", "acme-label-rbac-compiler")]["spec"]["template"][
            "spec"
        ]["containers"]
        assert {
            "--lease-namespace=platform-admission",
            "--lease-name=acme-label-rbac-compiler",
            "--webhook-configuration=acme-label-rbac",
        } <= set(compiler["args"])
        role = objects[("ClusterRole", "acme-label-rbac-compiler")]
        assert role["rules"][2]["resourceNames"] == ["acme-label-rbac"]
        text = yaml.safe_dump_all(list(objects.values()))
        # Nothing still names the default namespace as a namespace.
        assert not re.search(r"namespace: label-rbac\b|label-rbac\.svc|\.label-rbac\.svc", text)
        # The self-exemption follows: the configured namespace is never judged.
        review = make_review("bob", "CREATE", "configmaps", namespace="platform-admission")
        assert receivers(objects, review) == set()
        review["request"]["namespace"] = NAMESPACE
        assert receivers(objects, review) == {"labels.labelrbac.io"}


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    listed = set(kustomization["resources"])
    present = {p.name for p in DEPLOY.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == present


# --- who reaches the webhook's port -------------------------------------------------------------

# The pod network of the shipped NetworkPolicy's default (docs/install.md, "Network policy").
POD_NETWORK = "10.244.0.0/16"


def check_admission(policy: dict[str, Any], objects: Objects) -> list[dict[str, Any]]:
    """The policy isolates the webhook's pods and opens their serving port only; its peers."""
    template = only(objects, "Deployment")["spec"]["template"]
    spec = policy["spec"]
    assert spec["podSelector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    assert spec["policyTypes"] == ["Ingress"]
    (container,) = template["spec"]["containers"]
    port_names = {port["name"] for port in container["ports"]}
    peers = []
    for rule in spec["ingress"]:
        assert rule["ports"] and all(
            p["port"] in port_names and p["protocol"] == "TCP" for p in rule["ports"]
        ), rule
        peers += rule["from"]
    return peers


def test_only_the_api_server_reaches_the_webhook_port() -> None:
    objects = kustomize(DEPLOY)
    peers = check_admission(objects[("NetworkPolicy", "label-rbac")], objects)
    blocks = [peer["ipBlock"] for peer in peers if "ipBlock" in peer]
    selected = [peer for peer in peers if "ipBlock" not in peer]
    # Addresses outside the pod network (a control plane on the nodes' host network or outside
    # the cluster), never the pods themselves...
    assert blocks == [{"cidr": "0.0.0.0/0", "except": [POD_NETWORK]}]
    # ...and of the pods only kube-system's (managed control planes' tunnel agents), where no
    # tenant creates pods.
    assert selected == [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
            "podSelector": {},
        }
    ]


def test_prometheus_reaches_the_metrics_with_monitoring_on(configured: Path) -> None:
    kustomization = configured / "deploy" / "kustomization.yaml"
    text = kustomization.read_text().replace("# components:", "components:")
    kustomization.write_text(text.replace("#   - ../monitoring", "  - ../monitoring"))
    objects = kustomize(configured / "deploy")
    metrics = objects[("NetworkPolicy", "acme-label-rbac-metrics")]
    assert metrics["metadata"]["namespace"] == "platform-admission"
    peers = check_admission(metrics, objects)
    assert peers == [
        {
            "namespaceSelector": {},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
        }
    ]
    # The API server's policy follows the configured namespace and names as well.
    webhook = objects[("NetworkPolicy", "acme-label-rbac")]
    assert webhook["metadata"]["namespace"] == "platform-admission"
    check_admission(webhook, objects)


# --- certificates ---------------------------------------------------------------------------


def hours(duration: str) -> float:
    assert re.fullmatch(r"\d+h", duration), duration
    return float(duration[:-1])


def test_ca_outlives_its_leaves_and_keeps_its_key() -> None:
    objects = raw_objects()
    ca = objects[("Certificate", "label-rbac-ca")]["spec"]
    serving = objects[("Certificate", "label-rbac-serving")]["spec"]
    assert ca["isCA"] is True
    # A leaf is renewed many times within one CA lifetime, and the CA renews under its old key,
    # so leaves issued before a CA renewal still verify against the renewed CA.
    assert hours(ca["duration"]) - hours(ca["renewBefore"]) > 10 * hours(serving["duration"])
    assert ca["privateKey"]["rotationPolicy"] == "Never"
    assert hours(serving["renewBefore"]) >= 24 * 7, "time for every pod's volume to refresh"


def test_ca_bundle_is_injected_from_the_ca() -> None:
    objects = raw_objects()
    source = objects[("ValidatingWebhookConfiguration", "label-rbac")]["metadata"]["annotations"][
        "cert-manager.io/inject-ca-from"
    ]
    assert source.split("/")[0] == NAMESPACE
    name = source.split("/")[1]
    assert objects[("Certificate", name)]["spec"]["isCA"] is True


# --- availability ---------------------------------------------------------------------------


def test_replicas_spread_across_nodes_and_survive_disruption() -> None:
    objects = raw_objects()
    deployment = objects[("Deployment", "label-rbac")]["spec"]
    pod_labels = deployment["template"]["metadata"]["labels"]
    assert deployment["replicas"] >= 2
    assert deployment["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    spread = {
        c["topologyKey"]: c for c in deployment["template"]["spec"]["topologySpreadConstraints"]
    }
    hostname = spread["kubernetes.io/hostname"]
    assert hostname["whenUnsatisfiable"] == "DoNotSchedule" and hostname["maxSkew"] == 1
    assert hostname["labelSelector"]["matchLabels"].items() <= pod_labels.items()
    pdb = objects[("PodDisruptionBudget", "label-rbac")]["spec"]
    assert pdb["minAvailable"] == 1
    assert pdb["selector"]["matchLabels"].items() <= pod_labels.items()
    priority = objects[("PriorityClass", "label-rbac")]
    assert 0 < priority["value"] <= 1_000_000_000  # the highest a non-system class may have


def test_probes_and_grace_period_cover_the_drain() -> None:
    pod = raw_objects()[("Deployment", "label-rbac")]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["startupProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    (drain,) = [a for a in container["args"] if a.startswith("--drain-seconds=")]
    from app.webhook.serve import GRACEFUL_TIMEOUT

    assert pod["terminationGracePeriodSeconds"] > float(drain.split("=")[1]) + GRACEFUL_TIMEOUT


def with_modes(tmp_path: Path) -> Path:
    """manifests/enforce-compiled with the warn and audit component added, as docs/compiled.md
    says."""
    shutil.copytree(MANIFESTS, tmp_path / "manifests")
    kustomization = tmp_path / "manifests" / "enforce-compiled" / "kustomization.yaml"
    kustomization.write_text(kustomization.read_text() + "  - ../compiled/modes\n")
    return kustomization.parent


def test_the_compilers_policies_are_bound_not_shipped(tmp_path: Path) -> None:
    """No overlay ships a policy the compiler writes (it would be written over, or with
    ``kubectl apply`` fight the compiler); enforce-compiled binds each policy it writes no wider
    than the policy matches, and the compiler's RBAC lets it write exactly those, by name: no
    delete, nothing on the bindings."""
    for overlay in (DEPLOY, ENFORCE, MANIFESTS / "enforce-compiled"):
        objects = kustomize(overlay)
        assert {n for k, n in objects if k == "ValidatingAdmissionPolicy"}.isdisjoint(ACTIONS)
    objects = kustomize(with_modes(tmp_path))
    assert {n for k, n in objects if k == "ValidatingAdmissionPolicy"}.isdisjoint(ACTIONS)
    for name in ACTIONS:
        binding = objects[("ValidatingAdmissionPolicyBinding", name)]["spec"]
        assert binding["policyName"] == name
        assert binding["matchResources"] == policy(name)["spec"]["matchConstraints"]
    role = objects[("ClusterRole", "label-rbac-compiler")]
    admission = [
        rule
        for rule in role["rules"]
        if rule["apiGroups"] == ["admissionregistration.k8s.io"]
        and rule["resources"] != ["validatingwebhookconfigurations"]
    ]
    assert admission == [
        {
            "apiGroups": ["admissionregistration.k8s.io"],
            "resources": ["validatingadmissionpolicies"],
            "resourceNames": list(ACTIONS),
            "verbs": ["get", "list", "watch", "create", "patch"],
        }
    ]


def test_webhook_service_account_may_only_read() -> None:
    objects = raw_objects()
    role = objects[("ClusterRole", "label-rbac")]
    verbs = {verb for rule in role["rules"] for verb in rule["verbs"]}
    assert verbs <= {"get", "list", "watch"}, verbs


# --- the image ---------------------------------------------------------------------------------


def dockerfile_stages() -> list[list[tuple[str, str]]]:
    """Dockerfile instructions (continuations joined), grouped by stage."""
    text = re.sub(r"\\\n\s*", " ", (ROOT / "Dockerfile").read_text())
    stages: list[list[tuple[str, str]]] = []
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        instruction, _, rest = line.strip().partition(" ")
        if instruction.upper() == "FROM":
            stages.append([])
        stages[-1].append((instruction.upper(), rest.strip()))
    return stages


def test_image_is_multi_stage_pinned_and_minimal() -> None:
    stages = dockerfile_stages()
    assert len(stages) >= 2
    for stage in stages:
        base = stage[0][1].split()[0]
        assert re.fullmatch(r"[\w./:-]+@sha256:[0-9a-f]{64}", base), base
    build, final = stages[0], stages[-1]
    installs = " ".join(rest for op, rest in build if op == "RUN")
    assert "--only-binary=:all:" in installs  # nothing compiled, so no compiler needed
    # Only from the lock file, every file checked against its hash.
    assert "--require-hashes" in installs and "-r /tmp/requirements.lock" in installs
    assert "requirements.txt" not in " ".join(rest for _, rest in build)
    labels = " ".join(rest for op, rest in final if op == "LABEL")
    for key in ("title", "version", "revision", "base.digest"):
        assert f"org.opencontainers.image.{key}=" in labels, key
    assert (
        final[0][1]
        .split()[0]
        .endswith(
            re.search(r'base\.digest="([^"]+)"', labels).group(1)  # type: ignore[union-attr]
        )
    )
    assert "pip uninstall" in installs and "pip setuptools" in installs
    # The final stage only copies: nothing installed there, no pip, no compilers.
    assert {op for op, _ in final} <= {"FROM", "ARG", "COPY", "ENV", "WORKDIR", "USER", "EXPOSE",
                                       "ENTRYPOINT", "CMD", "LABEL"}  # fmt: skip
    assert "distroless" in final[0][1]
    (user,) = [rest for op, rest in final if op == "USER"]
    assert int(user.split(":")[0]) != 0


def locked() -> dict[str, tuple[str, list[str]]]:
    """requirements.lock: name → (version, hashes)."""
    text = re.sub(r"\\\n\s*", " ", (ROOT / "requirements.lock").read_text())
    found: dict[str, tuple[str, list[str]]] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            requirement, *hashes = (part.strip() for part in line.split("--hash="))
            name, _, version = requirement.partition("==")
            found[name.lower().replace("_", "-")] = (version, hashes)
    return found


def test_lock_pins_every_dependency_with_hashes() -> None:
    """requirements.lock pins what requirements.txt pins, and every transitive dependency,
    each with sha256 hashes (what pip --require-hashes needs); and it is what the tests run
    with (the virtual environment's versions)."""
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    lock = locked()
    direct = [
        line.split("#", 1)[0].strip()
        for line in (ROOT / "requirements.txt").read_text().splitlines()
    ]
    for requirement in filter(None, direct):
        name, _, version = requirement.partition("==")
        assert lock[name.lower()][0] == version, requirement
    for name, (version, hashes) in lock.items():
        assert re.fullmatch(r"[0-9][0-9a-z.+!-]*", version), name
        assert hashes and all(re.fullmatch(r"sha256:[0-9a-f]{64}", h) for h in hashes), name
        assert metadata.version(name) == version, name
    # Closed under dependencies: each locked package's requirements (for the image's Python
    # 3.11 on Linux) are locked too.
    image = {"python_version": "3.11", "python_full_version": "3.11.2", "sys_platform": "linux",
             "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
             "implementation_name": "cpython", "platform_python_implementation": "CPython",
             "extra": ""}  # fmt: skip
    for name in lock:
        for text in metadata.requires(name) or ():
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate(image):
                assert canonicalize_name(requirement.name) in lock, (name, text)


def test_image_default_command_serves_the_cluster() -> None:
    from app.cli import _parser

    final = dockerfile_stages()[-1]
    (entrypoint,) = [json.loads(rest) for op, rest in final if op == "ENTRYPOINT"]
    (command,) = [json.loads(rest) for op, rest in final if op == "CMD"]
    assert entrypoint[1:] == ["-m", "app"]
    args = _parser().parse_args(command)
    assert args.command == "serve"
    assert args.rbac_dir is None and args.kubeconfig is None and args.dev_tls is None
    # The certificate is where the Deployment mounts the serving Secret.
    pod = raw_objects()[("Deployment", "label-rbac")]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "tls"]
    assert args.tls_cert == Path(mount["mountPath"]) / "tls.crt"
    assert args.tls_key == Path(mount["mountPath"]) / "tls.key"
    assert args.drain_seconds > 0


# --- monitoring --------------------------------------------------------------------------------


def exposed_series() -> set[str]:
    """Every series name label-rbac's /metrics can carry (samples or not yet)."""
    from prometheus_client import ProcessCollector

    from app.webhook.metrics import LAST_EVENT_AGE, Metrics

    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}
    names = {LAST_EVENT_AGE}
    for family in [*Metrics().registry.collect(), *ProcessCollector(registry=None).collect()]:
        names |= {family.name + suffix for suffix in suffixes.get(family.type, ("",))}
    return names


def compiler_series() -> set[str]:
    """Every series name the compiler's /metrics carries (app.compiled.health)."""
    from app.compiled.health import CompilerHealth

    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}
    return {
        family.name + suffix
        for family in CompilerHealth(15).registry.collect()
        for suffix in suffixes.get(family.type, ("",))
    }


def referenced_series(expression: str) -> set[str]:
    return set(re.findall(r"\b((?:label_rbac|process|apiserver)_[a-z0-9_]+|up)\b", expression))


def monitoring_expressions() -> list[str]:
    expressions = []
    for path in (MANIFESTS / "monitoring" / "alerts.yaml", COMPILER_ALERTS):
        rules = yaml.safe_load(path.read_text())
        expressions += [
            rule["expr"] for group in rules["spec"]["groups"] for rule in group["rules"]
        ]
    dashboard = json.loads((MANIFESTS / "monitoring" / "dashboard.json").read_text())
    expressions += [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    return expressions


def test_alerts_cover_down_stale_and_denial_spikes() -> None:
    rules = yaml.safe_load((MANIFESTS / "monitoring" / "alerts.yaml").read_text())
    alerts = {rule["alert"]: rule for group in rules["spec"]["groups"] for rule in group["rules"]}
    assert {"LabelRbacWebhookDown", "LabelRbacCacheStale", "LabelRbacDenialSpike"} <= set(alerts)
    assert "label_rbac_last_event_age_seconds" in alerts["LabelRbacCacheStale"]["expr"]
    assert 'allowed="false"' in alerts["LabelRbacDenialSpike"]["expr"]
    for name, rule in alerts.items():
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        assert rule["annotations"]["summary"] and re.fullmatch(r"\d+m", rule["for"]), name


def test_monitoring_queries_name_only_real_series() -> None:
    exposed, compiler = exposed_series(), compiler_series()
    for expression in monitoring_expressions():
        assert expression.count("(") == expression.count(")"), expression
        assert expression.count("{") == expression.count("}"), expression
        ours = {s for s in referenced_series(expression) if not s.startswith("apiserver_")}
        # Every series of ours is selected by the job the ServiceMonitor (the webhook's) or the
        # PodMonitor (the compiler's) gives it.
        if ours & compiler or 'job="label-rbac-compiler"' in expression:
            assert ours - {"up"} <= compiler, (ours - compiler, expression)
            assert 'job="label-rbac-compiler"' in expression, expression
        else:
            assert ours - {"up"} <= exposed, (ours - exposed, expression)
            if ours:
                assert 'job="label-rbac"' in expression, expression


def test_compiler_alerts_cover_no_leader_lag_and_delegation() -> None:
    rules = yaml.safe_load(COMPILER_ALERTS.read_text())
    alerts = {rule["alert"]: rule for group in rules["spec"]["groups"] for rule in group["rules"]}
    assert "label_rbac_compiler_leader" in alerts["LabelRbacCompilerNoLeader"]["expr"]
    assert alerts["LabelRbacCompilerNoLeader"]["for"] == "1m"
    assert "> 5" in alerts["LabelRbacCompilerLagging"]["expr"]
    assert "delegated" in alerts["LabelRbacNamespacesDelegated"]["expr"]
    for name, rule in alerts.items():
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        assert rule["annotations"]["summary"] and re.fullmatch(r"\d+m", rule["for"]), name


def test_compiler_probes_and_monitor_match_its_flags() -> None:
    """The compiler's Deployment serves its probes where they and the PodMonitor look."""
    from app.cli import _parser

    objects = kustomize(MANIFESTS / "enforce-compiled")
    pod = objects[("Deployment", "label-rbac-compiler")]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = _parser().parse_args(container["args"])
    (port,) = container["ports"]
    assert args.probe_bind == ("0.0.0.0", port["containerPort"])
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["port"] == port["name"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    monitor = yaml.safe_load((COMPILER_ALERTS.parent / "podmonitor.yaml").read_text())
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == port["name"] and endpoint["path"] == "/metrics"
    labels = objects[("Deployment", "label-rbac-compiler")]["spec"]["template"]["metadata"]
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= labels["labels"].items()
    assert labels["labels"][monitor["spec"]["jobLabel"]] == "label-rbac-compiler"
    disruption = objects[("PodDisruptionBudget", "label-rbac-compiler")]["spec"]
    assert disruption["selector"]["matchLabels"] == selector and disruption["minAvailable"] == 1


def test_monitoring_follows_the_configured_namespace(configured: Path) -> None:
    kustomization = configured / "deploy" / "kustomization.yaml"
    text = kustomization.read_text().replace("# components:", "components:")
    kustomization.write_text(text.replace("#   - ../monitoring", "  - ../monitoring"))
    objects = kustomize(configured / "deploy")
    monitor = only(objects, "ServiceMonitor")
    service = only(objects, "Service")
    serving = objects[("Certificate", "acme-label-rbac-serving")]["spec"]
    ca = objects[("Certificate", "acme-label-rbac-ca")]["spec"]
    assert monitor["metadata"]["namespace"] == "platform-admission"
    service_labels = service["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service_labels.items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["tlsConfig"]["serverName"] == serving["dnsNames"][0]
    assert endpoint["tlsConfig"]["ca"]["secret"]["name"] == ca["secretName"]
    # The job label the queries select is the Service label the ServiceMonitor names.
    assert service["metadata"]["labels"][monitor["spec"]["jobLabel"]] == "label-rbac"
    dashboard = only(objects, "ConfigMap")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    json.loads(dashboard["data"]["label-rbac.json"])
    only(objects, "PrometheusRule")


def test_the_narrowing_is_in_every_overlay_and_its_guard_the_generated_one() -> None:
    """manifests/deploy and manifests/enforce run the compiler in its registration-only mode
    under the registration guard (the same as manifests/compiled's); enforce-compiled replaces
    it with the full compiler, one of each object."""
    guard = [d for d in yaml.safe_load_all((DEPLOY / "registration-guard.yaml").read_text()) if d]
    assert guard == registration_guard()
    for overlay in (DEPLOY, ENFORCE):
        objects = kustomize(overlay)
        (container,) = objects[("Deployment", "label-rbac-compiler")]["spec"]["template"]["spec"][
            "containers"
        ]
        assert container["args"][0] == "compile" and "--registration-only" in container["args"]
        assert ("ValidatingAdmissionPolicy", "label-rbac-registration") in objects
    compiled = kustomize(MANIFESTS / "enforce-compiled")
    (container,) = compiled[("Deployment", "label-rbac-compiler")]["spec"]["template"]["spec"][
        "containers"
    ]
    assert "--registration-only" not in container["args"]
