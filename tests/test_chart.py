"""The Helm chart: it lints and renders with the values files of ``charts/label-rbac/ci``, renders
exactly what the kustomize overlays do with the same settings (object by object, so the two cannot
drift), and carries the name prefix and namespace into every name, exclusion and identity.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.compiled import chart
from app.compiled.admission_policy import ACTIONS, POLICY
from app.compiled.admission_policy import policy as compiled_policy
from tests import helm
from tests.support import ROOT

CI = helm.CHART / "ci"
MANIFESTS = ROOT / "manifests"
Key = tuple[str, str, str]  # kind, namespace, name


def by_key(documents: Iterable[Mapping[str, Any]]) -> dict[Key, Mapping[str, Any]]:
    found: dict[Key, Mapping[str, Any]] = {}
    for doc in documents:
        meta = doc["metadata"]
        key = (doc["kind"], meta.get("namespace", ""), meta["name"])
        assert key not in found, f"{key} rendered twice"
        found[key] = doc
    return found


# Cluster-scoped kinds kubectl's kustomize does not know as such: it gives them the overlay's
# namespace, which the API server drops (as the chart leaves it out).
CLUSTER_SCOPED = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")


def kustomize(directory: Path) -> list[dict[str, Any]]:
    done = subprocess.run(
        ["kubectl", "kustomize", str(directory)], capture_output=True, text=True, check=True
    )
    found = [doc for doc in yaml.safe_load_all(done.stdout) if doc]
    for doc in found:
        if doc["kind"] in CLUSTER_SCOPED:
            doc["metadata"].pop("namespace", None)
    return found


def with_monitoring(tmp: Path, overlay: str) -> Path:
    """``manifests/<overlay>`` with monitoring turned on as docs/monitoring.md says: a copy of
    the manifests whose ``manifests/deploy`` lists the monitoring component."""
    copy = tmp / "manifests"
    shutil.copytree(MANIFESTS, copy)
    kustomization = copy / "deploy" / "kustomization.yaml"
    text = kustomization.read_text()
    commented = "# components:\n#   - ../monitoring\n"
    assert commented in text
    kustomization.write_text(text.replace(commented, "components:\n  - ../monitoring\n"))
    if overlay == "enforce-compiled":
        compiled = copy / overlay / "kustomization.yaml"
        text = compiled.read_text()
        assert text.endswith("  - ../compiled/split\n")
        compiled.write_text(text + "  - ../compiled/monitoring\n")
    return copy / overlay


# The labels the chart adds to every object (Helm's conventions), which the overlays do not carry.
CHART_LABELS = frozenset(
    {
        "app.kubernetes.io/instance",
        "app.kubernetes.io/version",
        "app.kubernetes.io/component",
        "app.kubernetes.io/part-of",
        "app.kubernetes.io/managed-by",
        "helm.sh/chart",
    }
)
# What a cluster with cert-manager and the prometheus-operator serves beyond the built-in APIs.
WITH_ADDONS = (helm.CERT_MANAGER, *helm.PROMETHEUS_OPERATOR)


def without_chart_labels(document: Mapping[str, Any]) -> dict[str, Any]:
    """``document`` without the chart's own labels (and without the name label the overlays
    leave off), on the object and its pod template, to compare it with the overlays'."""
    found = json.loads(json.dumps(document))
    metas = [found["metadata"]]
    template = found.get("spec", {}).get("template")
    if isinstance(template, dict) and "metadata" in template:
        metas.append(template["metadata"])
    for meta in metas:
        labels = {k: v for k, v in meta.get("labels", {}).items() if k not in CHART_LABELS}
        if labels:
            meta["labels"] = labels
        else:
            meta.pop("labels", None)
    return found


def compared(documents: Iterable[Mapping[str, Any]]) -> dict[Key, Mapping[str, Any]]:
    """The chart's objects by key, its own labels left out (``without_chart_labels``)."""
    return by_key(without_chart_labels(d) for d in documents)


def as_overlay(chart: Mapping[str, Any], overlay: Mapping[str, Any]) -> Mapping[str, Any]:
    """A chart's object (``compared``) without the name label the chart puts on every object
    where the overlay's object has none (checked apart: test_every_object_is_labeled)."""
    if "app.kubernetes.io/name" in overlay["metadata"].get("labels", {}):
        return chart
    found = json.loads(json.dumps(chart))
    labels = found["metadata"].get("labels", {})
    labels.pop("app.kubernetes.io/name", None)
    if not labels:
        found["metadata"].pop("labels", None)
    return found


