"""Mutual TLS on internal gRPC (cluster/internal_tls.py), wired through InternalAuth and
GrpcServer as every service runs them, on loopback:
- a caller with a certificate from the deployment's CA and the secret gets through, and the
  server sees its certificate; a caller without one (plaintext, or another CA's) never reaches a
  handler;
- a caller sends nothing, not even its first call, to a server without a certificate from the CA
  for the host it dials (plaintext, self-signed, another host's), unless the deployment checks one
  shared server name instead;
- health probes present the prober's certificate;
- the flags and their variables: all three files or none, each checked at start with a message
  naming the flag (key of another certificate, another CA, expired, missing), one warning
  without TLS.
"""
import argparse
import asyncio
import logging

import grpc
import pytest

from pdserve.cluster.certificates import CertificateAuthority, write_certificates
from pdserve.cluster.grpc_server import GrpcServer
from pdserve.cluster.health_probe import probe
from pdserve.cluster.internal_auth import SECRET_KEY, InternalAuth
from pdserve.cluster.internal_tls import (TLS_ENV_VARS, InternalTls, InternalTlsFiles, add_internal_tls_arguments,
                                          internal_tls_from)
from pdserve.cluster.service_args import add_internal_auth_arguments, internal_auth_from
from pdserve.protocol.errors import InvalidConfigError

SECRET = b"deployment-secret"
METHOD = "/test.Echo/Call"
SHARED_NAME = "pdserve-internal"


@pytest.fixture(scope="module")
def ca() -> CertificateAuthority:
    return CertificateAuthority("test CA", valid_days=1)


def tls_of(ca: CertificateAuthority, name: str, hosts: list[str], server_name: str | None = None) -> InternalTls:
    issued = ca.issue(name, hosts)
    return InternalTls(ca.cert_pem, issued.cert_pem, issued.key_pem, server_name)


class Recorder(grpc.aio.ServerInterceptor):
    """Notes the metadata of every call that reaches the server, before any check."""

    def __init__(self):
        self.calls: list[dict] = []

    async def intercept_service(self, continuation, details):
        self.calls.append(dict(details.invocation_metadata or ()))
        return await continuation(details)


async def echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    """Answers with the common name of the caller's certificate."""
    return context.auth_context().get("x509_common_name", [b""])[0]


def add_echo(server: grpc.aio.Server) -> None:
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        "test.Echo", {"Call": grpc.unary_unary_rpc_method_handler(echo)})])


async def call(auth: InternalAuth, endpoint: str) -> bytes:
    async with auth.channel(endpoint) as channel:
        return await channel.unary_unary(METHOD)(b"", timeout=5)


async def serve_internal(auth: InternalAuth) -> GrpcServer:
    server = GrpcServer("127.0.0.1:0", [], auth)
    add_echo(server.server)
    await server.start()
    return server


async def serve_impostor(credentials: grpc.ServerCredentials | None) -> tuple[grpc.aio.Server, int, Recorder]:
    """A plain gRPC server answering every method, that records what reaches it."""
    recorder = Recorder()
    server = grpc.aio.server(interceptors=[recorder])
    add_echo(server)
    port = server.add_secure_port("127.0.0.1:0", credentials) if credentials else server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port, recorder


def test_a_caller_with_a_certificate_from_the_ca_and_the_secret_gets_through(ca):
    async def go():
        server = await serve_internal(InternalAuth(SECRET, "decode", tls=tls_of(ca, "decode", ["127.0.0.1"])))
        try:
            return await call(InternalAuth(SECRET, "gw", tls=tls_of(ca, "gateway", ["127.0.0.1"])),
                              f"127.0.0.1:{server.port}")
        finally:
            await server.stop(0)

    assert asyncio.run(go()) == b"gateway"  # and the server saw whose certificate


