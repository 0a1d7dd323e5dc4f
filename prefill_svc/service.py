"""gRPC edge of a prefill replica: protobuf in, domain calls, protobuf out."""
from __future__ import annotations

from pdserve.cluster.grpc_errors import grpc_errors
from pdserve.cluster.proto_convert import FINISH_REASONS, logprobs_to_proto, params_from_proto
from pdserve.kvtransfer.base import TransferResult
from pdserve.kvtransfer.wire import target_from_proto
from pdserve.prefill_svc.replica import FirstToken, PrefillReplica
from pdserve.v1 import prefill_pb2, prefill_pb2_grpc


class PrefillService(prefill_pb2_grpc.PrefillServicer):
    def __init__(self, replica: PrefillReplica):
        self.replica = replica

    @grpc_errors
    async def Run(self, request: prefill_pb2.PrefillRequest, context):
        params = params_from_proto(request.params)
        events = self.replica.run(request.request_id, list(request.prompt_token_ids), params,
                                  request.seed, target_from_proto(request.target), list(request.output_token_ids))
        try:
            async for event in events:
                yield _event_to_proto(event)
        finally:
            await events.aclose()

    @grpc_errors
    async def Abort(self, request: prefill_pb2.PrefillAbortRequest, context) -> prefill_pb2.PrefillAbortResponse:
        return prefill_pb2.PrefillAbortResponse(aborted=await self.replica.abort(request.request_id))


def _event_to_proto(event: FirstToken | TransferResult) -> prefill_pb2.PrefillEvent:
    if isinstance(event, FirstToken):
        first = prefill_pb2.FirstToken(token_id=event.token_id, finish_reason=FINISH_REASONS[event.finish_reason],
                                       stop_token_id=event.stop_reason)
        if event.logprobs is not None:
            first.logprob.CopyFrom(logprobs_to_proto(event.logprobs))
        return prefill_pb2.PrefillEvent(first_token=first)
    return prefill_pb2.PrefillEvent(transfer_done=prefill_pb2.TransferDone(
        transport=event.transport, kv_bytes=event.num_bytes, kv_transfer_s=event.seconds))
