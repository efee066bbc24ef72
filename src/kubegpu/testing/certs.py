"""The certificates and keys a loopback control plane needs, generated fresh for every `up`.

One CA signs the API server's serving certificate (127.0.0.1, localhost, the in-cluster service names) and the admin
client certificate (group `system:masters`, so RBAC lets the tests do anything); a separate key signs service-account
tokens. Everything is written with owner-only permissions into the control plane's directory.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_FOR = datetime.timedelta(days=7)
ADMIN_USER = "kubegpu-admin"
ADMIN_GROUP = "system:masters"


@dataclass(frozen=True)
class Pki:
    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    admin_cert: Path
    admin_key: Path
    sa_public: Path
    sa_private: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _name(common: str, organization: str | None = None) -> x509.Name:
    parts = [x509.NameAttribute(NameOID.COMMON_NAME, common)]
    if organization:
        parts.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(parts)


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    path.chmod(0o600)
    return path


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _certificate(subject: x509.Name, key: ec.EllipticCurvePrivateKey, issuer: x509.Name,
                 issuer_key: ec.EllipticCurvePrivateKey, ca: bool, usages: list[x509.ObjectIdentifier],
                 sans: list[x509.GeneralName]) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALID_FOR)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=not ca,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=ca, crl_sign=ca,
                                     encipher_only=False, decipher_only=False), critical=True)
    )
    if usages:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def generate(directory: Path) -> Pki:
    """Write a CA, serving and admin certificates and a service-account key pair into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    pem = serialization.Encoding.PEM
    ca_key = _key()
    ca_name = _name("kubegpu-test-ca")
    ca = _certificate(ca_name, ca_key, ca_name, ca_key, True, [], [])
    serving_key = _key()
    sans: list[x509.GeneralName] = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                    x509.IPAddress(ipaddress.ip_address("10.0.0.1")), x509.DNSName("localhost"),
                                    x509.DNSName("kubernetes"), x509.DNSName("kubernetes.default"),
                                    x509.DNSName("kubernetes.default.svc")]
    serving = _certificate(_name("kube-apiserver"), serving_key, ca_name, ca_key, False,
                           [ExtendedKeyUsageOID.SERVER_AUTH], sans)
    admin_key = _key()
    admin = _certificate(_name(ADMIN_USER, ADMIN_GROUP), admin_key, ca_name, ca_key, False,
                         [ExtendedKeyUsageOID.CLIENT_AUTH], [])
    sa_key = _key()
    return Pki(
        ca_cert=_write(directory / "ca.crt", ca.public_bytes(pem)),
        ca_key=_write(directory / "ca.key", _pem_key(ca_key)),
        serving_cert=_write(directory / "apiserver.crt", serving.public_bytes(pem)),
        serving_key=_write(directory / "apiserver.key", _pem_key(serving_key)),
        admin_cert=_write(directory / "admin.crt", admin.public_bytes(pem)),
        admin_key=_write(directory / "admin.key", _pem_key(admin_key)),
        sa_public=_write(directory / "sa.pub", sa_key.public_key().public_bytes(
            pem, serialization.PublicFormat.SubjectPublicKeyInfo)),
        sa_private=_write(directory / "sa.key", _pem_key(sa_key)),
    )
