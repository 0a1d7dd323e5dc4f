"""TLS on the gateway's fronts (`--tls-cert`, `--tls-key`): a client that trusts the
certificate gets the offline engine's greedy output over HTTPS and over gRPC with TLS; a
plaintext client gets nothing from either port."""
import asyncio
import ssl
import urllib.error
from http.client import HTTPException

import grpc
import pytest

from pdserve.v1 import gateway_pb2_grpc
from tests.system.faults.front_clients import (
    completion_body, greedy_request, http, offline_greedy, scrape, self_signed_certificate, wait_until)

pytestmark = pytest.mark.faults

PROMPT = [11, 200, 31, 4, 4, 90]
MAX_TOKENS = 10


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    return self_signed_certificate(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def tls_gateway(make_cluster, certificate):
    """Replicas as usual, then a gateway on TLS, ready when HTTPS /health answers 200."""
    cluster = make_cluster([("decode", "d0", ()), ("prefill", "p0", ())])
    gateway = cluster.start("gateway", "gw", "--tls-cert", str(certificate.cert_path),
                            "--tls-key", str(certificate.key_path))

    def healthy() -> bool:
        assert gateway.process.poll() is None, gateway.log_tail()
        try:
            return http(f"https://127.0.0.1:{gateway.http_port}/health", context=certificate.client_context(),
                        timeout_s=1).status == 200
        except OSError:
            return False

    wait_until(healthy, "the TLS gateway to answer /health", timeout_s=120)
    return cluster


@pytest.fixture(scope="module")
def reference(e2e_model):
    return offline_greedy(e2e_model, [PROMPT], MAX_TOKENS)[0]


async def generate(channel: grpc.aio.Channel) -> list[int]:
    token_ids = []
    async for chunk in gateway_pb2_grpc.GatewayStub(channel).Generate(
            greedy_request("", PROMPT, MAX_TOKENS), timeout=60):
        token_ids += chunk.token_ids
    return token_ids


def test_a_client_that_trusts_the_certificate_gets_greedy_output_over_https_and_grpc_tls(
        tls_gateway, certificate, reference):
    gateway = tls_gateway.gateway

    async def over_tls() -> list[int]:
        credentials = grpc.ssl_channel_credentials(root_certificates=certificate.pem)
        async with grpc.aio.secure_channel(gateway.endpoint, credentials) as channel:
            return await generate(channel)

    assert asyncio.run(over_tls()) == reference.token_ids
    base = f"https://127.0.0.1:{gateway.http_port}"
    answer = http(base + "/v1/completions", completion_body(PROMPT, MAX_TOKENS), context=certificate.client_context())
    assert answer.status == 200, answer
    assert answer.json()["choices"][0]["text"] == reference.text
    assert scrape(base + "/metrics", context=certificate.client_context())
    tls_gateway.assert_all_kv_free()


def test_a_plaintext_client_gets_nothing_from_either_port(tls_gateway):
    gateway = tls_gateway.gateway

    async def plaintext() -> list[int]:
        async with grpc.aio.insecure_channel(gateway.endpoint) as channel:
            return await generate(channel)

    with pytest.raises(grpc.aio.AioRpcError) as refused:
        asyncio.run(plaintext())
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    with pytest.raises((urllib.error.URLError, HTTPException, ConnectionError)):
        http(f"http://127.0.0.1:{gateway.http_port}/v1/completions", completion_body(PROMPT, MAX_TOKENS), timeout_s=10)
    untrusting = ssl.create_default_context()  # the system's CAs, which never signed ours
    with pytest.raises(urllib.error.URLError) as untrusted:
        http(f"https://127.0.0.1:{gateway.http_port}/health", context=untrusting, timeout_s=10)
    assert "CERTIFICATE_VERIFY_FAILED" in str(untrusted.value)
