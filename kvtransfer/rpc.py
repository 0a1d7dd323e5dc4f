"""The KVTransfer wire. Client side: one channel per decode endpoint, opened by the process's
`open_channel` (which adds its internal credentials), every call bounded by a deadline, every failure a TransferError that names
the endpoint and the gRPC status. Service side: a `Refusal` is the status a decode end answers a
sender with."""
from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable

import grpc

from pdserve.kvtransfer.layout import KVLayout
from pdserve.kvtransfer.target import KVTarget
from pdserve.kvtransfer.wire import layout_to_proto
from pdserve.protocol.errors import TransferError
from pdserve.v1 import kv_transfer_pb2, kv_transfer_pb2_grpc


ChannelFactory = Callable[[str], grpc.aio.Channel]  # endpoint -> a channel to it

# Push with the chunks' bytes as they are: the sender encodes them itself (kvtransfer/grpc_stream.py).
_PUSH_METHOD = f"/{kv_transfer_pb2.DESCRIPTOR.services_by_name['KVTransfer'].full_name}/Push"


class Refusal(Exception):
    """The decode end refuses a transfer; the KVTransfer service aborts the call with `code`."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code


class KVTransferClient:
    def __init__(self, rpc_timeout_s: float, open_channel: ChannelFactory = grpc.aio.insecure_channel):
        self._rpc_timeout_s = rpc_timeout_s
        self._open_channel = open_channel
        self._channels: dict[str, grpc.aio.Channel] = {}

    def _channel(self, endpoint: str) -> grpc.aio.Channel:
        if not endpoint:
            raise TransferError("KV target has no kv_endpoint")
        if endpoint not in self._channels:
            self._channels[endpoint] = self._open_channel(endpoint)
        return self._channels[endpoint]

    def _timeout_s(self, request_id: str, target: KVTarget) -> float:
        """The configured RPC timeout, shortened to the reservation's deadline when it has one."""
        if target.deadline_unix_s is None:
            return self._rpc_timeout_s
        remaining_s = target.deadline_unix_s - time.time()
        if remaining_s <= 0:
            raise TransferError(f"request {request_id}: the decode reservation expired")
        return min(self._rpc_timeout_s, remaining_s)

    async def commit(
        self, request_id: str, target: KVTarget, layout: KVLayout, num_bytes: int
    ) -> None:
        """Tells the decode replica that the blocks written in place are complete."""
        request = kv_transfer_pb2.KVCommit(request_id=request_id, layout=layout_to_proto(layout), num_bytes=num_bytes,
                                           write_token=target.write_token)
        try:
            stub = kv_transfer_pb2_grpc.KVTransferStub(self._channel(target.kv_endpoint))
            await stub.Commit(request, timeout=self._timeout_s(request_id, target))
        except grpc.aio.AioRpcError as error:
            raise _transfer_error("commit", request_id, target, error) from error

    async def push(self, request_id: str, target: KVTarget, encoded_chunks: AsyncIterator[bytes]) -> None:
        """Streams already-encoded `KVChunk`s to the decode replica and waits for its acknowledgement."""
        push = self._channel(target.kv_endpoint).stream_unary(
            _PUSH_METHOD, request_serializer=None, response_deserializer=kv_transfer_pb2.KVAck.FromString
        )
        try:
            await push(encoded_chunks, timeout=self._timeout_s(request_id, target))
        except grpc.aio.AioRpcError as error:
            raise _transfer_error("push", request_id, target, error) from error

    async def close(self) -> None:
        channels, self._channels = self._channels, {}
        for channel in channels.values():
            await channel.close()


def _transfer_error(
    verb: str, request_id: str, target: KVTarget, error: grpc.aio.AioRpcError
) -> TransferError:
    return TransferError(
        f"KV {verb} of request {request_id} to {target.kv_endpoint} failed: "
        f"{error.code().name}: {error.details()}"
    )
