"""The chart across releases and clusters: values files of earlier releases (what ``helm upgrade
--reuse-values`` renders with), the version bumped with every change, the labels of Helm's
conventions on every object, the generated files in step with values.yaml, and the optional
APIs (cert-manager, the prometheus-operator) used where served and refused by name where not.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

import app
from tests import helm
from tests.support import ROOT

CHART_DIR = "charts/label-rbac"
CI = helm.CHART / "ci"
WITH_ADDONS = (helm.CERT_MANAGER, *helm.PROMETHEUS_OPERATOR, helm.POLICY_REPORTS)
# The paths of the chart whose change is a change of what it installs.
RENDERED = ("templates", "files", "values.yaml", "values.schema.json", "Chart.yaml")


def hook(document: Mapping[str, Any]) -> bool:
    return "helm.sh/hook" in document["metadata"].get("annotations", {})


def git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"no git history here: git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def chart_yaml(text: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(text)
    return loaded


def chart_at(commit: str, into: Path) -> Path:
    """The chart as committed at ``commit``, extracted into ``into``."""
    archive = subprocess.run(
        ["git", "archive", commit, CHART_DIR], cwd=ROOT, capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / CHART_DIR


def with_values(tmp: Path, values: Mapping[str, Any]) -> Path:
    """A copy of the chart whose values.yaml is ``values``: what ``helm upgrade --reuse-values``
    renders (the new chart, with the upgraded release's values in place of its defaults)."""
    copy = tmp / "label-rbac"
    shutil.copytree(helm.CHART, copy)
    (copy / "values.yaml").write_text(yaml.safe_dump(dict(values)))
    return copy


def without_secrets(documents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in documents if d["kind"] != "Secret"]


# --- values of earlier releases -------------------------------------------------------------


def earlier_values() -> Iterator[Any]:
    commits = git("log", "--format=%h", "--", f"{CHART_DIR}/values.yaml").split()
    for commit in commits:
        yield pytest.param(commit, id=commit)


@pytest.mark.parametrize("commit", list(earlier_values()))
@pytest.mark.parametrize(
    "upgrade", [pytest.param(True, id="upgrade"), pytest.param(False, id="install")]
)
def test_values_of_an_earlier_release_render_as_given_over_the_defaults(
    commit: str, upgrade: bool, tmp_path: Path
) -> None:
    """The chart with an earlier release's values.yaml in place of its own (``--reuse-values``)
    renders what it renders with those values given over its defaults: every key added since
    takes its default."""
    old = yaml.safe_load(git("show", f"{commit}:{CHART_DIR}/values.yaml"))
    reused = helm.template(
        chart=with_values(tmp_path, old), upgrade=upgrade, api_versions=WITH_ADDONS
    )
    given = tmp_path / "given.yaml"
    given.write_text(yaml.safe_dump(old))
    assert reused == helm.template([given], upgrade=upgrade, api_versions=WITH_ADDONS)


def _delete(values: dict[str, Any], path: str) -> dict[str, Any]:
    found = json.loads(json.dumps(values))
    *parents, leaf = path.split(".")
    target = found
    for part in parents:
        target = target[part]
    del target[leaf]
    return found


# Sections a user sets as a whole: a key of theirs left out (or nulled) stays out, so only the
# whole section missing takes the defaults (templates/_helpers.tpl, label-rbac.fill).
WHOLE = ("networkPolicy.apiServer", "networkPolicy.prometheus", "webhook.resources",
         "compiled.resources", "certificates.certManager.issuerRef", "securityContext",
         "podSecurityContext")  # fmt: skip


def missing_keys() -> Iterator[Any]:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import chart_values
    finally:
        sys.path.pop(0)
    paths = [p for p, _, _ in chart_values.rows((helm.CHART / "values.yaml").read_text())]
    seen: set[str] = set()
    for path in paths:
        whole = next((w for w in WHOLE if path == w or path.startswith(w + ".")), None)
        key = whole or path
        if key not in seen:
            seen.add(key)
            yield pytest.param(key, id=key)
    for top in sorted({p.split(".")[0] for p in paths if "." in p}):
        yield pytest.param(top, id=f"{top}-whole")


@pytest.mark.parametrize("path", list(missing_keys()))
def test_a_missing_key_takes_its_default(path: str, tmp_path: Path) -> None:
    """Every key of values.yaml (and every section) left out renders as its default."""
    values = yaml.safe_load((helm.CHART / "values.yaml").read_text())
    rendered = helm.template(
        chart=with_values(tmp_path, _delete(values, path)), api_versions=WITH_ADDONS, upgrade=True
    )
    assert rendered == helm.template(api_versions=WITH_ADDONS, upgrade=True)


def test_every_template_fills_the_values_first() -> None:
    """The fill runs before any template reads .Values (each file renders on its own)."""
    for template in sorted((helm.CHART / "templates").rglob("*")):
        if template.suffix in (".yaml", ".txt"):
            first = template.read_text().splitlines()[0]
            assert first == '{{- include "label-rbac.fill" . }}', template.name


# --- versions -----------------------------------------------------------------------------


def rendered_from(chart: Path) -> dict[str, bytes]:
    """What the chart renders from, by path: its templates, files, values and schema, and
    Chart.yaml but for its version and annotations."""
    found = {
        str(p.relative_to(chart)): p.read_bytes()
        for part in RENDERED
        for p in sorted((chart / part).rglob("*") if (chart / part).is_dir() else [chart / part])
        if p.is_file() and p.name != "Chart.yaml"
    }
    meta = chart_yaml((chart / "Chart.yaml").read_text())
    kept = {k: v for k, v in meta.items() if k not in ("version", "annotations")}
    found["Chart.yaml"] = json.dumps(kept, sort_keys=True).encode()
    return found


def test_chart_changes_bump_its_version(tmp_path: Path) -> None:
    """What the chart renders from is what it was at the last commit that changed its version,
    or its version is higher than that commit's."""
    # Main's own history: a branch merged there counts as changed where main took it in.
    log = git(
        "log",
        "--first-parent",
        "-m",
        "-G",
        r"^version:",
        "--format=%H",
        "--",
        f"{CHART_DIR}/Chart.yaml",
    )
    last = log.split()[0]
    released = chart_at(last, tmp_path)
    before, now = rendered_from(released), rendered_from(helm.CHART)
    changed = sorted(p for p in before.keys() | now.keys() if before.get(p) != now.get(p))
    version = chart_yaml((helm.CHART / "Chart.yaml").read_text())["version"]
    released_version = chart_yaml((released / "Chart.yaml").read_text())["version"]
    if changed:
        assert semver(version) > semver(released_version), (
            f"{', '.join(changed)} changed since {last[:7]} (version {released_version}): "
            "bump version in Chart.yaml and say what changed in CHANGELOG.md and "
            "artifacthub.io/changes"
        )


def semver(text: str) -> tuple[int, int, int]:
    match = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)", text)
    assert match, f"{text}: not MAJOR.MINOR.PATCH"
    major, minor, patch = (int(g) for g in match.groups())
    return major, minor, patch