def hook(document: Mapping[str, Any]) -> bool:
    """A Helm hook: the post-install Job switching to Fail, which the overlays leave to the
    second step (`kubectl apply -k manifests/enforce`)."""
    return "helm.sh/hook" in document["metadata"].get("annotations", {})


def post_install(document: Mapping[str, Any]) -> bool:
    return document["metadata"].get("annotations", {}).get("helm.sh/hook") == "post-install"


# The chart without the narrowing (which the overlays have too, manifests/deploy/narrowing.yaml).
NO_NARROWING = CI / "no-narrowing-values.yaml"


def test_narrowing_is_the_compilers_registration_part() -> None:
    """The chart's default adds to manifests/enforce the compiler of manifests/enforce-compiled
    in its registration-only mode, and the registration guard: the same objects, but for the
    rules and flags the parameters need."""
    plain = compared(helm.template([NO_NARROWING], upgrade=True, api_versions=WITH_ADDONS))
    default = compared(helm.template(upgrade=True, api_versions=WITH_ADDONS))
    compiled = by_key(kustomize(MANIFESTS / "enforce-compiled"))
    added = {k: v for k, v in default.items() if k not in plain}
    assert set(plain) <= set(default)
    assert {(kind, name) for kind, _, name in added} == {
        ("ServiceAccount", "label-rbac-compiler"),
        ("ClusterRole", "label-rbac-compiler"),
        ("ClusterRoleBinding", "label-rbac-compiler"),
        ("Role", "label-rbac-compiler"),
        ("RoleBinding", "label-rbac-compiler"),
        ("Deployment", "label-rbac-compiler"),
        ("PodDisruptionBudget", "label-rbac-compiler"),
        ("ValidatingAdmissionPolicy", "label-rbac-registration"),
        ("ValidatingAdmissionPolicyBinding", "label-rbac-registration"),
    }
    for key, obj in added.items():
        if key[0] not in ("ClusterRole", "Deployment"):
            assert as_overlay(obj, compiled[key]) == compiled[key], key
    role = added[("ClusterRole", "", "label-rbac-compiler")]
    writes = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"]
              for r in rule["resources"] for v in rule["verbs"]
              if v not in ("list", "watch", "get")}  # fmt: skip
    # Nothing but its Lease (the Role) and the registration's conditions: no parameters,
    # no Namespace marks, no Events.
    assert writes == {("admissionregistration.k8s.io", "validatingwebhookconfigurations", "patch")}
    (container,) = pod(added[("Deployment", "label-rbac", "label-rbac-compiler")])
    (expected,) = pod(compiled[("Deployment", "label-rbac", "label-rbac-compiler")])
    assert container["args"] == [*expected["args"], "--registration-only"]


# The one object the overlays have and the chart does not: the namespace, which Helm creates
# (`helm install --create-namespace`) and every entry and policy leaves out by name anyway.
ONLY_IN_OVERLAYS = {("Namespace", "", "label-rbac")}


@pytest.mark.parametrize(
    ("values", "upgrade", "overlay", "monitoring"),
    [
        pytest.param([], False, "deploy", False, id="install-is-deploy"),
        pytest.param([], True, "enforce", False, id="upgrade-is-enforce"),
        pytest.param(
            [CI / "compiled-values.yaml"],
            True,
            "enforce-compiled",
            True,
            id="compiled-is-enforce-compiled",
        ),
    ],
)
def test_chart_renders_what_the_overlays_do(
    values: Sequence[Path], upgrade: bool, overlay: str, monitoring: bool, tmp_path: Path
) -> None:
    rendered = compared(
        d for d in helm.template(values, upgrade=upgrade, api_versions=WITH_ADDONS) if not hook(d)
    )
    directory = with_monitoring(tmp_path, overlay) if monitoring else MANIFESTS / overlay
    kustomized = by_key(kustomize(directory))
    assert set(kustomized) - set(rendered) == ONLY_IN_OVERLAYS
    assert set(rendered) - set(kustomized) == set()
    for key, obj in rendered.items():
        expected = kustomized[key]
        differ = f"{key}: the chart and manifests/{overlay} differ"
        assert as_overlay(obj, expected) == expected, differ


