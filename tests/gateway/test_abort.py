"""Gateway.Abort over the gRPC front, against a frontend whose requests run until aborted and a
request store that may have lost them: the owner aborts its running request from the gateway's
own memory, record or no record; another caller's Abort is NOT_FOUND, word for word as for an
unknown id; a finished request of the caller's is not aborted; an id no client may give is
INVALID_ARGUMENT."""
import asyncio

import grpc
import pytest
from prometheus_client import CollectorRegistry

from pdserve.gateway.front.admission import Admission
from pdserve.gateway.front.api_keys import ApiKeys
from pdserve.gateway.front.grpc_service import GatewayService
from pdserve.gateway.front.request_state import RequestRecord, RequestState
from pdserve.v1 import gateway_pb2, gateway_pb2_grpc

from .conftest import FakeFrontend

KEYS = ApiKeys(["key-a", "key-b"])
OWNER_A = KEYS.caller("Bearer key-a")


class RunningFrontend(FakeFrontend):
    """`running`: request id -> owner, of the requests that run until aborted."""

    def __init__(self, running: dict[str, str]):
        super().__init__()
        self.running = running

    async def abort(self, request_id: str, owner: str) -> bool:
        if self.running.get(request_id) != owner:
            return False
        del self.running[request_id]
        return True


class Records:
    def __init__(self, records: dict[str, RequestRecord]):
        self.records = records

    async def get(self, request_id: str) -> RequestRecord | None:
        return self.records.get(request_id)


def record(request_id: str, owner: str, state: RequestState) -> RequestRecord:
    return RequestRecord(request_id, state, 3, 1, "p0", "d0", "shm", "", 0, 0.0, owner, 0.0, ())


def aborts(frontend, records, calls: list[tuple[str, str]]) -> list:
    """Each (request id, key)'s Abort: its AbortResponse, or (code, details) of its refusal."""
    async def go():
        server = grpc.aio.server()
        GatewayService(frontend, records, KEYS, Admission(8, CollectorRegistry(), "m")).add_to_server(server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        answers = []
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = gateway_pb2_grpc.GatewayStub(channel)
                for request_id, key in calls:
                    try:
                        answers.append(await stub.Abort(gateway_pb2.AbortRequest(request_id=request_id), timeout=10,
                                                        metadata=(("authorization", f"Bearer {key}"),)))
                    except grpc.aio.AioRpcError as exc:
                        answers.append((exc.code(), exc.details()))
        finally:
            await server.stop(None)
        return answers
    return asyncio.run(go())


def test_the_owner_aborts_its_running_request_after_the_store_lost_its_record():
    frontend = RunningFrontend({"r1": OWNER_A})
    others, unknown, own = aborts(frontend, Records({}), [("r1", "key-b"), ("r2", "key-b"), ("r1", "key-a")])
    assert others == (grpc.StatusCode.NOT_FOUND, "no request 'r1' (unknown or expired)")
    assert unknown == (grpc.StatusCode.NOT_FOUND, "no request 'r2' (unknown or expired)")
    assert own.aborted and frontend.running == {}


def test_a_finished_request_of_the_callers_is_found_but_not_aborted_and_anothers_is_not_found():
    finished = record("r1", OWNER_A, RequestState.FINISHED)
    own, others = aborts(RunningFrontend({}), Records({"r1": finished}), [("r1", "key-a"), ("r1", "key-b")])
    assert not own.aborted
    assert others == (grpc.StatusCode.NOT_FOUND, "no request 'r1' (unknown or expired)")


@pytest.mark.parametrize("request_id", ["", "r1#1", "r" * 129])
def test_an_id_no_client_may_give_is_invalid_argument(request_id):
    frontend = RunningFrontend({"r1": OWNER_A})
    [refused] = aborts(frontend, Records({}), [(request_id, "key-a")])
    assert refused[0] == grpc.StatusCode.INVALID_ARGUMENT and "request_id must be" in refused[1]
    assert frontend.running == {"r1": OWNER_A}


def test_the_record_check_still_guards_a_request_running_on_another_gateway():
    elsewhere = record("r1", OWNER_A, RequestState.DECODING)
    own, others = aborts(RunningFrontend({}), Records({"r1": elsewhere}), [("r1", "key-a"), ("r1", "key-b")])
    assert not own.aborted  # not this gateway's to abort, but the caller's to know of
    assert others[0] == grpc.StatusCode.NOT_FOUND
