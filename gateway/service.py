"""gRPC edge of the gateway: the public `pdserve.v1.Gateway` service.

Every bad request is INVALID_ARGUMENT with a message naming the field, as on the HTTP front
(the same `SamplingParams` and `GenerateInput` checks give the verdict), bytes that do not
decode as the method's request message included.
"""
from __future__ import annotations

from dataclasses import dataclass

import grpc
from google.protobuf.message import DecodeError

from cluster.grpc_errors import grpc_errors
from cluster.protocol import FINISH_REASONS, logprobs_to_proto, params_from_proto
from engine.errors import InvalidRequestError
from gateway.disaggregated import DisaggregatedFrontend
from gateway.frontend_types import GenerateInput
from gateway.request_store import RequestNotFoundError
from pdserve.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc


@dataclass(frozen=True, slots=True)
class MalformedRequest:
    """What a method receives for request bytes that are not its request message."""
    reason: str


class GatewayService(gateway_pb2_grpc.GatewayServicer):
    def __init__(self, frontend: DisaggregatedFrontend):
        self.frontend = frontend

    def add_to_server(self, server: grpc.aio.Server) -> None:
        """Serves Gateway on `server` like the generated `add_GatewayServicer_to_server`, except
        that undecodable bytes reach the method as a MalformedRequest, which it refuses as
        INVALID_ARGUMENT: a deserializer that raises would end the call as UNKNOWN."""
        handlers = {
            "Generate": grpc.unary_stream_rpc_method_handler(
                self.Generate, request_deserializer=_decoder(gateway_pb2.GenerateRequest),
                response_serializer=gateway_pb2.GenerateChunk.SerializeToString),
            "Abort": grpc.unary_unary_rpc_method_handler(
                self.Abort, request_deserializer=_decoder(gateway_pb2.AbortRequest),
                response_serializer=gateway_pb2.AbortResponse.SerializeToString),
            "GetRequest": grpc.unary_unary_rpc_method_handler(
                self.GetRequest, request_deserializer=_decoder(gateway_pb2.GetRequestRequest),
                response_serializer=gateway_pb2.RequestInfo.SerializeToString),
            "ListModels": grpc.unary_unary_rpc_method_handler(
                self.ListModels, request_deserializer=_decoder(gateway_pb2.ListModelsRequest),
                response_serializer=gateway_pb2.ListModelsResponse.SerializeToString),
        }
        service_name = gateway_pb2.DESCRIPTOR.services_by_name["Gateway"].full_name
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service_name, handlers),))

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
        _require_decoded(request)
        return gateway_pb2.AbortResponse(aborted=await self.frontend.abort(request.request_id))

    @grpc_errors
    async def GetRequest(self, request: gateway_pb2.GetRequestRequest, context) -> gateway_pb2.RequestInfo:
        _require_decoded(request)
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
        _require_decoded(request)
        return gateway_pb2.ListModelsResponse(models=[gateway_pb2.ModelCard(
            id=self.frontend.model_name, max_model_len=self.frontend.max_model_len)])


def _decoder(message_type):
    """A request deserializer that hands on a MalformedRequest instead of raising."""
    def decode(data: bytes):
        try:
            return message_type.FromString(data)
        except DecodeError as exc:
            return MalformedRequest(f"the request is not a valid {message_type.DESCRIPTOR.full_name}: {exc}")
    return decode


def _require_decoded(request: object) -> None:
    if isinstance(request, MalformedRequest):
        raise InvalidRequestError(request.reason)


def _generate_input(request: gateway_pb2.GenerateRequest) -> GenerateInput:
    """The checks' messages name fields as the request spells them (`params.top_k`, `chat.messages[0].role`)."""
    _require_decoded(request)
    try:
        params = params_from_proto(request.params)
    except InvalidRequestError as exc:
        raise InvalidRequestError(f"params.{exc}") from exc
    source = request.WhichOneof("input")
    if source is None:
        raise InvalidRequestError("give one of prompt, prompt_token_ids or chat")
    try:
        return GenerateInput(
            request_id=request.request_id or None,
            prompt=request.prompt if source == "prompt" else None,
            prompt_token_ids=list(request.prompt_token_ids.ids) if source == "prompt_token_ids" else None,
            messages=[{"role": m.role, "content": m.content} for m in request.chat.messages] if source == "chat" else None,
            params=params)
    except InvalidRequestError as exc:
        raise InvalidRequestError(f"chat.{exc}") from exc


def _transport_number(name: str) -> int:
    return common_pb2.Transport.Value(name) if name in common_pb2.Transport.keys() else 0