def test_chart_files_are_the_manifests() -> None:
    """What the chart reads as files is what the overlays ship, and _compiled.tpl is what
    ``python -m app.compiled.chart`` generates."""
    files = helm.CHART / "files"
    assert (files / "crd.yaml").read_text() == (MANIFESTS / "compiled" / "crd.yaml").read_text()
    monitoring = MANIFESTS / "monitoring"
    assert (files / "alerts.yaml").read_text() == (monitoring / "alerts.yaml").read_text()
    assert (files / "dashboard.json").read_text() == (monitoring / "dashboard.json").read_text()
    compiler = MANIFESTS / "compiled" / "monitoring" / "alerts.yaml"
    assert (files / "compiler-alerts.yaml").read_text() == compiler.read_text()
    assert chart.TEMPLATE_FILE.read_text() == chart.render()


@pytest.mark.parametrize(
    "values", [pytest.param(p, id=p.stem) for p in sorted(CI.glob("*-values.yaml"))]
)
def test_chart_lints(values: Path) -> None:
    # helm lint cannot say which APIs the cluster serves: the prometheus-operator's objects are
    # left to the render tests (with WITH_ADDONS).
    off = "monitoring.serviceMonitor=false,monitoring.prometheusRule=false"
    helm.run("lint", "--strict", str(helm.CHART), "--values", str(values), "--set", off)


def pod(deployment: Mapping[str, Any]) -> list[dict[str, Any]]:
    containers: list[dict[str, Any]] = deployment["spec"]["template"]["spec"]["containers"]
    return containers


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for k, v in value.items():
            yield from _strings(k)
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def test_renamed_install_carries_its_names_everywhere() -> None:
    """Installed as ``acme-lr`` in ``policy``: no name, namespace, exclusion or identity of the
    default install is left, and each one the parts depend on names the renamed object."""
    docs = helm.template(
        [CI / "renamed-values.yaml"], namespace="policy", upgrade=True, api_versions=WITH_ADDONS
    )
    objects = by_key(docs)
    for key, doc in objects.items():
        namespace, name = key[1], key[2]
        # (The helm test's Role and RoleBinding are in tests.namespace, a judged one.)
        assert namespace in ("", "policy") or hook(doc), key
        assert name.startswith("acme-lr") or key[0] == "CustomResourceDefinition", key
        body = doc if key[0] != "ConfigMap" else {k: v for k, v in doc.items() if k != "data"}
        for text in _strings(body):
            # Left as they are: the parameters' name in each namespace, the product's labels,
            # descriptions and alert texts.
            assert "system:serviceaccount:label-rbac" not in text, (key, text)
            assert "label-rbac.label-rbac" not in text, (key, text)
    compiler = "system:serviceaccount:policy:acme-lr-compiler"
    guards = [
        d for d in docs if d["kind"] == "ValidatingAdmissionPolicy" and compiler in json.dumps(d)
    ]
    assert {g["metadata"]["name"] for g in guards} == {
        "acme-lr-params",
        "acme-lr-marks",
        "acme-lr-mark-owner",
        "acme-lr-params-visible",
        "acme-lr-registration",
    }
    # Every entry and policy leaves the install's own namespace out.
    config = objects[("ValidatingWebhookConfiguration", "", "acme-lr")]
    for entry in config["webhooks"]:
        (own,) = [
            e
            for e in entry["namespaceSelector"]["matchExpressions"]
            if e["key"] == "kubernetes.io/metadata.name"
        ]
        assert own["operator"] == "NotIn" and "policy" in own["values"], entry["name"]
        assert entry["clientConfig"]["service"] == {
            "name": "acme-lr",
            "namespace": "policy",
            "path": "/validate",
            "port": 443,
        }
    for doc in docs:
        if (
            doc["kind"] == "ValidatingAdmissionPolicy"
            and "namespaceSelector" in doc["spec"]["matchConstraints"]
        ):
            (own,) = doc["spec"]["matchConstraints"]["namespaceSelector"]["matchExpressions"][:1]
            assert own["values"] == ["policy", "kube-system"], doc["metadata"]["name"]
    # The label-rule entries let the renamed compiler's writes of its parameters through, and
    # no other identity's.
    for entry in config["webhooks"]:
        if entry["name"].startswith("labels"):
            conditions = {c["name"]: c["expression"] for c in entry["matchConditions"]}
            # The compiled entry folds the shipped entry's skips into one condition.
            skip = conditions.get("skip-compiler") or conditions["shipped-skips"]
            assert f"== '{compiler}'" in skip, entry["name"]
            assert "label-rbac" not in skip, entry["name"]
    # The NetworkPolicies select the renamed webhook's pods.
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    assert {p["metadata"]["name"] for p in policies} == {"acme-lr", "acme-lr-metrics"}
    for policy in policies:
        assert policy["spec"]["podSelector"] == {
            "matchLabels": {"app.kubernetes.io/name": "acme-lr"}
        }
    # The RBAC subjects, the compiler's Lease and registration, the webhook's registration.
    for kind in ("ClusterRoleBinding", "RoleBinding"):
        for key, doc in objects.items():
            if key[0] == kind:
                assert {s["namespace"] for s in doc["subjects"]} == {"policy"}, key
    (compiler_pod,) = pod(objects[("Deployment", "policy", "acme-lr-compiler")])
    assert {
        "--lease-namespace=policy",
        "--lease-name=acme-lr-compiler",
        "--webhook-configuration=acme-lr",
    } <= set(compiler_pod["args"])
    (webhook_pod,) = pod(objects[("Deployment", "policy", "acme-lr")])
    assert "--webhook-configuration=acme-lr" in webhook_pod["args"]
    certificate = objects[("Certificate", "policy", "acme-lr-serving")]
    assert certificate["spec"]["dnsNames"][0] == "acme-lr.policy.svc"
    assert (
        config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == "policy/acme-lr-ca"
    )


