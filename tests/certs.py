"""Certificates the TLS tests make for themselves: a CA, a server certificate for 127.0.0.1 /
localhost and a client certificate, all signed by that CA (nothing comes from elsewhere)."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))


def make_pki(folder: Path) -> Pki:
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(_name("evenflow test CA"))
          .issuer_name(_name("evenflow test CA")).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))

    def leaf(name: str, usage: x509.ObjectIdentifier, path: Path,
             san: list[x509.GeneralName] | None = None) -> Path:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (x509.CertificateBuilder().subject_name(_name(name)).issuer_name(ca.subject)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.ExtendedKeyUsage([usage]), critical=False))
        if san:
            builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_path = path.with_suffix(".key")
        _write_key(key, key_path)
        return key_path

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    server_key = leaf("127.0.0.1", ExtendedKeyUsageOID.SERVER_AUTH, folder / "server.pem",
                      [x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                       x509.DNSName("localhost")])
    client_key = leaf("evenflow test client", ExtendedKeyUsageOID.CLIENT_AUTH,
                      folder / "client.pem")
    return Pki(folder / "ca.pem", folder / "server.pem", server_key, folder / "client.pem",
               client_key)
