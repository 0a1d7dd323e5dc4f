"""Redis killed with SIGKILL under load and restarted (empty) on its port: a request that cannot
reach it is refused clearly (HTTP 503 / gRPC UNAVAILABLE, naming the state store), never a 500,
an INTERNAL or a hang; streams in flight at the kill complete with the tokens an unharmed run
gives; the replicas are listed again within a heartbeat of Redis coming back, and new requests
succeed soon after. The logs hold no traceback."""
import asyncio
import os
import signal
import time
from pathlib import Path

import aiohttp
import grpc
import pytest

from pdserve.redis_process import start_redis
from pdserve.v1 import gateway_pb2_grpc
from tests.system.faults.conftest import assert_prefill_kv_free
from tests.system.faults.stream_clients import grpc_stream, in_flight_gauges, request_records, sse_stream
from tests.system.faults.test_cut_streams import prompts
from tests.helpers import wait_until

pytestmark = pytest.mark.faults

NUM_IN_FLIGHT = 6
IN_FLIGHT_TOKENS = 160  # long enough that all six decode at once even on a loaded machine
LOAD_TOKENS = 4
NUM_SENDERS = 4
SEND_INTERVAL_S = 0.05  # each sender's pace: a refused request comes back in milliseconds
OUTAGE_S = 3.0  # load sent while Redis is down, before it is restarted
MAX_LOAD_REQUESTS = 4000  # a bound on the load: over 50 s of it at this pace
RECOVERY_DEADLINE_S = 30.0
HEARTBEAT_INTERVAL_S = 1.0  # the replicas' default
REFUSED = {"UNAVAILABLE", "503"}