# The shipped install's names, and a renamed one's: (values files, namespace, name).
INSTALLS = [
    pytest.param([], "label-rbac", "label-rbac", id="default-names"),
    pytest.param([CI / "renamed-values.yaml"], "policy", "acme-lr", id="renamed"),
]


@pytest.mark.parametrize(("values", "namespace", "name"), INSTALLS)
def test_uninstall_removes_the_policies_the_compiler_wrote(
    values: list[Path], namespace: str, name: str
) -> None:
    """With the compiled rule, a post-delete Job deletes the policies the compiler writes (not
    the release's, so Helm leaves them), by name: its rights are get and delete of those three
    and nothing else. Without it, no such Job."""
    sets = ["compiled.enabled=true"]
    docs = helm.template(values, namespace=namespace, sets=sets, api_versions=WITH_ADDONS)
    hooks = {
        (d["kind"], d["metadata"]["name"]): d
        for d in docs
        if d["metadata"].get("annotations", {}).get("helm.sh/hook") == "post-delete"
    }
    hook = f"{name}-remove-policies"
    assert set(hooks) == {
        (kind, hook) for kind in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Job")
    }
    names = [n.replace(POLICY, name, 1) for n in ACTIONS]
    assert hooks[("ClusterRole", hook)]["rules"] == [
        {
            "apiGroups": ["admissionregistration.k8s.io"],
            "resources": ["validatingadmissionpolicies"],
            "resourceNames": names,
            "verbs": ["get", "delete"],
        }
    ]
    (container,) = hooks[("Job", hook)]["spec"]["template"]["spec"]["containers"]
    assert container["args"] == [
        "delete", "validatingadmissionpolicy", *names, "--ignore-not-found"
    ]  # fmt: skip
    plain = helm.template(
        values, namespace=namespace, sets=["compiled.enabled=false"], api_versions=WITH_ADDONS
    )
    assert not [d for d in plain if "remove-policies" in d["metadata"]["name"]]


