"""Certificates for the TLS tests, made with ``cryptography``: a cluster CA, node
certificates for 127.0.0.1, one from another CA, an expired one, one not valid yet, one
for another name. EC keys (P-256): quick to make."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

DAY = datetime.timedelta(days=1)


@dataclass
class Cert:
    cert: Path
    key: Path


@dataclass
class Pki:
    ca: Path
    a: Cert
    b: Cert
    other_ca: Path
    foreign: Cert  # signed by the other CA
    expired: Cert
    not_yet: Cert
    other_name: Cert  # for other.example (and 127.0.0.2)


def _key():
    return ec.generate_private_key(ec.SECP256R1())


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _ca(cn: str):
    key = _key()
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(_name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - DAY)
        .not_valid_after(now + 30 * DAY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _leaf(ca, cn: str, names: list, before: datetime.timedelta, after: datetime.timedelta):
    ca_cert, ca_key = ca
    key = _key()
    now = datetime.datetime.now(datetime.timezone.utc)
    sans = [x509.IPAddress(ipaddress.ip_address(n)) if n[0].isdigit() else x509.DNSName(n) for n in names]
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now + before)
        .not_valid_after(now + after)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH, x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return cert, key


def _write_cert(path: Path, cert) -> Path:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


def _write(folder: Path, name: str, pair) -> Cert:
    cert, key = pair
    k = folder / f"{name}.key"
    k.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    k.chmod(0o600)
    return Cert(_write_cert(folder / f"{name}.crt", cert), k)


def make_pki(folder: Path) -> Pki:
    """Writes every certificate and key of the tests into ``folder``."""
    ca = _ca("handoff test CA")
    other = _ca("another CA")
    local = ["127.0.0.1", "localhost"]
    return Pki(
        ca=_write_cert(folder / "ca.crt", ca[0]),
        a=_write(folder, "a", _leaf(ca, "node-a", local, -DAY, 30 * DAY)),
        b=_write(folder, "b", _leaf(ca, "node-b", local, -DAY, 30 * DAY)),
        other_ca=_write_cert(folder / "other-ca.crt", other[0]),
        foreign=_write(folder, "foreign", _leaf(other, "foreign", local, -DAY, 30 * DAY)),
        expired=_write(folder, "expired", _leaf(ca, "expired", local, -10 * DAY, -2 * DAY)),
        not_yet=_write(folder, "not-yet", _leaf(ca, "not-yet", local, 2 * DAY, 10 * DAY)),
        other_name=_write(folder, "other-name", _leaf(ca, "other", ["other.example", "127.0.0.2"], -DAY, 30 * DAY)),
    )
