"""The "grpc" backend: the gateway's public `pdserve.v1.Gateway/Generate` stream, then
`GetRequest` per request.

A chunk carries output when it has token ids or text; the last chunk's usage gives the token
counts, and an ABORT finish reason fails the request. `describe` sums up what the request store
recorded, as the serve report shows it: final states and transports counted, KV bytes per
request and the KV transfer rate.
"""
from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator

import grpc

from pdserve.bench.client import BackendError
from pdserve.bench.datasets import BenchRequest
from pdserve.bench.records import StreamPiece
from pdserve.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc

RPC_TIMEOUT_S = 30.0


class GatewayClient:
    def __init__(self, target: str) -> None:
        self._target = target
        self._channel = grpc.aio.insecure_channel(target)
        self._stub = gateway_pb2_grpc.GatewayStub(self._channel)

    async def open(self) -> str:
        try:
            models = await self._stub.ListModels(gateway_pb2.ListModelsRequest(), timeout=RPC_TIMEOUT_S)
        except grpc.aio.AioRpcError as error:
            raise BackendError(f"{self._target}: ListModels: {error.code().name}: {error.details()}") from error
        return models.models[0].id if models.models else ""

    async def stream(self, request: BenchRequest, request_id: str) -> AsyncIterator[StreamPiece]:
        params = common_pb2.SamplingParams(max_tokens=request.output_len, temperature=0.0, ignore_eos=True)
        message = gateway_pb2.GenerateRequest(request_id=request_id, params=params)
        if request.prompt_token_ids is not None:
            message.prompt_token_ids.ids.extend(request.prompt_token_ids)
        else:
            message.prompt = request.prompt
        call = self._stub.Generate(message)
        try:
            async for chunk in call:
                if chunk.finish_reason == common_pb2.FINISH_REASON_ABORT:
                    raise BackendError("the gateway aborted the request")
                usage = chunk.usage if chunk.HasField("usage") else None
                yield StreamPiece(has_output=bool(chunk.token_ids) or bool(chunk.text),
                                  prompt_tokens=usage.prompt_tokens if usage else None,
                                  completion_tokens=usage.completion_tokens if usage else None)
        except grpc.aio.AioRpcError as error:
            raise BackendError(f"{error.code().name}: {error.details()}") from error
        finally:
            call.cancel()

    async def describe(self, request_ids: list[str]) -> dict | None:
        async def one(request_id: str) -> gateway_pb2.RequestInfo | None:
            try:
                return await self._stub.GetRequest(gateway_pb2.GetRequestRequest(request_id=request_id),
                                                   timeout=RPC_TIMEOUT_S)
            except grpc.aio.AioRpcError:
                return None  # expired or never stored: left out of the summary

        infos = [info for info in await asyncio.gather(*map(one, request_ids)) if info is not None]
        if not infos:
            return None
        kv_bytes, kv_s = sum(info.kv_bytes for info in infos), sum(info.kv_transfer_s for info in infos)
        return {"states": _count(gateway_pb2.RequestState, "REQUEST_STATE_", (info.state for info in infos)),
                "transports": _count(common_pb2.Transport, "TRANSPORT_", (info.transport for info in infos)),
                "kv_bytes_per_request": kv_bytes / len(infos),
                "kv_transfer_gb_per_s": kv_bytes / kv_s / 1e9 if kv_s > 0 else None}

    async def close(self) -> None:
        await self._channel.close()


def _count(enum, prefix: str, values) -> dict[str, int]:
    return dict(Counter(enum.Name(value).removeprefix(prefix).lower() for value in values))
