"""gRPC edge of a decode replica: protobuf in, domain calls, protobuf out.

`Session` runs two loops over one `DecodeSession`: commands in (until the gateway closes its
side), step outputs out (until the session ends). A request's error becomes a status code in
its output, so it never ends the stream; an error of the whole session (the engine died, the
replica is stopping) ends the stream with its status.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import grpc

from pdserve.cluster.grpc_errors import grpc_errors, status_for
from pdserve.cluster.internal_auth import caller_of
from pdserve.cluster.proto_convert import FINISH_REASONS, logprobs_to_proto, params_from_proto
from pdserve.decode_svc.replica import DecodeReplica
from pdserve.decode_svc.session import DecodeSession, SessionClosedError
from pdserve.engine.output_group import GroupEntry, RequestFailure
from pdserve.kvtransfer.wire import target_to_proto
from pdserve.protocol.errors import InvalidRequestError
from pdserve.v1 import decode_pb2, decode_pb2_grpc, kv_transfer_pb2

logger = logging.getLogger(__name__)


class DecodeService(decode_pb2_grpc.DecodeServicer):
    def __init__(self, replica: DecodeReplica):
        self.replica = replica

    @grpc_errors
    async def Reserve(self, request: decode_pb2.ReserveRequest, context) -> kv_transfer_pb2.KVTarget:
        target = await self.replica.reserve(request.request_id, request.num_prompt_tokens, request.transport,
                                            caller_of(context), list(request.token_ids))
        return target_to_proto(target)

    @grpc_errors
    async def Session(self, commands: AsyncIterator[decode_pb2.DecodeCommand], context):
        with self.replica.session() as session:
            reader = asyncio.create_task(_serve_commands(commands, session))
            try:
                while True:
                    try:
                        entries = await session.next_step()
                    except SessionClosedError:
                        return
                    yield decode_pb2.DecodeStepOutputs(outputs=[_request_output(entry) for entry in entries])
            finally:
                reader.cancel()

    @grpc_errors
    async def Abort(self, request: decode_pb2.DecodeAbortRequest, context) -> decode_pb2.DecodeAbortResponse:
        return decode_pb2.DecodeAbortResponse(aborted=await self.replica.abort(request.request_id))


async def _serve_commands(commands: AsyncIterator[decode_pb2.DecodeCommand], session: DecodeSession) -> None:
    try:
        async for command in commands:
            kind = command.WhichOneof("command")
            if kind == "generate":
                _generate(session, command.generate)
            elif kind == "abort_request_id":
                session.abort(command.abort_request_id)
            else:
                logger.warning("ignoring a session command with no command set")
    finally:
        session.close()


def _generate(session: DecodeSession, request: decode_pb2.DecodeRequest) -> None:
    try:
        params = params_from_proto(request.params)
    except InvalidRequestError as exc:
        session.abort(request.request_id)  # gives back its reservation
        session.refuse(request.request_id, exc)
        return
    prompt_ids, output_ids = list(request.prompt_token_ids), list(request.output_token_ids)
    if request.prefill_here:
        session.prefill_here(request.request_id, prompt_ids, output_ids, params, request.seed)
    else:
        session.generate(request.request_id, prompt_ids, output_ids, request.first_token_id, params, request.seed)


def _request_output(entry: GroupEntry) -> decode_pb2.DecodeRequestOutput:
    if isinstance(entry, RequestFailure):
        status = status_for(entry.error)
        if status is None:
            logger.error("request %s failed", entry.request_id, exc_info=entry.error)
            status = grpc.StatusCode.INTERNAL, f"internal error: {entry.error!r}"
        code, message = status
        return decode_pb2.DecodeRequestOutput(
            request_id=entry.request_id,
            error=decode_pb2.DecodeRequestError(status_code=code.value[0], message=message))
    completion = entry.outputs[0]
    output = decode_pb2.DecodeRequestOutput(
        request_id=entry.request_id, token_ids=entry.new_token_ids, num_preemptions=entry.num_preemptions)
    output.logprobs.extend(logprobs_to_proto(lp) for lp in entry.new_logprobs)
    if entry.finished:
        output.finish_reason = FINISH_REASONS[completion.finish_reason]
        if isinstance(completion.stop_reason, int):
            output.stop_token_id = completion.stop_reason
    return output
