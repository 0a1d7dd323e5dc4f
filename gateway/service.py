"""gRPC edge of the gateway: the public `pdserve.v1.Gateway` service."""
from __future__ import annotations

from cluster.grpc_errors import grpc_errors
from cluster.protocol import FINISH_REASONS, logprobs_to_proto, params_from_proto
from engine.errors import InvalidRequestError
from gateway.disaggregated import DisaggregatedFrontend
from gateway.frontend_types import GenerateInput
from gateway.request_store import RequestNotFoundError
from pdserve.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc


class GatewayService(gateway_pb2_grpc.GatewayServicer):
    def __init__(self, frontend: DisaggregatedFrontend):
        self.frontend = frontend

    @grpc_errors
    async def Generate(self, request: gateway_pb2.GenerateRequest, context):
        chunks = self.frontend.generate(_generate_input(request))
        try:
            async for chunk in chunks:
                message = gateway_pb2.GenerateChunk(
                    request_id=chunk.request_id, token_ids=chunk.token_ids, text=chunk.text,
                    logprobs=[logprobs_to_proto(lp) for lp in chunk.logprobs],
                    finish_reason=FINISH_REASONS[chunk.finish_reason])
                if chunk.finish_reason is not None:
                    message.usage.CopyFrom(gateway_pb2.Usage(
                        prompt_tokens=chunk.prompt_tokens, completion_tokens=chunk.completion_tokens))
                    if isinstance(chunk.stop_reason, int):
                        message.stop_token_id = chunk.stop_reason
                    elif isinstance(chunk.stop_reason, str):
                        message.stop_string = chunk.stop_reason
                yield message
        finally:
            await chunks.aclose()

    @grpc_errors
    async def Abort(self, request: gateway_pb2.AbortRequest, context) -> gateway_pb2.AbortResponse:
        return gateway_pb2.AbortResponse(aborted=await self.frontend.abort(request.request_id))

    @grpc_errors
    async def GetRequest(self, request: gateway_pb2.GetRequestRequest, context) -> gateway_pb2.RequestInfo:
        record = await self.frontend.store.get(request.request_id)
        if record is None:
            raise RequestNotFoundError(f"no request {request.request_id!r} (unknown or expired)")
        return gateway_pb2.RequestInfo(
            request_id=record.request_id, state=record.state.value,
            history=[gateway_pb2.StateChange(state=state.value, time_unix_s=unix_s) for state, unix_s in record.history],
            prefill_replica=record.prefill_replica, decode_replica=record.decode_replica,
            transport=_transport_number(record.transport), prompt_tokens=record.prompt_tokens,
            completion_tokens=record.completion_tokens, error=record.error, kv_bytes=record.kv_bytes,
            kv_transfer_s=record.kv_transfer_s)

    @grpc_errors
    async def ListModels(self, request, context) -> gateway_pb2.ListModelsResponse:
        return gateway_pb2.ListModelsResponse(models=[gateway_pb2.ModelCard(
            id=self.frontend.model_name, max_model_len=self.frontend.max_model_len)])


def _generate_input(request: gateway_pb2.GenerateRequest) -> GenerateInput:
    params = params_from_proto(request.params)
    source = request.WhichOneof("input")
    if source is None:
        raise InvalidRequestError("give one of prompt, prompt_token_ids or chat")
    return GenerateInput(
        request_id=request.request_id or None,
        prompt=request.prompt if source == "prompt" else None,
        prompt_token_ids=list(request.prompt_token_ids.ids) if source == "prompt_token_ids" else None,
        messages=[{"role": m.role, "content": m.content} for m in request.chat.messages] if source == "chat" else None,
        params=params)


def _transport_number(name: str) -> int:
    return common_pb2.Transport.Value(name) if name in common_pb2.Transport.keys() else 0
