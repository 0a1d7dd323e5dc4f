"""gRPC edge of the gateway: the public `pdserve.v1.Gateway` service.

Every bad request is INVALID_ARGUMENT with a message naming the field, as on the HTTP front
(the same `SamplingParams` and `GenerateInput` checks give the verdict), bytes that do not
decode as the method's request message included, and a request id no client may give
(gateway.front.request_ids).

With API keys configured, every method needs metadata `authorization: Bearer KEY`, else
UNAUTHENTICATED (grpc.health.v1 on the same server stays open, for probes). A request belongs to
the caller that created it: Abort and GetRequest of a request that another caller owns are
NOT_FOUND, word for word as for an id that never existed. Abort finds a request this gateway
runs in its own memory first, so its owner can abort it even when its record is gone from Redis. Generate holds an admission slot
until its stream ends; past the gateway's maximum it is RESOURCE_EXHAUSTED at once, with a
`retry-after` trailer in seconds (gateway.front.admission), as when a replica it needs is at its
bound.
"""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import grpc
from google.protobuf.message import DecodeError

from pdserve.cluster.grpc_errors import grpc_errors
from pdserve.cluster.proto_convert import FINISH_REASONS, logprobs_to_proto, params_from_proto
from pdserve.gateway.front.admission import Admission
from pdserve.gateway.front.api_keys import ApiKeys
from pdserve.gateway.front.frontend import Frontend
from pdserve.gateway.front.frontend_types import GenerateInput, OverloadedError, StreamChunk
from pdserve.gateway.front.request_ids import check_client_request_id
from pdserve.gateway.front.request_state import LOCAL_PREFILL, RequestNotFoundError, RequestRecord
from pdserve.protocol.errors import InvalidRequestError
from pdserve.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc


@dataclass(frozen=True, slots=True)
class MalformedRequest:
    """What a method receives for request bytes that are not its request message."""
    reason: str


RETRY_AFTER_KEY = "retry-after"


class RequestRecords(Protocol):
    async def get(self, request_id: str) -> RequestRecord | None:
        """The request's record; None if it never existed or has expired."""
        ...


class GatewayService(gateway_pb2_grpc.GatewayServicer):
    def __init__(self, frontend: Frontend, records: RequestRecords, api_keys: ApiKeys, admission: Admission):
        self.frontend = frontend
        self.records = records
        self.api_keys = api_keys
        self.admission = admission

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
        caller = self._caller(context)
        generate_input = dataclasses.replace(_generate_input(request), owner=caller)
        with _retry_after_trailer(context), self.admission.admit(1, "grpc"):
            chunks = self.frontend.generate(generate_input)
            try:
                async for chunk in chunks:
                    yield _chunk_message(chunk)
            finally:
                await chunks.aclose()

    @grpc_errors
    async def Abort(self, request: gateway_pb2.AbortRequest, context) -> gateway_pb2.AbortResponse:
        caller = self._caller(context)
        _require_decoded(request)
        request_id = check_client_request_id(request.request_id, "request_id")
        if await self.frontend.abort(request_id, caller):
            return gateway_pb2.AbortResponse(aborted=True)
        await self._owned_record(request_id, caller)  # not running here: NOT_FOUND unless the caller's
        return gateway_pb2.AbortResponse(aborted=False)

    @grpc_errors
    async def GetRequest(self, request: gateway_pb2.GetRequestRequest, context) -> gateway_pb2.RequestInfo:
        caller = self._caller(context)
        _require_decoded(request)
        record = await self._owned_record(check_client_request_id(request.request_id, "request_id"), caller)
        return gateway_pb2.RequestInfo(
            request_id=record.request_id, state=record.state.value,
            history=[gateway_pb2.StateChange(state=state.value, time_unix_s=unix_s) for state, unix_s in record.history],
            prefill_replica=record.prefill_replica, decode_replica=record.decode_replica,
            transport=_transport_number(record.transport), local_prefill=record.transport == LOCAL_PREFILL,
            prompt_tokens=record.prompt_tokens,
            completion_tokens=record.completion_tokens, error=record.error, kv_bytes=record.kv_bytes,
            kv_transfer_s=record.kv_transfer_s)

    @grpc_errors
    async def ListModels(self, request, context) -> gateway_pb2.ListModelsResponse:
        self._caller(context)
        _require_decoded(request)
        return gateway_pb2.ListModelsResponse(models=[gateway_pb2.ModelCard(
            id=self.frontend.model_name, max_model_len=self.frontend.max_model_len)])


    def _caller(self, context) -> str:
        """The caller's fingerprint; raises UnauthenticatedError without a configured key."""
        return self.api_keys.caller(dict(context.invocation_metadata() or ()).get("authorization"))

    async def _owned_record(self, request_id: str, caller: str) -> RequestRecord:
        """The request's record, if `caller` created it; any other caller learns nothing of it."""
        record = await self.records.get(request_id)
        if record is None or record.owner != caller:
            raise RequestNotFoundError(f"no request {request_id!r} (unknown or expired)")
        return record


@contextlib.contextmanager
def _retry_after_trailer(context) -> Iterator[None]:
    """An OverloadedError leaves the block with a `retry-after` trailer (seconds)."""
    try:
        yield
    except OverloadedError as exc:
        context.set_trailing_metadata(((RETRY_AFTER_KEY, str(exc.retry_after_s)),))
        raise


def _chunk_message(chunk: StreamChunk) -> gateway_pb2.GenerateChunk:
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
    return message


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
    request_id = check_client_request_id(request.request_id, "request_id") if request.request_id else None
    try:
        return GenerateInput(
            request_id=request_id,
            prompt=request.prompt if source == "prompt" else None,
            prompt_token_ids=list(request.prompt_token_ids.ids) if source == "prompt_token_ids" else None,
            messages=[{"role": m.role, "content": m.content} for m in request.chat.messages] if source == "chat" else None,
            params=params)
    except InvalidRequestError as exc:
        raise InvalidRequestError(f"chat.{exc}") from exc


def _transport_number(name: str) -> int:
    return common_pb2.Transport.Value(name) if name in common_pb2.Transport.keys() else 0