def test_versions_agree() -> None:
    """The chart's appVersion is the app's version, the image's build argument and the
    overlays' image tag; the CHANGELOG and artifacthub.io/changes say what this version did."""
    meta = chart_yaml((helm.CHART / "Chart.yaml").read_text())
    semver(meta["version"])
    assert meta["appVersion"] == app.__version__
    assert f"ARG VERSION={app.__version__}\n" in (ROOT / "Dockerfile").read_text()
    for deployment in ("deploy", "compiled", "reports"):
        text = (ROOT / "manifests" / deployment / "deployment.yaml").read_text()
        assert f"image: label-rbac:{app.__version__}\n" in text, deployment
    changelog = (helm.CHART / "CHANGELOG.md").read_text()
    assert f"\n## {meta['version']}\n" in changelog
    changes = yaml.safe_load(meta["annotations"]["artifacthub.io/changes"])
    kinds = ("added", "changed", "fixed", "removed", "security", "deprecated")
    assert changes and all(c["kind"] in kinds and c["description"] for c in changes)
    for key in ("home", "sources", "maintainers", "icon"):
        assert meta[key], key


# --- conventions ----------------------------------------------------------------------------

CONVENTIONS = helm.CONVENTIONS


@pytest.mark.parametrize(
    ("values", "sets", "apis", "upgrade"),
    [
        pytest.param([], [], (), False, id="default-install-bare-cluster"),
        pytest.param([], [], WITH_ADDONS, True, id="default-upgrade-with-cert-manager"),
        pytest.param([CI / "compiled-values.yaml"], [], WITH_ADDONS, False,
                     id="compiled-monitoring"),
        pytest.param([CI / "renamed-values.yaml"], [], WITH_ADDONS, True, id="renamed"),
        pytest.param([CI / "no-narrowing-values.yaml"], [], (), False, id="no-narrowing"),
        pytest.param([], ["certificates.source=existingSecret",
                          "certificates.existingSecret.name=t",
                          "certificates.existingSecret.caBundle=Q0E="], (), False,
                     id="existing-secret"),
        pytest.param([], ["compiled.enabled=true", "compiled.modes=true", "reports.enabled=true"],
                     [helm.POLICY_REPORTS], False, id="compiled-modes-reports"),
    ],
)  # fmt: skip
def test_every_object_is_labeled(
    values: Sequence[Path], sets: list[str], apis: Sequence[str], upgrade: bool
) -> None:
    """Helm's conventions on every object (and every pod template) of every combination."""
    meta = chart_yaml((helm.CHART / "Chart.yaml").read_text())
    docs = helm.template(values, sets=sets, api_versions=apis, upgrade=upgrade)
    assert docs
    for doc in docs:
        where = (doc["kind"], doc["metadata"]["name"])
        metas = [doc["metadata"]]
        template = doc.get("spec", {}).get("template")
        if isinstance(template, dict):
            metas.append(template["metadata"])
        for found in metas:
            labels = found.get("labels", {})
            assert set(CONVENTIONS) <= set(labels), (where, labels)
            assert labels["app.kubernetes.io/instance"] == "label-rbac", where
            assert labels["app.kubernetes.io/managed-by"] == "Helm", where
            assert labels["app.kubernetes.io/part-of"] == "label-rbac", where
            assert labels["app.kubernetes.io/version"] == meta["appVersion"], where
            assert labels["helm.sh/chart"] == f"label-rbac-{meta['version']}", where


