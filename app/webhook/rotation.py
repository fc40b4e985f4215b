"""Rotation of the CA and serving certificate the chart keeps itself (``certificates.source:
generated``): run by the chart's CronJob (``python -m app.webhook.rotation``).

The Secrets ``<name>-ca`` (the CA: ``tls.crt``, ``tls.key``) and ``<name>-tls`` (the serving
pair and ``ca.crt``, the bundle) are read; a certificate within ``--renew-before-days`` of its
expiry (or not signed by the current CA) is issued again, a CA with a new serving certificate.
The order keeps every handshake verifiable: a new CA is written, then added to the bundle of
every entry of the registration (beside the previous CAs still valid), and only then the serving
certificate it signs goes into the Secret the pods read (the webhook reloads it without a
restart: ``certs.ServingCertificate``). Each write carries the resourceVersion it read, so two
runs cannot interleave. Nothing is logged of the keys.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import logging
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization

from app.source.api import KubeClient, KubeError
from app.webhook.certs import Authority

log = logging.getLogger("label-rbac.rotation")

NOT_AFTER = "labelrbac.io/not-after"
STRATEGIC = "application/strategic-merge-patch+json"
DAY = datetime.timedelta(days=1)


@dataclass(frozen=True)
class Settings:
    namespace: str
    name: str  # the name prefix: Secrets <name>-ca and <name>-tls, the Service <name>
    webhook_configuration: str
    days: int
    ca_days: int
    renew_before_days: int


def _decode(secret: Mapping[str, Any], key: str) -> bytes:
    data = secret.get("data") or {}
    return base64.b64decode(data.get(key, ""))


def _due(cert: x509.Certificate, now: datetime.datetime, renew_before: datetime.timedelta) -> bool:
    return cert.not_valid_after_utc - now < renew_before


def _signed_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (InvalidSignature, ValueError, TypeError):
        return False
    return True


def _bundle(pems: Sequence[bytes], now: datetime.datetime) -> bytes:
    """The CAs still valid, each once, in order."""
    kept: list[bytes] = []
    for pem in pems:
        for cert in x509.load_pem_x509_certificates(pem) if pem.strip() else []:
            if cert.not_valid_after_utc > now:
                encoded = cert.public_bytes(serialization.Encoding.PEM)
                if encoded not in kept:
                    kept.append(encoded)
    return b"".join(kept)


def _secret_path(settings: Settings, suffix: str) -> str:
    return f"/api/v1/namespaces/{settings.namespace}/secrets/{settings.name}-{suffix}"


def _write(client: KubeClient, path: str, secret: dict[str, Any], data: dict[str, bytes],
           not_after: datetime.datetime) -> None:  # fmt: skip
    """The Secret with ``data``, its expiry annotated, replaced at the resourceVersion read."""
    body = dict(secret)
    metadata = dict(body["metadata"])
    metadata["annotations"] = {
        **(metadata.get("annotations") or {}),
        NOT_AFTER: str(int(not_after.timestamp())),
    }
    body["metadata"] = metadata
    body["data"] = {k: base64.b64encode(v).decode() for k, v in data.items()}
    client.send("PUT", path, body)


def rotate(client: KubeClient, settings: Settings, now: datetime.datetime) -> list[str]:
    """One pass; what it renewed (``["ca", "serving"]``, ``["serving"]`` or ``[]``)."""
    renew_before = settings.renew_before_days * DAY
    ca_path, tls_path = _secret_path(settings, "ca"), _secret_path(settings, "tls")
    ca_secret, tls_secret = client.get(ca_path), client.get(tls_path)
    authority = Authority.load(_decode(ca_secret, "tls.crt"), _decode(ca_secret, "tls.key"))
    serving = x509.load_pem_x509_certificate(_decode(tls_secret, "tls.crt"))
    done: list[str] = []
    bundle = _decode(tls_secret, "ca.crt")
    if _due(authority.cert, now, renew_before):
        previous = authority.pem()
        authority = Authority.create(settings.ca_days, f"{settings.name}-ca")
        _write(client, ca_path, ca_secret,
               {"tls.crt": authority.pem(), "tls.key": authority.key_pem()},
               authority.cert.not_valid_after_utc)  # fmt: skip
        bundle = _bundle([authority.pem(), previous, bundle], now)
        done.append("ca")
    else:
        bundle = _bundle([authority.pem(), bundle], now)
    if done or _due(serving, now, renew_before) or not _signed_by(serving, authority.cert):
        # The bundle the API server verifies with first, then the certificate it verifies.
        _patch_bundle(client, settings, bundle)
        dns = [f"{settings.name}.{settings.namespace}.svc",
               f"{settings.name}.{settings.namespace}.svc.cluster.local"]  # fmt: skip
        cert_pem, key_pem = authority.issue(dns, settings.days)
        issued = x509.load_pem_x509_certificate(cert_pem)
        _write(client, tls_path, tls_secret,
               {"tls.crt": cert_pem, "tls.key": key_pem, "ca.crt": bundle},
               issued.not_valid_after_utc)  # fmt: skip
        done.append("serving")
    return done


def _patch_bundle(client: KubeClient, settings: Settings, bundle: bytes) -> None:
    """Every entry of the registration verifies with ``bundle``."""
    path = (
        "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/"
        f"{settings.webhook_configuration}"
    )
    config = client.get(path)
    encoded = base64.b64encode(bundle).decode()
    entries = [{"name": w["name"], "clientConfig": {"caBundle": encoded}}
               for w in config.get("webhooks") or []]  # fmt: skip
    client.send("PATCH", path, {"webhooks": entries}, content_type=STRATEGIC)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m app.webhook.rotation",
        description="renew the chart's own CA and serving certificate before they expire",
    )
    parser.add_argument("--namespace", required=True, help="the Secrets' namespace")
    parser.add_argument("--name", required=True, help="the name prefix (<name>-ca, <name>-tls)")
    parser.add_argument("--webhook-configuration", required=True, help="the registration")
    parser.add_argument("--days", type=int, default=730, help="a serving certificate's days")
    parser.add_argument("--ca-days", type=int, default=3650, help="a CA's days")
    parser.add_argument("--renew-before-days", type=int, default=180,
                        help="renew what expires within this many days")  # fmt: skip
    parser.add_argument("--kubeconfig", type=Path, help="default: in-cluster")
    return parser


def main(argv: Sequence[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = _parser().parse_args(argv)
    if min(args.days, args.ca_days, args.renew_before_days) < 1:
        print("--days, --ca-days and --renew-before-days must be >= 1", file=sys.stderr)
        return 2
    settings = Settings(args.namespace, args.name, args.webhook_configuration, args.days,
                        args.ca_days, args.renew_before_days)  # fmt: skip
    try:
        client = KubeClient.connect(args.kubeconfig, in_cluster=args.kubeconfig is None)
        done = rotate(client, settings, datetime.datetime.now(datetime.UTC))
    except (KubeError, ValueError) as exc:
        log.error("rotation failed: %s", exc)
        return 1
    log.info("renewed: %s", ", ".join(done) if done else "nothing (not due)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