@pytest.mark.parametrize(("values", "namespace", "name"), INSTALLS)
def test_the_compilers_policies_are_bound_not_rendered(
    values: list[Path], namespace: str, name: str
) -> None:
    """With the compiled rule and its modes, the chart renders no policy the compiler writes
    (Helm would write it over at every upgrade, or conflict with the compiler), binds each no
    wider than the policy matches (its own namespace left out), and lets the compiler write
    exactly those, by name: no delete, nothing on the bindings."""
    sets = ["compiled.enabled=true", "compiled.modes=true"]
    docs = helm.template(values, namespace=namespace, sets=sets, api_versions=WITH_ADDONS)
    objects = by_key(docs)
    names = {n.replace(POLICY, name, 1): n for n in ACTIONS}
    rendered = {n for k, _, n in objects if k == "ValidatingAdmissionPolicy"}
    assert rendered.isdisjoint(names) and rendered.isdisjoint(ACTIONS)
    for renamed, original in names.items():
        binding = objects[("ValidatingAdmissionPolicyBinding", "", renamed)]["spec"]
        assert binding["policyName"] == renamed
        match = compiled_policy(original)["spec"]["matchConstraints"]
        (own, *others) = match["namespaceSelector"]["matchExpressions"]
        own = {**own, "values": [namespace if v == "label-rbac" else v for v in own["values"]]}
        expected = {**match, "namespaceSelector": {"matchExpressions": [own, *others]}}
        assert binding["matchResources"] == expected
    role = objects[("ClusterRole", "", f"{name}-compiler")]
    on_policies = [
        r for r in role["rules"] for res in r["resources"] if res.startswith("validatingadmission")
    ]
    assert on_policies == [
        {
            "apiGroups": ["admissionregistration.k8s.io"],
            "resources": ["validatingadmissionpolicies"],
            "resourceNames": list(names),
            "verbs": ["get", "list", "watch", "create", "patch"],
        }
    ]


@pytest.mark.parametrize(
    ("upgrade", "sets", "expected"),
    [
        pytest.param(False, [], "Ignore", id="install-fails-open-until-the-hook"),
        pytest.param(True, [], "Fail", id="upgrade-fails-closed"),
        pytest.param(False, ["webhook.failurePolicy=Fail"], "Fail", id="fail-always"),
    ],
)
def test_failure_policy_follows_the_release(upgrade: bool, sets: list[str], expected: str) -> None:
    docs = helm.template(
        [CI / "compiled-values.yaml"], upgrade=upgrade, sets=sets, api_versions=WITH_ADDONS
    )
    (config,) = [d for d in docs if d["kind"] == "ValidatingWebhookConfiguration"]
    policies = {w["name"]: w["failurePolicy"] for w in config["webhooks"]}
    assert policies == {
        "labels.labelrbac.io": expected,
        "labels-compiled.labelrbac.io": expected,
        "rbac.labelrbac.io": expected,
        "nodes.labelrbac.io": expected,
        "pod-status.labelrbac.io": "Ignore",
        "node-objects.labelrbac.io": "Ignore",
    }


@pytest.mark.parametrize(
    "assignment",
    [
        pytest.param("name=Bad_Name", id="name-not-a-dns-label"),
        pytest.param("namespace=kube_system", id="namespace-not-a-dns-label"),
        pytest.param("webhook.failurePolicy=Maybe", id="unknown-failure-policy"),
        pytest.param("mode=deny", id="unknown-mode"),
        pytest.param("image.digest=latest", id="digest-not-sha256"),
        pytest.param("compiled.enable=true", id="misspelt-key"),
        pytest.param("networkPolicy.apiServer.except={10.0.0/8}", id="except-not-a-cidr"),
    ],
)
def test_values_schema_refuses(assignment: str) -> None:
    with pytest.raises(AssertionError, match="values don't meet the specifications"):
        helm.template(sets=[assignment])


@pytest.mark.parametrize(
    ("values", "entries"),
    [
        pytest.param([], ["labels", "rbac", "nodes"], id="default"),
        pytest.param(
            [CI / "compiled-values.yaml"], ["labels", "labels-compiled", "rbac", "nodes"],
            id="compiled-split",
        ),
    ],
)  # fmt: skip
def test_install_hook_switches_the_fail_closed_entries(
    values: Sequence[Path], entries: list[str]
) -> None:
    """The post-install Job patches, at their rendered positions, exactly the entries that fail
    closed, each behind a test of its name; upgrades render no hook (they render Fail)."""
    docs = helm.template(values, api_versions=WITH_ADDONS)
    config = next(d for d in docs if d["kind"] == "ValidatingWebhookConfiguration")
    positions = {w["name"]: i for i, w in enumerate(config["webhooks"])}
    (job,) = [d for d in docs if d["kind"] == "Job" and post_install(d)]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    (patch,) = [a for a in container["args"] if a.startswith("--patch=")]
    operations = json.loads(patch.removeprefix("--patch="))
    expected = []
    for entry in entries:
        i = positions[f"{entry}.labelrbac.io"]
        expected += [
            {"op": "test", "path": f"/webhooks/{i}/name", "value": f"{entry}.labelrbac.io"},
            {"op": "replace", "path": f"/webhooks/{i}/failurePolicy", "value": "Fail"},
        ]
    assert operations == expected
    upgrade = helm.template(values, upgrade=True, api_versions=WITH_ADDONS)
    assert not [d for d in upgrade if post_install(d)]
    fail = helm.template(values, sets=["webhook.failurePolicy=Fail"], api_versions=WITH_ADDONS)
    assert not [d for d in fail if post_install(d)]