@pytest.mark.parametrize("caller", ["plaintext", "another CA", "no secret"])
def test_a_caller_without_both_credentials_never_reaches_a_handler(ca, caller):
    stranger_ca = CertificateAuthority("stranger CA", valid_days=1)
    auth = {"plaintext": InternalAuth(SECRET, "x"),
            "another CA": InternalAuth(SECRET, "x", tls=tls_of(stranger_ca, "gateway", ["127.0.0.1"])),
            "no secret": InternalAuth(None, "x", tls=tls_of(ca, "gateway", ["127.0.0.1"]))}[caller]

    async def go():
        server = await serve_internal(InternalAuth(SECRET, "decode", tls=tls_of(ca, "decode", ["127.0.0.1"])))
        try:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await call(auth, f"127.0.0.1:{server.port}")
            return refused.value.code()
        finally:
            await server.stop(0)

    expected = grpc.StatusCode.UNAUTHENTICATED if caller == "no secret" else grpc.StatusCode.UNAVAILABLE
    assert asyncio.run(go()) == expected


@pytest.mark.parametrize("impostor", ["plaintext", "self-signed", "the CA's, for another host"])
def test_a_caller_sends_nothing_to_a_server_without_the_cas_certificate_for_its_host(ca, impostor):
    credentials = {
        "plaintext": None,
        "self-signed": tls_of(CertificateAuthority("impostor", 1), "decode", ["127.0.0.1"]).server_credentials(),
        "the CA's, for another host": tls_of(ca, "decode", ["10.9.9.9", "other.example"]).server_credentials(),
    }[impostor]

    async def go():
        server, port, recorder = await serve_impostor(credentials)
        try:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await call(InternalAuth(SECRET, "gw", tls=tls_of(ca, "gateway", ["127.0.0.1"])), f"127.0.0.1:{port}")
            return refused.value.code(), recorder.calls
        finally:
            await server.stop(0)

    code, calls = asyncio.run(go())
    assert code == grpc.StatusCode.UNAVAILABLE
    assert calls == []  # the secret never left the caller


def test_the_same_recorder_sees_a_caller_that_trusts_it(ca):
    """The impostor above records calls that do reach it, secret included."""
    impostor_tls = tls_of(ca, "decode", ["127.0.0.1"])

    async def go():
        server, port, recorder = await serve_impostor(impostor_tls.server_credentials())
        try:
            await call(InternalAuth(SECRET, "gw", tls=tls_of(ca, "gateway", ["127.0.0.1"])), f"127.0.0.1:{port}")
            return recorder.calls
        finally:
            await server.stop(0)

    (metadata,) = asyncio.run(go())
    assert metadata[SECRET_KEY] == SECRET


def test_a_shared_server_name_is_checked_in_place_of_the_host_dialled(ca):
    async def go(server_name: str | None):
        server = await serve_internal(InternalAuth(SECRET, "decode", tls=tls_of(ca, "decode", [SHARED_NAME])))
        try:
            return await call(InternalAuth(SECRET, "gw", tls=tls_of(ca, "gateway", [SHARED_NAME], server_name)),
                              f"127.0.0.1:{server.port}")
        finally:
            await server.stop(0)

    assert asyncio.run(go(SHARED_NAME)) == b"gateway"
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        asyncio.run(go(None))  # 127.0.0.1 is not what the certificate names
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    with pytest.raises(grpc.aio.AioRpcError):
        asyncio.run(go("another-name"))


def test_a_probe_presents_the_probers_certificate(ca):
    async def go():
        server = await serve_internal(InternalAuth(SECRET, "decode", tls=tls_of(ca, "decode", ["127.0.0.1"])))
        await server.mark_serving()
        target = f"127.0.0.1:{server.port}"
        try:
            prober = tls_of(ca, "up", ["127.0.0.1"])
            return [await asyncio.to_thread(probe, target, 5.0, tls) for tls in (prober, None)]
        finally:
            await server.stop(0)

    with_certificate, without = asyncio.run(go())
    assert with_certificate.ready and with_certificate.detail == "SERVING"
    assert not without.ready


