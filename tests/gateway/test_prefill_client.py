"""PrefillClient against a Prefill servicer on loopback whose push fails after the first token,
raised as the prefill replica raises it (through cluster.grpc_errors): a failure the replica puts
on the decode side reaches the gateway as a KVTransferError, one on its own side as a plain
UNAVAILABLE BackendError of the prefill replica."""
import asyncio

import grpc
import pytest

from pdserve.cluster.grpc_errors import grpc_errors
from pdserve.gateway.disaggregated.backend_errors import BackendError, KVTransferError
from pdserve.gateway.disaggregated.replica_clients import PrefillClient, Timeouts
from pdserve.protocol.errors import PrefillKVError, TransferError
from pdserve.protocol.sampling_params import SamplingParams
from pdserve.v1 import kv_transfer_pb2, prefill_pb2, prefill_pb2_grpc

DEADLINE_S = 5.0


class FailingPush(prefill_pb2_grpc.PrefillServicer):
    """Samples token 7, then fails its push with `error`."""

    def __init__(self, error: Exception):
        self.error = error

    @grpc_errors
    async def Run(self, request, context):
        yield prefill_pb2.PrefillEvent(first_token=prefill_pb2.FirstToken(token_id=7))
        raise self.error


def first_token_then_transfer(error: Exception):
    async def go():
        server = grpc.aio.server()
        prefill_pb2_grpc.add_PrefillServicer_to_server(FailingPush(error), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                run = PrefillClient("p0", "p0:1", channel, Timeouts()).run(
                    "r1", [1, 2, 3], [], SamplingParams(max_tokens=4), 0, kv_transfer_pb2.KVTarget())
                first = await run.first_token()
                try:
                    await run.transfer_done()
                except BackendError as exc:
                    return first.token_id, exc
                raise AssertionError("the transfer did not fail")
        finally:
            await server.stop(None)
    return asyncio.run(asyncio.wait_for(go(), DEADLINE_S))


def test_a_push_the_decode_side_failed_is_a_kv_transfer_error_reported_by_the_prefill_replica():
    token_id, error = first_token_then_transfer(
        TransferError("KV push of request r1 to 127.0.0.1:9 failed: NOT_FOUND: no reservation"))
    assert token_id == 7
    assert isinstance(error, KVTransferError) and error.grpc_code == grpc.StatusCode.UNAVAILABLE
    assert error.replica_id == "p0" and "NOT_FOUND: no reservation" in str(error)


@pytest.mark.parametrize("error", [PrefillKVError("prefill side: KV cache of the wrong shape"),
                                   RuntimeError("a bug in the prefill replica")])
def test_a_failure_on_the_prefill_side_stays_the_prefill_replicas(error):
    _, failure = first_token_then_transfer(error)
    assert not isinstance(failure, KVTransferError) and failure.replica_id == "p0"