def test_certificates_from_an_issuer_or_an_existing_secret() -> None:
    """cert-manager with your issuer: no private CA, the bundle injected from the serving
    certificate; an existing Secret: no cert-manager object, the CA bundle from the values."""
    issued = by_key(
        helm.template(
            sets=[
                "certificates.certManager.issuerRef.name=corp-ca",
                "certificates.certManager.issuerRef.kind=ClusterIssuer",
            ],
            api_versions=[helm.CERT_MANAGER],
        )
    )
    assert [k for k in issued if k[0] in ("Issuer", "Certificate")] == [
        ("Certificate", "label-rbac", "label-rbac-serving")
    ]
    serving = issued[("Certificate", "label-rbac", "label-rbac-serving")]["spec"]
    assert serving["issuerRef"] == {"name": "corp-ca", "kind": "ClusterIssuer"}
    config = issued[("ValidatingWebhookConfiguration", "", "label-rbac")]
    assert config["metadata"]["annotations"] == {
        "cert-manager.io/inject-ca-from": "label-rbac/label-rbac-serving"
    }
    own = by_key(
        helm.template(
            sets=[
                "certificates.source=existingSecret",
                "certificates.existingSecret.name=corp-tls",
                "certificates.existingSecret.caBundle=Q0E=",
            ]
        )
    )
    assert not [k for k in own if k[0] in ("Issuer", "Certificate", "Secret")]
    config = own[("ValidatingWebhookConfiguration", "", "label-rbac")]
    assert "annotations" not in config["metadata"]
    assert {w["clientConfig"]["caBundle"] for w in config["webhooks"]} == {"Q0E="}
    volumes = own[("Deployment", "label-rbac", "label-rbac")]["spec"]["template"]["spec"]["volumes"]
    assert {"name": "tls", "secret": {"secretName": "corp-tls"}} in volumes
    with pytest.raises(AssertionError, match="caBundle is required"):
        helm.template(
            sets=["certificates.source=existingSecret", "certificates.existingSecret.name=x"]
        )


KUBE_SYSTEM = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
    "podSelector": {},
}


@pytest.mark.parametrize(
    ("sets", "peers"),
    [
        pytest.param(
            [],
            [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.244.0.0/16"]}}, KUBE_SYSTEM],
            id="outside-the-pod-network-and-kube-system",
        ),
        pytest.param(
            ["networkPolicy.apiServer.except={10.42.0.0/16,10.43.0.0/16}"],
            [
                {"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.42.0.0/16", "10.43.0.0/16"]}},
                KUBE_SYSTEM,
            ],
            id="your-pod-cidrs",
        ),
        pytest.param(
            [
                "networkPolicy.apiServer.cidr=172.16.0.0/28",
                "networkPolicy.apiServer.except=null",
                "networkPolicy.apiServer.namespaces=null",
                "networkPolicy.apiServer.extraIpBlocks[0].cidr=192.168.0.10/32",
            ],
            [{"ipBlock": {"cidr": "172.16.0.0/28"}}, {"ipBlock": {"cidr": "192.168.0.10/32"}}],
            id="the-control-plane-range-only",
        ),
        pytest.param(["networkPolicy.enabled=false"], None, id="disabled"),
    ],
)
def test_network_policy_admits_what_the_values_say(
    sets: list[str], peers: list[dict[str, Any]] | None
) -> None:
    """Only the sources networkPolicy.apiServer names reach the webhook's port (and Prometheus
    only with a ServiceMonitor)."""
    docs = helm.template(sets=sets)
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    if peers is None:
        assert policies == []
        return
    (policy,) = policies
    (rule,) = policy["spec"]["ingress"]
    assert rule == {"from": peers, "ports": [{"port": "https", "protocol": "TCP"}]}


def test_network_policy_admitting_no_one_is_refused() -> None:
    """A rule with no peer admits every source: the chart refuses to render it."""
    with pytest.raises(AssertionError, match=r"networkPolicy\.apiServer admits no one"):
        helm.template(
            sets=["networkPolicy.apiServer.cidr=", "networkPolicy.apiServer.namespaces=null"]
        )
