"""A deployment on mutual TLS end to end: gateways, a prefill and a decode replica as separate
processes, each with its own certificate from the deployment's CA (--internal-tls-* through
their environment), a real Redis.

- Requests through the gateway give transformers' greedy tokens, with KV moving over the gRPC
  stream and over shared memory (whose reservations and commits are gRPC calls too).
- Every internal port speaks mutual TLS only: a probe or a call without a certificate, or with
  one from another CA, gets nothing, even with the deployment secret; with the deployment's
  certificate it gets through.
- No service warns that it runs without internal TLS.
"""
import asyncio

import grpc
import pytest

from pdserve.cluster.certificates import CertificateAuthority
from pdserve.cluster.health_probe import probe
from pdserve.cluster.internal_auth import InternalAuth
from pdserve.cluster.internal_tls import InternalTls
from pdserve.v1 import common_pb2, decode_pb2, decode_pb2_grpc
from tests.system.test_disaggregated import stream_all

pytestmark = pytest.mark.e2e

CASES = [([5, 17, 230, 41, 9], 12), (list(range(3, 140)), 6), ([901], 9), ([(i * 37) % 500 + 3 for i in range(60)], 10)]
TRANSPORTS = {"gw-grpc": common_pb2.TRANSPORT_GRPC, "gw-shm": common_pb2.TRANSPORT_SHM}


@pytest.fixture(scope="module")
def cluster(make_cluster):
    return make_cluster([
        ("decode", "d0", ()),
        ("prefill", "p0", ()),
        ("gateway", "gw-grpc", ("--transport", "grpc", "--prefill-placement", "remote")),
        ("gateway", "gw-shm", ("--transport", "shm", "--prefill-placement", "remote")),
    ], internal_tls=True)


def service(cluster, name):
    return next(s for s in cluster.services if s.name == name)


@pytest.mark.parametrize("gateway", sorted(TRANSPORTS))
def test_greedy_output_over_mutual_tls_is_transformers(cluster, gateway, e2e_model, hf_greedy):
    results = asyncio.run(stream_all(service(cluster, gateway).endpoint, CASES))  # the public front: plaintext
    assert [token_ids for token_ids, _, _ in results] == hf_greedy(e2e_model, CASES)
    assert {info.transport for _, _, info in results} == {TRANSPORTS[gateway]}
    cluster.assert_all_kv_free()


def stranger_tls() -> InternalTls:
    """A certificate for 127.0.0.1 from a CA the deployment does not know."""
    ca = CertificateAuthority("stranger CA", valid_days=1)
    issued = ca.issue("gateway", ["127.0.0.1"])
    return InternalTls(ca.cert_pem, issued.cert_pem, issued.key_pem)


async def reserve(auth: InternalAuth, endpoint: str) -> grpc.StatusCode:
    async with auth.channel(endpoint) as channel:
        try:
            await decode_pb2_grpc.DecodeStub(channel).Reserve(decode_pb2.ReserveRequest(
                request_id="tls-probe", num_prompt_tokens=16, transport=common_pb2.TRANSPORT_SHM), timeout=20)
            return grpc.StatusCode.OK
        except grpc.aio.AioRpcError as error:
            return error.code()


async def abort(cluster, request_id: str) -> None:
    async with cluster.internal_channel(service(cluster, "d0")) as channel:
        await decode_pb2_grpc.DecodeStub(channel).Abort(decode_pb2.DecodeAbortRequest(request_id=request_id),
                                                        timeout=20)


def test_internal_ports_take_only_callers_with_a_certificate_from_the_deployments_ca(cluster):
    secret = cluster.internal_secret.encode()
    for name in ("d0", "p0"):
        endpoint = service(cluster, name).endpoint
        assert probe(endpoint, 5.0, cluster.client_tls).ready, name
        assert not probe(endpoint, 5.0).ready, name
        assert not probe(endpoint, 5.0, stranger_tls()).ready, name
    decode = service(cluster, "d0").endpoint
    assert asyncio.run(reserve(InternalAuth(secret, "plaintext"), decode)) == grpc.StatusCode.UNAVAILABLE
    assert asyncio.run(reserve(InternalAuth(secret, "stranger", tls=stranger_tls()), decode)) == \
        grpc.StatusCode.UNAVAILABLE
    assert asyncio.run(reserve(InternalAuth(secret, "e2e-test", tls=cluster.client_tls), decode)) == \
        grpc.StatusCode.OK
    asyncio.run(abort(cluster, "tls-probe"))
    cluster.assert_all_kv_free()


def test_no_service_warns_that_it_runs_without_internal_tls(cluster):
    for started in cluster.services:
        log = started.log_tail(400)
        assert "no internal TLS" not in log, started.name
        assert "no internal secret" not in log, started.name