def test_pod_settings_from_values() -> None:
    """podAnnotations, podLabels, securityContext, podSecurityContext, extraEnv on every pod
    of the chart's Deployments; serviceAccount.annotations on their ServiceAccounts."""
    sets = [
        "podAnnotations.a=b", "podLabels.team=platform",
        "podLabels.app\\.kubernetes\\.io/name=overridden",
        "securityContext.runAsUser=1234", "podSecurityContext.fsGroup=2000",
        "extraEnv[0].name=HTTPS_PROXY", "extraEnv[0].value=http://proxy:3128",
        "serviceAccount.annotations.iam=role", "compiled.enabled=true", "reports.enabled=true",
    ]  # fmt: skip
    docs = helm.template(sets=sets, api_versions=[helm.POLICY_REPORTS])
    deployments = [d for d in docs if d["kind"] == "Deployment"]
    assert {d["metadata"]["name"] for d in deployments} == {
        "label-rbac", "label-rbac-compiler", "label-rbac-reporter"
    }  # fmt: skip
    for deployment in deployments:
        template = deployment["spec"]["template"]
        assert template["metadata"]["annotations"] == {"a": "b"}
        labels = template["metadata"]["labels"]
        assert labels["team"] == "platform"
        # The selector's label stays the chart's.
        selector = deployment["spec"]["selector"]["matchLabels"]
        assert labels["app.kubernetes.io/name"] == selector["app.kubernetes.io/name"]
        # Given over the defaults (which stay unless nulled).
        assert template["spec"]["securityContext"]["fsGroup"] == 2000
        assert template["spec"]["securityContext"]["runAsNonRoot"] is True
        for container in template["spec"]["containers"]:
            assert container["securityContext"]["runAsUser"] == 1234
            assert container["securityContext"]["readOnlyRootFilesystem"] is True
            assert {"name": "HTTPS_PROXY", "value": "http://proxy:3128"} in container["env"]
    accounts = [d for d in docs if d["kind"] == "ServiceAccount" and not hook(d)]
    assert {a["metadata"]["name"] for a in accounts} == {
        "label-rbac", "label-rbac-compiler", "label-rbac-reporter", "label-rbac-certs"
    }  # fmt: skip
    for account in accounts:
        assert account["metadata"]["annotations"] == {"iam": "role"}