def parse(argv: list[str], environ: dict[str, str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_internal_tls_arguments(parser, environ or {})
    return parser.parse_args(argv)


@pytest.fixture
def files(tmp_path) -> dict[str, InternalTlsFiles]:
    return write_certificates(tmp_path / "certs", ["decode", "gateway"], ["127.0.0.1"], valid_days=1)


def flags(paths: InternalTlsFiles) -> list[str]:
    return ["--internal-tls-ca", str(paths.ca_path), "--internal-tls-cert", str(paths.cert_path),
            "--internal-tls-key", str(paths.key_path)]


def test_the_files_come_from_flags_or_their_variables(files):
    paths = files["decode"]
    from_flags = internal_tls_from(parse(flags(paths)))
    assert from_flags.cert_pem == paths.cert_path.read_bytes() and from_flags.server_name is None
    from_env = internal_tls_from(parse([], paths.env(SHARED_NAME)))
    assert from_env == InternalTls(paths.ca_path.read_bytes(), paths.cert_path.read_bytes(),
                                   paths.key_path.read_bytes(), SHARED_NAME)
    assert set(paths.env(SHARED_NAME)) == set(TLS_ENV_VARS)
    assert internal_tls_from(parse([])) is None


def test_some_files_but_not_all_is_an_error(files):
    with pytest.raises(InvalidConfigError, match="all of"):
        internal_tls_from(parse(flags(files["decode"])[:4]))
    with pytest.raises(InvalidConfigError, match="--internal-tls-server-name"):
        internal_tls_from(parse(["--internal-tls-server-name", SHARED_NAME]))


def test_a_key_of_another_certificate_is_refused_at_start(files):
    mixed = InternalTlsFiles(files["decode"].ca_path, files["decode"].cert_path, files["gateway"].key_path)
    with pytest.raises(InvalidConfigError, match="--internal-tls-key .* is not the key of --internal-tls-cert"):
        internal_tls_from(parse(flags(mixed)))


def test_a_certificate_from_another_ca_is_refused_at_start(files, tmp_path):
    other = write_certificates(tmp_path / "other", ["decode"], ["127.0.0.1"], valid_days=1)["decode"]
    mixed = InternalTlsFiles(files["decode"].ca_path, other.cert_path, other.key_path)
    with pytest.raises(InvalidConfigError, match="not issued by --internal-tls-ca"):
        internal_tls_from(parse(flags(mixed)))


def test_an_expired_certificate_is_refused_at_start(tmp_path):
    expired = write_certificates(tmp_path, ["decode"], ["127.0.0.1"], valid_days=-0.001)["decode"]
    with pytest.raises(InvalidConfigError, match="valid from"):
        internal_tls_from(parse(flags(expired)))


def test_a_missing_or_empty_file_names_its_flag(files, tmp_path):
    (tmp_path / "empty.pem").write_text("\n")
    for flag, path in (("--internal-tls-ca", tmp_path / "absent.pem"), ("--internal-tls-cert", tmp_path / "empty.pem")):
        argv = flags(files["decode"])
        argv[argv.index(flag) + 1] = str(path)
        with pytest.raises(InvalidConfigError, match=flag):
            internal_tls_from(parse(argv))


def test_a_service_with_tls_files_runs_mutual_tls_and_does_not_warn(files, monkeypatch, caplog):
    for name in TLS_ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PDSERVE_INTERNAL_SECRET", "s")
    parser = argparse.ArgumentParser()
    add_internal_auth_arguments(parser)
    with caplog.at_level(logging.WARNING):
        auth = internal_auth_from(parser.parse_args(flags(files["decode"])), "decode")
    assert auth.tls is not None and auth.server_credentials() is not None
    assert caplog.records == []
    assert InternalAuth(b"s").server_credentials() is None  # without TLS the port is plaintext

