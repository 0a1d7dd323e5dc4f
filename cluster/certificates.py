"""A deployment's own certificate authority and the certificates it issues its processes, for
mutual TLS on internal gRPC (cluster/internal_tls.py).

Each process gets a certificate of its own, signed by the CA, good for both ends of a connection
(serverAuth and clientAuth), whose subject alternative names are the hosts callers dial it by:
an IP address becomes an IP SAN, anything else a DNS name. Keys are ECDSA P-256: fast to make,
which `pdserve up` does for every run. The CA's private key never leaves this process: it signs
what `write_certificates` writes, and is dropped, so no one can issue another certificate into
the deployment afterwards; adding a process means issuing the deployment's set anew.

Files: `ca.pem` (the CA certificate, which every process trusts), and per process `NAME.pem` (its
certificate) and `NAME-key.pem` (its key, readable by its owner alone), in a folder only its
owner may enter.
"""
from __future__ import annotations

import datetime
import ipaddress
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from pdserve.cluster.internal_tls import InternalTlsFiles

CA_FILE = "ca.pem"
CLOCK_SKEW_S = 300  # a certificate is valid from this long before it is made, for hosts whose clocks lag


@dataclass(frozen=True, slots=True)
class IssuedCertificate:
    cert_pem: bytes
    key_pem: bytes  # PKCS#8, unencrypted: a service reads it at start with no one to type a passphrase


class CertificateAuthority:
    """A fresh CA (its own key, self-signed), valid for `valid_days`."""

    def __init__(self, name: str, valid_days: float):
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self._valid_days = valid_days
        public_key = self._key.public_key()
        self._cert = (
            _builder(self._name, self._name, public_key, valid_days)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
            .sign(self._key, hashes.SHA256()))

    @property
    def cert_pem(self) -> bytes:
        return self._cert.public_bytes(serialization.Encoding.PEM)

    def issue(self, name: str, hosts: Sequence[str]) -> IssuedCertificate:
        """A new key and its certificate: common name `name`, a SAN for each of `hosts`."""
        if not hosts:
            raise ValueError(f"certificate {name!r} needs at least one host")
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            _builder(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]), self._name, key.public_key(),
                     self._valid_days)
            .add_extension(x509.SubjectAlternativeName([_general_name(host) for host in hosts]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                         crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), critical=False)
            .sign(self._key, hashes.SHA256()))
        return IssuedCertificate(
            cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))


def write_certificates(out_dir: Path, names: Sequence[str], hosts: Sequence[str],
                       valid_days: float) -> dict[str, InternalTlsFiles]:
    """A new CA's `ca.pem` and, for each of `names`, a certificate covering `hosts` and its key, in
    `out_dir` (made if missing, mode 0700); each name's three files. Refuses to overwrite a file
    (FileExistsError) and a name that is not a plain file name (ValueError)."""
    for name in names:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name) or name == CA_FILE.removesuffix(".pem"):
            raise ValueError(f"{name!r} cannot name a certificate: letters, digits, '_', '.', '-' only, not 'ca'")
    ca = CertificateAuthority("pdserve internal CA", valid_days)
    out_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    out_dir.chmod(0o700)
    ca_path = _write_new(out_dir / CA_FILE, ca.cert_pem, 0o644)
    files = {}
    for name in names:
        issued = ca.issue(name, hosts)
        files[name] = InternalTlsFiles(ca_path, _write_new(out_dir / f"{name}.pem", issued.cert_pem, 0o644),
                                       _write_new(out_dir / f"{name}-key.pem", issued.key_pem, 0o600))
    return files


def _builder(subject: x509.Name, issuer: x509.Name, public_key, valid_days: float) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.timezone.utc)
    return (x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(issuer)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(seconds=CLOCK_SKEW_S))
            .not_valid_after(now + datetime.timedelta(days=valid_days)))


def _general_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _write_new(path: Path, data: bytes, mode: int) -> Path:
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode), "wb") as file:
        file.write(data)
    return path
