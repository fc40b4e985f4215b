"""The Helm binary and the chart: ``helm template`` and ``helm lint`` of ``charts/label-rbac``.

Where helm comes from, as ``tests.kube.controlplane`` finds the API server: ``$HELM`` (a binary),
else the official v4.1.4 archive beside the repository (``../shared/helm/``), unpacked once into
``.cache/helm/`` (not in git) and checked against its published sha256. Without it the chart's
tests skip; in CI (``$CI=true`` or ``$LABEL_RBAC_REQUIRE_KUBE=1``) they fail instead.
"""

from __future__ import annotations

import datetime
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.exceptions import InvalidSignature

from tests.kube.controlplane import Unavailable, unpack
from tests.support import ROOT

VERSION = "v4.1.4"
ARCHIVE = ROOT.parent / "shared" / "helm" / f"helm-{VERSION}-linux-amd64.xz"
# The decompressed binary's sha256, as published beside the archive (../shared/helm/README.md).
SHA256 = "210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"
CACHE = ROOT / ".cache" / "helm"
CHART = ROOT / "charts" / "label-rbac"
# The optional APIs the chart uses where the cluster serves them.
CERT_MANAGER = "cert-manager.io/v1"
MONITORING_KINDS = ("ServiceMonitor", "PodMonitor", "PrometheusRule")
PROMETHEUS_OPERATOR = tuple(f"monitoring.coreos.com/v1/{kind}" for kind in MONITORING_KINDS)
POLICY_REPORTS = "wgpolicyk8s.io/v1alpha2"


def binary() -> Path:
    """The helm to run: ``$HELM``, or the shared archive unpacked once (sha256 checked)."""
    configured = os.environ.get("HELM")
    if configured:
        if not os.access(configured, os.X_OK):
            raise Unavailable(f"$HELM={configured} is not an executable file")
        return Path(configured)
    unpacked = CACHE / "helm"
    if unpacked.is_file() and os.access(unpacked, os.X_OK):
        return unpacked
    if not ARCHIVE.is_file():
        raise Unavailable(
            f"no helm: set $HELM to a helm binary, or put {ARCHIVE.name} in {ARCHIVE.parent}"
        )
    return unpack(ARCHIVE, unpacked, SHA256)


def required() -> bool:
    """Whether a missing helm fails the run (CI) rather than skips it."""
    return os.environ.get("CI") == "true" or os.environ.get("LABEL_RBAC_REQUIRE_KUBE") == "1"


def helm_or_skip() -> Path:
    try:
        return binary()
    except Unavailable as exc:
        if required():
            pytest.fail(f"helm is required in CI: {exc}")
        pytest.skip(str(exc))


def run(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> str:
    """``helm ARGS``: its standard output; a failure raises with helm's message."""
    done = subprocess.run(
        [str(helm_or_skip()), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    if done.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def template(
    values: Sequence[Path] = (),
    namespace: str = "label-rbac",
    upgrade: bool = False,
    sets: Sequence[str] = (),
    api_versions: Sequence[str] = (),
    chart: Path = CHART,
) -> list[dict[str, Any]]:
    """The objects ``helm template`` renders (as ``helm install``, or with ``upgrade`` as
    ``helm upgrade``) for these values files and ``--set`` assignments, on a cluster serving
    the built-in APIs and ``api_versions`` (e.g. ``CERT_MANAGER``)."""
    args = ["template", "label-rbac", str(chart), "--namespace", namespace]
    for api in api_versions:
        args += ["--api-versions", api]
    for path in values:
        args += ["--values", str(path)]
    for assignment in sets:
        args += ["--set", assignment]
    if upgrade:
        args.append("--is-upgrade")
    documents = [doc for doc in yaml.safe_load_all(run(*args)) if doc]
    for document in documents:
        labeled(document)
    return documents


# Helm's and Kubernetes' recommended labels, on every object the chart renders.
CONVENTIONS = ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/version",
               "app.kubernetes.io/component", "app.kubernetes.io/part-of",
               "app.kubernetes.io/managed-by", "helm.sh/chart")  # fmt: skip


def labeled(document: dict[str, Any]) -> None:
    """``document`` and its pod template (a Deployment's, a Job's, a CronJob's) carry every
    label of ``CONVENTIONS``: checked on every render of every test."""
    where = (document["kind"], document["metadata"]["name"])
    spec = document.get("spec") or {}
    templates = [spec.get("template"), spec.get("jobTemplate", {}).get("spec", {}).get("template")]
    for meta in [document["metadata"], *(t["metadata"] for t in templates if t)]:
        missing = set(CONVENTIONS) - set(meta.get("labels") or {})
        assert not missing, f"{where}: no {sorted(missing)}"


def verifies(bundle: bytes, cert_pem: bytes, hostname: str) -> None:
    """``cert_pem`` (PEM) was signed by a CA of ``bundle`` (PEM certificates), is valid now and
    names ``hostname``: what the API server checks of the webhook's serving certificate."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    now = datetime.datetime.now(datetime.UTC)
    assert cert.not_valid_before_utc <= now < cert.not_valid_after_utc
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert hostname in names.get_values_for_type(x509.DNSName)
    signers = []
    for ca in x509.load_pem_x509_certificates(bundle):
        try:
            cert.verify_directly_issued_by(ca)  # the names match and the CA's key signed it
        except (ValueError, TypeError, InvalidSignature):
            continue
        assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
        assert ca.not_valid_before_utc <= now < ca.not_valid_after_utc
        signers.append(ca)
    assert signers, "no CA of the bundle signed the serving certificate"