def test_generated_files_agree_with_values() -> None:
    """templates/_defaults.tpl and the README's values table are what scripts/chart_values.py
    writes from values.yaml."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "chart_values.py"), "--check"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    readme = (helm.CHART / "README.md").read_text()
    for key in ("certificates.source", "networkPolicy.apiServer.except", "podLabels"):
        assert f"| `{key}` |" in readme, key


# --- optional APIs ------------------------------------------------------------------------


def test_bare_cluster_gets_the_charts_own_certificates() -> None:
    """Without cert-manager, auto: the CA and serving certificate in Secrets, the registration's
    every entry carrying the CA bundle that verifies the serving certificate; no cert-manager
    object (which such a cluster would refuse)."""
    docs = helm.template()
    kinds = {d["kind"] for d in docs}
    assert not kinds & {"Issuer", "Certificate"}
    secrets = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Secret"}
    assert set(secrets) == {"label-rbac-ca", "label-rbac-tls"}
    tls = {k: base64.b64decode(v) for k, v in secrets["label-rbac-tls"]["data"].items()}
    (config,) = [d for d in docs if d["kind"] == "ValidatingWebhookConfiguration"]
    assert "annotations" not in config["metadata"]
    bundles = {w["clientConfig"]["caBundle"] for w in config["webhooks"]}
    assert len(bundles) == 1
    bundle = base64.b64decode(bundles.pop())
    assert bundle == tls["ca.crt"]
    helm.verifies(bundle, tls["tls.crt"], "label-rbac.label-rbac.svc")
    (webhook,) = [
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "label-rbac"
    ]
    volumes = webhook["spec"]["template"]["spec"]["volumes"]
    assert {"name": "tls", "secret": {"secretName": "label-rbac-tls"}} in volumes
    # The post-install hook waits for no CA injection (nothing injects it).
    (job,) = [d for d in docs if d["kind"] == "Job"]
    assert [c["name"] for c in job["spec"]["template"]["spec"]["initContainers"]] == [
        "webhook-available"
    ]


def test_auto_uses_cert_manager_where_served() -> None:
    docs = helm.template(api_versions=[helm.CERT_MANAGER])
    kinds = [d["kind"] for d in docs]
    assert kinds.count("Certificate") == 2 and "Secret" not in kinds
    (config,) = [d for d in docs if d["kind"] == "ValidatingWebhookConfiguration"]
    assert config["metadata"]["annotations"] == {
        "cert-manager.io/inject-ca-from": "label-rbac/label-rbac-ca"
    }
    assert all("caBundle" not in w["clientConfig"] for w in config["webhooks"])


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        pytest.param(["certificates.source=certManager"],
                     r"serves no cert-manager.io/v1: install cert-manager .*certificates.source",
                     id="cert-manager"),
        pytest.param(["monitoring.serviceMonitor=true", "narrowing.enabled=false"],
                     r"serves no monitoring.coreos.com/v1 ServiceMonitor: install the "
                     r"prometheus-operator .*monitoring.serviceMonitor=false",
                     id="service-monitor"),
        pytest.param(["monitoring.serviceMonitor=true"],
                     r"serves no monitoring.coreos.com/v1 PodMonitor: .*"
                     r"monitoring.serviceMonitor=false", id="pod-monitor"),
        pytest.param(["reports.enabled=true"],
                     r"serves no wgpolicyk8s.io/v1alpha2: install the report CRDs .*"
                     r"reports.enabled=false", id="policy-reports"),
        pytest.param(["monitoring.prometheusRule=true"],
                     r"serves no monitoring.coreos.com/v1 PrometheusRule: install the "
                     r"prometheus-operator .*monitoring.prometheusRule=false",
                     id="prometheus-rule"),
    ],
)  # fmt: skip
def test_an_absent_optional_api_fails_the_render_by_name(sets: list[str], message: str) -> None:
    """Asked for and not served: the render fails saying what to install or which value to
    change (not Helm's "no matches for kind" half-way through an install)."""
    with pytest.raises(AssertionError, match=message):
        helm.template(sets=sets)
    # Served, the same values render.
    assert helm.template(sets=sets, api_versions=WITH_ADDONS)
