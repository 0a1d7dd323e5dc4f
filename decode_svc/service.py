"""gRPC edge of a decode replica: protobuf in, domain calls, protobuf out."""
from __future__ import annotations

from cluster.grpc_errors import grpc_errors
from cluster.protocol import FINISH_REASONS, logprobs_to_proto, params_from_proto
from decode_svc.replica import DecodeReplica
from kvtransfer.wire import target_to_proto
from pdserve.v1 import decode_pb2, decode_pb2_grpc, kv_transfer_pb2


class DecodeService(decode_pb2_grpc.DecodeServicer):
    def __init__(self, replica: DecodeReplica):
        self.replica = replica

    @grpc_errors
    async def Reserve(self, request: decode_pb2.ReserveRequest, context) -> kv_transfer_pb2.KVTarget:
        target = await self.replica.reserve(request.request_id, request.num_prompt_tokens, request.transport)
        return target_to_proto(target)

    @grpc_errors
    async def Generate(self, request: decode_pb2.DecodeRequest, context):
        params = params_from_proto(request.params)
        outputs = self.replica.generate(request.request_id, list(request.prompt_token_ids),
                                        request.first_token_id, params, request.seed)
        try:
            async for output in outputs:
                completion = output.outputs[0]
                chunk = decode_pb2.DecodeChunk(token_ids=output.new_token_ids,
                                               num_preemptions=output.num_preemptions)
                if completion.logprobs is not None:
                    chunk.logprobs.extend(logprobs_to_proto(lp) for lp in completion.logprobs[-len(output.new_token_ids):])
                if output.finished:
                    chunk.finish_reason = FINISH_REASONS[completion.finish_reason]
                    if isinstance(completion.stop_reason, int):
                        chunk.stop_token_id = completion.stop_reason
                yield chunk
        finally:
            await outputs.aclose()

    @grpc_errors
    async def Abort(self, request: decode_pb2.DecodeAbortRequest, context) -> decode_pb2.DecodeAbortResponse:
        return decode_pb2.DecodeAbortResponse(aborted=await self.replica.abort(request.request_id))
