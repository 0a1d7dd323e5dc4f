"""The "pdserve-grpc" backend: `pdserve.v1.Gateway/Generate`, then `GetRequest` per request.

Each chunk's token ids are the server's count of generated tokens; the last chunk carries the
usage. An ABORT finish reason is a failed request. Afterwards `describe` reads the request store
through `GetRequest`: final state, replicas, KV transport, KV bytes and transfer time.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc

from pdserve.bench.backend_base import BackendError, SendOptions
from pdserve.bench.datasets import BenchRequest
from pdserve.bench.records import StreamPiece
from pdserve.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc

DESCRIBE_TIMEOUT_S = 10.0
NUM_DESCRIBE_IN_FLIGHT = 32
LIST_MODELS_TIMEOUT_S = 30.0


class GrpcGatewayBackend:
    def __init__(self, target: str, options: SendOptions) -> None:
        self._target = target
        self._options = options
        self._channel: grpc.aio.Channel | None = None
        self._stub: gateway_pb2_grpc.GatewayStub | None = None

    async def open(self) -> str:
        self._channel = grpc.aio.insecure_channel(self._target)
        self._stub = gateway_pb2_grpc.GatewayStub(self._channel)
        try:
            models = await self._stub.ListModels(gateway_pb2.ListModelsRequest(), timeout=LIST_MODELS_TIMEOUT_S)
        except grpc.aio.AioRpcError as error:
            raise BackendError(f"{self._target}: ListModels: {error.code().name}: {error.details()}") from error
        return models.models[0].id if models.models else ""

    async def stream(self, request: BenchRequest, request_id: str) -> AsyncIterator[StreamPiece]:
        params = common_pb2.SamplingParams(max_tokens=request.output_len, temperature=self._options.temperature,
                                           ignore_eos=self._options.ignore_eos)
        message = gateway_pb2.GenerateRequest(request_id=request_id, params=params)
        if request.prompt_token_ids is not None:
            message.prompt_token_ids.ids.extend(request.prompt_token_ids)
        else:
            message.prompt = request.prompt
        call = self._stub.Generate(message, timeout=self._options.timeout_s)
        try:
            async for chunk in call:
                if chunk.finish_reason == common_pb2.FINISH_REASON_ABORT:
                    raise BackendError("the server aborted the request")
                usage = chunk.usage if chunk.HasField("usage") else None
                yield StreamPiece(
                    has_output=bool(chunk.token_ids) or bool(chunk.text),
                    num_tokens=len(chunk.token_ids),
                    prompt_tokens=usage.prompt_tokens if usage else None,
                    completion_tokens=usage.completion_tokens if usage else None,
                    request_id=chunk.request_id or None,
                )
        except grpc.aio.AioRpcError as error:
            raise BackendError(f"{error.code().name}: {error.details()}") from error
        finally:
            call.cancel()

    async def describe(self, request_ids: list[str]) -> dict[str, dict]:
        in_flight = asyncio.Semaphore(NUM_DESCRIBE_IN_FLIGHT)

        async def one(request_id: str) -> tuple[str, dict]:
            async with in_flight:
                try:
                    info = await self._stub.GetRequest(gateway_pb2.GetRequestRequest(request_id=request_id),
                                                       timeout=DESCRIBE_TIMEOUT_S)
                except grpc.aio.AioRpcError as error:
                    return request_id, {"error": f"GetRequest: {error.code().name}: {error.details()}"}
                return request_id, _info_dict(info)

        return dict(await asyncio.gather(*(one(request_id) for request_id in request_ids if request_id)))

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()


def _info_dict(info: gateway_pb2.RequestInfo) -> dict:
    return {
        "state": gateway_pb2.RequestState.Name(info.state).removeprefix("REQUEST_STATE_").lower(),
        "transport": common_pb2.Transport.Name(info.transport).removeprefix("TRANSPORT_").lower(),
        "prefill_replica": info.prefill_replica,
        "decode_replica": info.decode_replica,
        "kv_bytes": info.kv_bytes,
        "kv_transfer_s": info.kv_transfer_s,
        "error": info.error,
    }
