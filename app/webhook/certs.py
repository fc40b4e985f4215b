"""TLS material: the serving certificate as the server loads it, and dev/test certificates.

``ServingCertificate`` loads the certificate and key files as one pair and keeps serving the last
good pair until a new one loads whole, so files rotated on disk (a Secret volume refreshed by
the kubelet) are picked up without a restart and without a handshake against a half-written or
mismatched pair. ``generate`` and ``issue`` make a CA and serving certificates for a laptop or
a test run (``gen-certs``, ``--dev-tls``); clusters use cert-manager (manifests/deploy).
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import os
import ssl
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.types import CertificateIssuerPrivateKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class CertPaths:
    ca: Path
    cert: Path
    key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _san(names: list[str]) -> x509.SubjectAlternativeName:
    entries: list[x509.GeneralName] = []
    for name in names:
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            entries.append(x509.DNSName(name))
    return x509.SubjectAlternativeName(entries)


@dataclass(frozen=True)
class Authority:
    """A CA that can sign serving certificates (kept in memory: dev and tests only)."""

    cert: x509.Certificate
    key: CertificateIssuerPrivateKeyTypes

    @classmethod
    def create(cls, days: int = 365, common_name: str = "label-rbac development CA") -> Authority:
        now = datetime.datetime.now(datetime.UTC)
        key = ec.generate_private_key(ec.SECP256R1())
        name = _name(common_name)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(key, hashes.SHA256())
        )
        return cls(cert, key)

    @classmethod
    def load(cls, cert_pem: bytes, key_pem: bytes) -> Authority:
        """A CA kept as PEM (the chart's Secret ``<name>-ca``); ``ValueError`` if it is not one
        whose key signs."""
        cert = x509.load_pem_x509_certificate(cert_pem)
        key = serialization.load_pem_private_key(key_pem, password=None)
        if not isinstance(key, (ec.EllipticCurvePrivateKey, rsa.RSAPrivateKey)):
            raise ValueError("the CA's key is neither EC nor RSA")
        if _public(key.public_key()) != _public(cert.public_key()):
            raise ValueError("the CA's key does not belong to its certificate")
        return cls(cert, key)

    def pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def key_pem(self) -> bytes:
        return self.key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    def issue(self, dns_names: list[str], days: int = 365) -> tuple[bytes, bytes]:
        """A serving certificate for ``dns_names``: (certificate PEM, private key PEM)."""
        now = datetime.datetime.now(datetime.UTC)
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(dns_names[0]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(_san(dns_names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        key_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        return cert.public_bytes(serialization.Encoding.PEM), key_pem


def generate(out: Path, dns_names: list[str], days: int = 365) -> CertPaths:
    """Write ca.crt, tls.crt and tls.key (serving cert for ``dns_names``, signed by a new CA)."""
    out.mkdir(parents=True, exist_ok=True)
    authority = Authority.create(days)
    cert_pem, key_pem = authority.issue(dns_names, days)
    paths = CertPaths(out / "ca.crt", out / "tls.crt", out / "tls.key")
    paths.ca.write_bytes(authority.pem())
    paths.cert.write_bytes(cert_pem)
    paths.key.touch(mode=0o600)
    paths.key.write_bytes(key_pem)
    return paths


# --- serving ------------------------------------------------------------------------------


class CertificateError(ValueError):
    """The certificate or key cannot be served; the message is one line for an operator."""


@dataclass(frozen=True)
class LoadedPair:
    context: ssl.SSLContext
    serial: int
    not_after: datetime.datetime


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise CertificateError(f"cannot read the TLS {what} {path}: {exc.strerror}") from None


def _public(key: object) -> bytes:
    return key.public_bytes(  # type: ignore[attr-defined]
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def load_pair(cert_path: Path, key_path: Path) -> LoadedPair:
    """A server SSLContext from the two files, checked to belong together.

    Both files are read once, checked with cryptography (PEM, a certificate, an unencrypted key,
    the key matching the first certificate), then loaded into OpenSSL from those same bytes, so
    what is checked is what is served.
    """
    cert_pem, key_pem = _read(cert_path, "certificate"), _read(key_path, "key")
    try:
        chain = x509.load_pem_x509_certificates(cert_pem)
    except ValueError:
        raise CertificateError(
            f"the TLS certificate {cert_path} is not a PEM certificate"
        ) from None
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError):
        raise CertificateError(
            f"the TLS key {key_path} is not an unencrypted PEM private key"
        ) from None
    if _public(chain[0].public_key()) != _public(key.public_key()):
        raise CertificateError(
            f"the TLS key {key_path} does not belong to the certificate in {cert_path}"
        )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain(context, cert_pem.rstrip(b"\n") + b"\n" + key_pem)
    return LoadedPair(context, chain[0].serial_number, chain[0].not_valid_after_utc)


def _load_chain(context: ssl.SSLContext, pem: bytes) -> None:
    """OpenSSL reads certificates from a path only: hand it an in-memory file where possible."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("label-rbac-tls", os.MFD_CLOEXEC)
        try:
            os.write(fd, pem)
            context.load_cert_chain(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)
        return
    with tempfile.NamedTemporaryFile(prefix="label-rbac-tls-") as handle:
        handle.write(pem)
        handle.flush()
        context.load_cert_chain(handle.name)


Stamp = tuple[tuple[int, int, int, int] | None, ...]


def _stamp(*paths: Path) -> Stamp:
    """Identity of the files as they are now (symlinks followed, as the kubelet swaps them)."""
    stamps: list[tuple[int, int, int, int] | None] = []
    for path in paths:
        try:
            st = path.stat()
        except OSError:
            stamps.append(None)
        else:
            stamps.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(stamps)


class ServingCertificate:
    """The current server SSLContext, reloaded when the files change, never half-loaded.

    ``context()`` is called for every new connection: it costs two ``stat`` calls while the
    files are unchanged. A change is loaded by one thread while the others keep handing out the
    previous context. A pair that fails to load is retried on the next connection while the
    files are still moving, and otherwise reported once and skipped until they change again.
    """

    def __init__(self, cert: Path, key: Path, log: logging.Logger | None = None) -> None:
        self._paths = (cert, key)
        self._log = log or logging.getLogger("label_rbac.tls")
        self._lock = threading.Lock()
        stamp = _stamp(cert, key)
        self._current = load_pair(cert, key)
        self._loaded: Stamp = stamp
        self._failed: Stamp | None = None

    @property
    def serial(self) -> int:
        return self._current.serial

    def context(self) -> ssl.SSLContext:
        stamp = _stamp(*self._paths)
        if stamp != self._loaded and stamp != self._failed and self._lock.acquire(blocking=False):
            try:
                self._reload(stamp)
            finally:
                self._lock.release()
        return self._current.context

    def _reload(self, stamp: Stamp) -> None:
        try:
            loaded = load_pair(*self._paths)
        except (CertificateError, ssl.SSLError) as exc:
            if _stamp(*self._paths) == stamp:
                # Not a rotation caught half-way: the files on disk are bad.
                self._failed = stamp
                self._log.error("keeping the previous TLS certificate: %s", exc)
            return
        self._current, self._loaded, self._failed = loaded, stamp, None
        self._log.info(
            "serving TLS certificate serial %x (valid until %s)",
            loaded.serial,
            loaded.not_after.isoformat(),
        )
