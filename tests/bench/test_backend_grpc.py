"""The grpc backend against an in-process gateway: each Generate stream is timed like an OpenAI
one (token ids or text count as output, the last chunk's usage sets the lengths), an ABORT finish
is a failed request, and what GetRequest answers afterwards is summed up in the result."""
import asyncio

import grpc

from pdserve.bench.datasets import BenchRequest
from pdserve.bench.runner import BenchConfig, run_benchmark
from pdserve.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc


class FakeGateway(gateway_pb2_grpc.GatewayServicer):
    """Streams one token per chunk; a prompt starting with token 0 is aborted."""

    def __init__(self) -> None:
        self.prompts: dict[str, list[int]] = {}

    async def ListModels(self, request, context):
        return gateway_pb2.ListModelsResponse(models=[gateway_pb2.ModelCard(id="fake")])

    async def Generate(self, request, context):
        prompt = list(request.prompt_token_ids.ids)
        self.prompts[request.request_id] = prompt
        if prompt[0] == 0:
            yield gateway_pb2.GenerateChunk(request_id=request.request_id,
                                            finish_reason=common_pb2.FINISH_REASON_ABORT)
            return
        for index in range(request.params.max_tokens):
            last = index == request.params.max_tokens - 1
            yield gateway_pb2.GenerateChunk(
                request_id=request.request_id, token_ids=[7], text="x",
                finish_reason=common_pb2.FINISH_REASON_LENGTH if last else common_pb2.FINISH_REASON_UNSPECIFIED,
                usage=gateway_pb2.Usage(prompt_tokens=len(prompt), completion_tokens=index + 1) if last else None)
            await asyncio.sleep(0.005)

    async def GetRequest(self, request, context):
        if self.prompts.get(request.request_id, [0])[0] == 0:
            await context.abort(grpc.StatusCode.NOT_FOUND, "unknown")
        return gateway_pb2.RequestInfo(request_id=request.request_id, state=gateway_pb2.REQUEST_STATE_FINISHED,
                                       transport=common_pb2.TRANSPORT_SHM, kv_bytes=2_000_000, kv_transfer_s=0.001)


async def bench_against_fake(requests: list[BenchRequest]):
    server = grpc.aio.server()
    gateway = FakeGateway()
    gateway_pb2_grpc.add_GatewayServicer_to_server(gateway, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        config = BenchConfig(target=f"127.0.0.1:{port}", backend="grpc", label="grpc", timeout_s=30)
        return gateway, await run_benchmark(config, requests, progress=False)
    finally:
        await server.stop(None)


def test_streams_are_timed_and_the_request_store_is_summed_up():
    requests = [BenchRequest(None, [5, 6, 7], 4), BenchRequest(None, [0, 1], 3), BenchRequest("text", [9] * 5, 2)]
    gateway, result = asyncio.run(bench_against_fake(requests))
    assert result.model_id == "fake"
    served, aborted, short = result.records
    assert (served.success, served.prompt_len, served.output_len, len(served.itl_s)) == (True, 3, 4, 3)
    assert not aborted.success and "aborted" in aborted.error
    assert (short.success, short.prompt_len, short.output_len) == (True, 5, 2)
    assert sorted(gateway.prompts.values()) == [[0, 1], [5, 6, 7], [9] * 5]  # ids sent, not text
    assert result.server == {"requests": {
        "states": {"finished": 2}, "transports": {"shm": 2},
        "kv_bytes_per_request": 2_000_000, "kv_transfer_gb_per_s": 2.0}}
    assert result.to_json_dict()["backend"] == "grpc"