class RestartableRedis:
    """The test's own redis-server: killed by its pid, started again on the same port."""

    def __init__(self, data_dir: Path):
        self.data_dir = data_dir
        self.process = start_redis(data_dir=data_dir)
        self.url = self.process.url

    def kill(self) -> None:
        os.kill(self.process.pid, signal.SIGKILL)
        wait_until(lambda: self.process.exit_code is not None, "redis-server to die", 10.0)

    def restart(self) -> None:
        self.process = start_redis(port=self.process.port, data_dir=self.data_dir)

    def stop(self) -> None:
        self.process.stop()


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory):
    """Replaces the shared Redis of tests/system for this module's clusters: this one gets killed."""
    server = RestartableRedis(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.mark.timeout(300)
def test_a_redis_outage_refuses_new_requests_clearly_and_spares_streams_in_flight(make_cluster, e2e_model,
                                                                                  redis_server):
    cluster = make_cluster([("decode", "d0", ()), ("prefill", "p0", ()), ("gateway", "gw", ())])
    model = Path(e2e_model).name
    shared = prompts(e2e_model)
    base_url = f"http://127.0.0.1:{cluster.gateway.http_port}"
    timeline: dict[str, float] = {}

    async def scenario():
        async with grpc.aio.insecure_channel(cluster.gateway.endpoint) as channel, \
                aiohttp.ClientSession() as session:
            stub = gateway_pb2_grpc.GatewayStub(channel)

            async def send(index: int, request_id: str, max_tokens: int):
                prompt = shared[index % len(shared)]
                if index % 2 == 0:
                    return await grpc_stream(stub, request_id, prompt, max_tokens)
                return await sse_stream(session, base_url, model, request_id, prompt, max_tokens)

            references = {max_tokens: await asyncio.gather(*(send(i, f"ref-{max_tokens}-{i}", max_tokens)
                                                             for i in range(len(shared))))
                          for max_tokens in (IN_FLIGHT_TOKENS, LOAD_TOKENS)}

            async def timed(index: int, request_id: str, max_tokens: int):
                outcome = await send(index, request_id, max_tokens)
                return index, outcome, time.monotonic()

            in_flight = [asyncio.create_task(timed(i, f"long-{i}", IN_FLIGHT_TOKENS)) for i in range(NUM_IN_FLIGHT)]
            await asyncio.to_thread(wait_until, lambda: sum(
                state == "DECODING" for state, _, _ in request_records(cluster.redis_url).values()) == NUM_IN_FLIGHT,
                "the streams in flight to be decoding", 60.0)

            load: list[tuple[int, object, float, float]] = []  # (index, outcome, sent_s, ended_s)
            recovered = asyncio.Event()

            async def sender(first: int) -> None:
                for index in range(first, MAX_LOAD_REQUESTS, NUM_SENDERS):
                    if recovered.is_set():
                        return
                    sent_s = time.monotonic()
                    _, outcome, ended_s = await timed(index, f"load-{index}", LOAD_TOKENS)
                    load.append((index, outcome, sent_s, ended_s))
                    await asyncio.sleep(max(0.0, sent_s + SEND_INTERVAL_S - time.monotonic()))
                    if outcome.status is None and sent_s > timeline.get("restarted_s", float("inf")):
                        timeline.setdefault("first_success_s", ended_s)
                        recovered.set()

            senders = [asyncio.create_task(sender(i)) for i in range(NUM_SENDERS)]
            await asyncio.to_thread(redis_server.kill)
            timeline["killed_s"] = time.monotonic()
            await asyncio.sleep(OUTAGE_S)  # the outage itself: load keeps coming meanwhile
            redis_server.restart()  # on the main thread: a child dies with the thread that started it
            timeline["restarted_s"] = time.monotonic()
            await asyncio.to_thread(wait_until, lambda: len(cluster.replicas("prefill")) == 1
                                    and len(cluster.replicas("decode")) == 1, "the replicas to register again",
                                    RECOVERY_DEADLINE_S)
            timeline["registered_s"] = time.monotonic()
            await asyncio.wait_for(recovered.wait(), RECOVERY_DEADLINE_S)
            await asyncio.gather(*senders)
            return references, await asyncio.gather(*in_flight), load

    references, in_flight, load = asyncio.run(scenario())

    killed_s, restarted_s = timeline["killed_s"], timeline["restarted_s"]
    refused = [(outcome, sent_s) for _, outcome, sent_s, _ in load if outcome.status is not None]
    print(f"\nredis outage: {len(load)} requests sent, {len(refused)} refused "
          f"({sum(o.front == 'grpc' for o, _ in refused)} gRPC, {sum(o.front == 'http' for o, _ in refused)} HTTP); "
          f"replicas listed {timeline['registered_s'] - restarted_s:.2f} s and a new request answered "
          f"{timeline['first_success_s'] - restarted_s:.2f} s after the restart "
          f"(heartbeat every {HEARTBEAT_INTERVAL_S} s)")
    for index, outcome, _, _ in load:
        if outcome.status is None:
            want = references[LOAD_TOKENS][index % len(shared)]
            assert outcome.finish_reason in ("length", "FINISH_REASON_LENGTH") and outcome.text == want.text, outcome
        else:  # Redis away; or back but empty, so that until the replicas' next beat there is no
            # replica to route to (a request sent just before the restart may be routed just after)
            assert outcome.status in REFUSED and ("state store" in outcome.message
                                                  or "no live" in outcome.message), outcome
    assert {outcome.front for outcome, sent_s in refused if killed_s < sent_s < restarted_s} == {"grpc", "http"}
    for index, outcome, ended_s in in_flight:
        want = references[IN_FLIGHT_TOKENS][index % len(shared)]
        assert outcome.status is None and outcome.text == want.text, f"in-flight stream {index}: {outcome}"
        assert outcome.front == "http" or outcome.token_ids == want.token_ids
    assert max(ended_s for _, _, ended_s in in_flight) > killed_s  # they were in flight at the kill
    cluster.assert_all_kv_free()
    assert_prefill_kv_free(cluster)
    wait_until(lambda: not any(in_flight_gauges(cluster.gateway.http_port).values()),
               "the in-flight gauges to be back to 0", 30.0)
    for service in cluster.services:
        assert "Traceback" not in service.log_path.read_text(errors="replace"), f"{service.name}: {service.log_tail()}"
