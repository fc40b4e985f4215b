"""The rotation of the chart's own certificates, its pure parts: what is due, which CAs the
bundle keeps, which CA keys load (the API server side: tests/kube/test_chart.py)."""

from __future__ import annotations

import datetime

import pytest
from cryptography import x509

from app.webhook.certs import Authority
from app.webhook.rotation import _bundle, _due, _signed_by

NOW = datetime.datetime.now(datetime.UTC)
DAY = datetime.timedelta(days=1)


@pytest.mark.parametrize(
    ("days", "renew_before", "due"),
    [
        pytest.param(365, 30, False, id="far-from-expiry"),
        pytest.param(20, 30, True, id="within-the-window"),
        pytest.param(29, 30, True, id="a-day-inside"),
    ],
)
def test_due_within_renew_before(days: int, renew_before: int, due: bool) -> None:
    cert = Authority.create(days).cert
    assert _due(cert, NOW, renew_before * DAY) is due


def test_bundle_keeps_valid_cas_once_in_order_and_drops_expired() -> None:
    new, old = Authority.create(365, "x-ca"), Authority.create(365, "x-ca")
    expired = Authority.create(1, "x-ca")
    later = NOW + 2 * DAY  # the one-day CA has expired by then
    bundle = _bundle([new.pem(), old.pem() + expired.pem(), new.pem()], later)
    assert [c.serial_number for c in x509.load_pem_x509_certificates(bundle)] == [
        new.cert.serial_number, old.cert.serial_number
    ]  # fmt: skip
    assert _bundle([b"", b"\n"], NOW) == b""


def test_a_serving_certificate_is_signed_by_its_ca_only() -> None:
    ca, other = Authority.create(30, "x-ca"), Authority.create(30, "x-ca")
    cert = x509.load_pem_x509_certificate(ca.issue(["x.ns.svc"], 10)[0])
    assert _signed_by(cert, ca.cert) and not _signed_by(cert, other.cert)


def test_a_ca_loads_only_with_its_own_key() -> None:
    ca, other = Authority.create(30), Authority.create(30)
    assert Authority.load(ca.pem(), ca.key_pem()).cert == ca.cert
    with pytest.raises(ValueError, match="does not belong"):
        Authority.load(ca.pem(), other.key_pem())
