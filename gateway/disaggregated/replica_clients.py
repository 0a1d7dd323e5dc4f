"""Clients of one decode and one prefill replica, in domain types.

Each client owns its stub, builds its request messages and turns the replica's errors into
domain errors (gateway.disaggregated.backend_errors). The code that drives a request never sees a protobuf
message, except the `KVTarget` that it hands unopened from `DecodeClient.reserve` to
`PrefillClient.run`. A `DecodeClient` lives as long as the gateway holds its replica
(gateway.disaggregated.replica_links): all its requests share one `DecodeSession`, opened on
first use and reopened after it broke.
"""
from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc

from pdserve.cluster.grpc_errors import FAILED_SIDE_KEY
from pdserve.cluster.proto_convert import FINISH_REASON_NAMES, logprobs_from_proto, params_to_proto
from pdserve.gateway.disaggregated.backend_errors import BackendError, KVTransferError, backend_error
from pdserve.gateway.disaggregated.completion_text import SampledToken
from pdserve.gateway.disaggregated.decode_session import DecodeSession, DecodeStep
from pdserve.protocol.sampling_params import SamplingParams
from pdserve.protocol.transport_choice import transport_name
from pdserve.v1 import decode_pb2, decode_pb2_grpc, kv_transfer_pb2, prefill_pb2, prefill_pb2_grpc


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Deadlines of the calls to replicas (the gateway's flags). A replica that stops answering
    altogether is found sooner, by keepalive (cluster/keepalive.py)."""

    rpc_s: float = 30.0  # Reserve, Abort
    request_s: float = 3600.0  # a whole Prefill.Run, or all the decode steps of a request
    token_s: float = 120.0  # longest wait for a running request's next decode step: past it, the replica stalled


@dataclass(frozen=True, slots=True)
class KVTransferDone:
    transport: str  # the name of the transport actually used
    num_bytes: int
    seconds: float


class DecodeClient:
    def __init__(self, replica_id: str, endpoint: str, channel: grpc.aio.Channel, timeouts: Timeouts):
        self.replica_id = replica_id
        self.endpoint = endpoint
        self._stub = decode_pb2_grpc.DecodeStub(channel)
        self._timeouts = timeouts
        self._session: DecodeSession | None = None

    async def reserve(self, request_id: str, token_ids: list[int], transport: int) -> kv_transfer_pb2.KVTarget:
        """Reserves blocks for the KV prefill computes (the prompt, and a resumed request's output
        so far); returns where prefill writes it, less the blocks the replica holds cached."""
        request = decode_pb2.ReserveRequest(request_id=request_id, num_prompt_tokens=len(token_ids),
                                            token_ids=token_ids, transport=transport)
        try:
            return await self._stub.Reserve(request, timeout=self._timeouts.rpc_s)
        except grpc.aio.AioRpcError as exc:
            raise _backend_error(self.replica_id, self.endpoint, exc) from exc

    def generate(self, request_id: str, prompt_ids: list[int], output_ids: list[int], params: SamplingParams,
                 seed: int, first_token_id: int | None) -> AsyncIterator[DecodeStep]:
        """The tokens after `first_token_id` (which follows `output_ids`, empty unless the request
        was resumed), step by step; with `first_token_id` None the replica prefills prompt and
        `output_ids` itself, and the first step brings the token after them. Closing the iterator
        early aborts the request on the replica. Raises SessionBrokenError when the session
        breaks under it."""
        if self._session is None or self._session.broken:
            self._session = DecodeSession(self.replica_id, self._stub)
        request = decode_pb2.DecodeRequest(
            request_id=request_id, prompt_token_ids=prompt_ids, params=params_to_proto(params), seed=seed,
            first_token_id=first_token_id or 0, output_token_ids=output_ids, prefill_here=first_token_id is None)
        return self._session.generate(request, self._timeouts.token_s, self._timeouts.request_s)

    async def abort(self, request_id: str) -> None:
        """Ends the request or releases its reservation; unknown ids are not an error."""
        try:
            await self._stub.Abort(decode_pb2.DecodeAbortRequest(request_id=request_id),
                                   timeout=self._timeouts.rpc_s)
        except grpc.aio.AioRpcError as exc:
            raise _backend_error(self.replica_id, self.endpoint, exc) from exc

    def close(self) -> None:
        """Ends the session; the replica aborts the requests still on it."""
        if self._session is not None:
            self._session.close()


class PrefillClient:
    def __init__(self, replica_id: str, endpoint: str, channel: grpc.aio.Channel, timeouts: Timeouts):
        self.replica_id = replica_id
        self.endpoint = endpoint
        self._stub = prefill_pb2_grpc.PrefillStub(channel)
        self._timeouts = timeouts

    def run(self, request_id: str, prompt_ids: list[int], output_ids: list[int], params: SamplingParams,
            seed: int, target: kv_transfer_pb2.KVTarget) -> PrefillRun:
        """Prefills the prompt and `output_ids` (a resumed request's tokens so far, else empty)
        into `target`; the token it samples is the one after them."""
        call = self._stub.Run(prefill_pb2.PrefillRequest(
            request_id=request_id, prompt_token_ids=prompt_ids, params=params_to_proto(params), seed=seed,
            target=target, output_token_ids=output_ids), timeout=self._timeouts.request_s)
        return PrefillRun(self.replica_id, self.endpoint, call)

    async def abort(self, request_id: str) -> None:
        """Drops the request from the replica; unknown ids are not an error."""
        try:
            await self._stub.Abort(prefill_pb2.PrefillAbortRequest(request_id=request_id),
                                   timeout=self._timeouts.rpc_s)
        except grpc.aio.AioRpcError as exc:
            raise _backend_error(self.replica_id, self.endpoint, exc) from exc


class PrefillRun:
    """One Prefill.Run call: read `first_token()`, then `transfer_done()`; `cancel()` at the end."""

    def __init__(self, replica_id: str, endpoint: str, call):
        self._replica_id = replica_id
        self._endpoint = endpoint
        self._call = call

    async def first_token(self) -> SampledToken:
        first = await self._read("first_token")
        return SampledToken(
            token_id=first.token_id,
            logprobs=logprobs_from_proto(first.logprob) if first.HasField("logprob") else None,
            finish_reason=FINISH_REASON_NAMES[first.finish_reason],
            stop_token_id=first.stop_token_id if first.HasField("stop_token_id") else None)

    async def transfer_done(self) -> KVTransferDone:
        done = await self._read("transfer_done")
        return KVTransferDone(transport_name(done.transport), done.kv_bytes, done.kv_transfer_s)

    def cancel(self) -> None:
        self._call.cancel()  # a no-op once the stream has ended

    async def _read(self, expected: str):
        try:
            event = await self._call.read()
        except grpc.aio.AioRpcError as exc:
            if dict(exc.trailing_metadata() or ()).get(FAILED_SIDE_KEY) == "decode":
                raise KVTransferError(exc.code(), f"{self._replica_id}: {exc.details()}", self._replica_id) from exc
            raise _backend_error(self._replica_id, self._endpoint, exc) from exc
        if event is grpc.aio.EOF or event.WhichOneof("event") != expected:
            raise BackendError(grpc.StatusCode.INTERNAL, f"prefill replica {self._replica_id}: expected {expected}",
                               self._replica_id)
        return getattr(event, expected)


def _backend_error(replica_id: str, endpoint: str, exc: grpc.aio.AioRpcError) -> Exception:
    return backend_error(replica_id, exc.code(), exc.details(), endpoint)
