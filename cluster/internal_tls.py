"""Mutual TLS on internal gRPC: a connection joins two holders of certificates from the
deployment's CA, or none at all.

Every internal server (prefill, decode with its KVTransfer) speaks TLS only and requires the
caller's certificate; every internal caller (gateway, prefill pushing KV, health probes)
presents its own. Each side checks the other's chain against the deployment's CA alone, never
the system's roots. A caller also checks that the server's certificate names the host it dials
(an IP address against the certificate's IP SANs), or, where certificates are issued before
addresses are known (pod IPs, container names), that it names `server_name`, the same for every
server. So a process that binds a dead replica's port, without a certificate from the CA, is
never sent a call, and the secret in the calls' metadata (cluster/internal_auth.py) travels
encrypted.

Files are read, and checked (the key matches the certificate, the CA issued it, it has not
expired), once, at start: a bad one stops the start with a message naming its flag. A renewed
certificate takes a restart.
"""
from __future__ import annotations

import argparse
import datetime
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.exceptions import InvalidSignature

from pdserve.protocol.errors import InvalidConfigError

CA_ENV = "PDSERVE_INTERNAL_TLS_CA"
CERT_ENV = "PDSERVE_INTERNAL_TLS_CERT"
KEY_ENV = "PDSERVE_INTERNAL_TLS_KEY"
SERVER_NAME_ENV = "PDSERVE_INTERNAL_TLS_SERVER_NAME"
TLS_ENV_VARS = (CA_ENV, CERT_ENV, KEY_ENV, SERVER_NAME_ENV)


@dataclass(frozen=True, slots=True)
class InternalTls:
    ca_pem: bytes  # the deployment's CA: the one issuer trusted, on both ends
    cert_pem: bytes  # this process's certificate (then any intermediates)
    key_pem: bytes
    server_name: str | None = None  # what a server's certificate must name; None: the host dialled

    def server_credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials([(self.key_pem, self.cert_pem)], root_certificates=self.ca_pem,
                                           require_client_auth=True)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(root_certificates=self.ca_pem, private_key=self.key_pem,
                                            certificate_chain=self.cert_pem)

    def channel_options(self) -> list[tuple[str, str]]:
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []


@dataclass(frozen=True, slots=True)
class InternalTlsFiles:
    ca_path: Path
    cert_path: Path
    key_path: Path

    def env(self, server_name: str | None = None) -> dict[str, str]:
        """The variables that hand these files (and `server_name`) to a pdserve service."""
        env = {CA_ENV: str(self.ca_path), CERT_ENV: str(self.cert_path), KEY_ENV: str(self.key_path)}
        return env | ({SERVER_NAME_ENV: server_name} if server_name else {})

    def load(self, server_name: str | None = None) -> InternalTls:
        """The files' contents, checked; InvalidConfigError naming the flag of a bad one."""
        ca_pem = _read(self.ca_path, "--internal-tls-ca")
        cert_pem = _read(self.cert_path, "--internal-tls-cert")
        key_pem = _read(self.key_path, "--internal-tls-key")
        try:
            ssl.create_default_context().load_cert_chain(self.cert_path, self.key_path)
        except ssl.SSLError as error:
            raise InvalidConfigError(f"--internal-tls-key {self.key_path} is not the key of --internal-tls-cert "
                                     f"{self.cert_path}: {error}") from error
        try:
            cas = x509.load_pem_x509_certificates(ca_pem)
            chain = x509.load_pem_x509_certificates(cert_pem)
        except ValueError as error:
            raise InvalidConfigError(f"--internal-tls-ca / --internal-tls-cert: not PEM certificates: {error}") \
                from error
        _check_chain(chain, cas, self.cert_path)
        return InternalTls(ca_pem, cert_pem, key_pem, server_name)


def add_internal_tls_arguments(parser: argparse.ArgumentParser, environ: Mapping[str, str] = os.environ) -> None:
    parser.add_argument("--internal-tls-ca", type=Path, default=environ.get(CA_ENV), metavar="PEM",
                        help=f"the deployment's CA certificate: internal gRPC runs on mutual TLS, and a peer's "
                             f"certificate must come from this CA (default: ${CA_ENV}; with none of the three "
                             f"files internal gRPC is plaintext)")
    parser.add_argument("--internal-tls-cert", type=Path, default=environ.get(CERT_ENV), metavar="PEM",
                        help=f"this process's certificate, issued by --internal-tls-ca; a replica's must name the "
                             f"host it advertises, or --internal-tls-server-name (default: ${CERT_ENV})")
    parser.add_argument("--internal-tls-key", type=Path, default=environ.get(KEY_ENV), metavar="PEM",
                        help=f"the private key of --internal-tls-cert (default: ${KEY_ENV})")
    parser.add_argument("--internal-tls-server-name", default=environ.get(SERVER_NAME_ENV), metavar="NAME",
                        help=f"check that every internal server's certificate names NAME, instead of the host "
                             f"dialled: for certificates issued before replicas' addresses are known "
                             f"(default: ${SERVER_NAME_ENV})")


def internal_tls_from(args: argparse.Namespace) -> InternalTls | None:
    """The process's internal TLS from its flags, checked; None where no file is given."""
    paths = (args.internal_tls_ca, args.internal_tls_cert, args.internal_tls_key)
    if all(path is None for path in paths):
        if args.internal_tls_server_name:
            raise InvalidConfigError("--internal-tls-server-name needs --internal-tls-ca, -cert and -key")
        return None
    if any(path is None for path in paths):
        raise InvalidConfigError("give all of --internal-tls-ca, --internal-tls-cert and --internal-tls-key "
                                 f"(or ${CA_ENV}, ${CERT_ENV}, ${KEY_ENV}), or none")
    return InternalTlsFiles(*paths).load(args.internal_tls_server_name or None)


def _read(path: Path, flag: str) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as error:
        raise InvalidConfigError(f"{flag} {path}: {error.strerror}") from error
    if not data.strip():
        raise InvalidConfigError(f"{flag} {path} is empty")
    return data


def _check_chain(chain: list[x509.Certificate], cas: list[x509.Certificate], cert_path: Path) -> None:
    """Each certificate of `chain` is issued by the next, the last by one of `cas`; none expired."""
    now = datetime.datetime.now(datetime.timezone.utc)
    for cert in chain:
        if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
            raise InvalidConfigError(f"--internal-tls-cert {cert_path}: {cert.subject.rfc4514_string()} is valid "
                                     f"from {cert.not_valid_before_utc} to {cert.not_valid_after_utc} only")
    for cert, issuer in zip(chain, chain[1:]):
        if not _issued_by(cert, issuer):
            raise InvalidConfigError(f"--internal-tls-cert {cert_path}: {cert.subject.rfc4514_string()} is not "
                                     f"issued by the next certificate in the file")
    if not any(_issued_by(chain[-1], ca) for ca in cas):
        raise InvalidConfigError(f"--internal-tls-cert {cert_path} is not issued by --internal-tls-ca")


def _issued_by(cert: x509.Certificate, issuer: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(issuer)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True
