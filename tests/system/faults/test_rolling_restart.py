"""A rolling restart under steady load: every process of the deployment (two gateways, two prefill
and two decode replicas) is stopped with SIGTERM and started again, one after another, while
requests keep arriving. Each drains first (a replica leaves the registry and finishes what it
runs, a gateway refuses new requests with UNAVAILABLE and finishes the ones it streams), so no
request fails: a client whose gateway refuses it before any token tries the other gateway, as a
load balancer does, and every answer is the one an unharmed run gives."""
import asyncio
import threading
import time

import grpc
import pytest

from pdserve.v1 import gateway_pb2_grpc
from tests.system.faults.conftest import StreamRun, greedy_request
from tests.system.faults.test_decode_migration import prompts

pytestmark = pytest.mark.faults

LAYOUT = [("prefill", "p0", ()), ("prefill", "p1", ()), ("decode", "d0", ()), ("decode", "d1", ()),
          ("gateway", "gw0", ()), ("gateway", "gw1", ())]
RESTART_ORDER = ["p0", "d0", "gw0", "p1", "d1", "gw1"]
NUM_TOKENS = 40
EVERY_S = 0.25  # between arrivals
NUM_PROMPTS = 8  # the arrivals cycle through them
STREAM_TIMEOUT_S = 120.0


class SteadyLoad:
    """Requests every EVERY_S on a thread of its own, each sent to the gateways in turn; one
    refused before its first token (UNAVAILABLE) goes to the next gateway, up to one try each."""

    def __init__(self, gateways, cases: list[list[int]]):
        self.gateways = gateways  # () -> the endpoints of the gateways now serving
        self.cases = cases
        self.outcomes: list[tuple[int, list[int], grpc.aio.AioRpcError | None, int]] = []  # case, tokens, error, tries
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(STREAM_TIMEOUT_S + 10)

    async def _run(self) -> None:
        tasks, index = [], 0
        while not self._stop.is_set():
            tasks.append(asyncio.create_task(self._one(index)))
            index += 1
            await asyncio.sleep(EVERY_S)
        await asyncio.gather(*tasks)

    async def _one(self, index: int) -> None:
        case = index % len(self.cases)
        request = greedy_request(f"load-{index}", self.cases[case], NUM_TOKENS)
        endpoints = self.gateways()
        error = None
        for tries, endpoint in enumerate(endpoints[index % len(endpoints):] + endpoints[:index % len(endpoints)], 1):
            tokens, error = await _stream(endpoint, request)
            if error is None or tokens or error.code() != grpc.StatusCode.UNAVAILABLE:
                break
        self.outcomes.append((case, tokens, error, tries))


async def _stream(endpoint: str, request) -> tuple[list[int], grpc.aio.AioRpcError | None]:
    tokens = []
    try:
        async with grpc.aio.insecure_channel(endpoint) as channel:
            async for chunk in gateway_pb2_grpc.GatewayStub(channel).Generate(request, timeout=STREAM_TIMEOUT_S):
                tokens += chunk.token_ids
    except grpc.aio.AioRpcError as exc:
        return tokens, exc
    return tokens, None


@pytest.mark.timeout(600)
def test_a_rolling_restart_of_every_process_under_load_fails_no_request(make_cluster, e2e_model):
    cluster = make_cluster(LAYOUT)
    cases = prompts(e2e_model, NUM_PROMPTS, seed=41)
    reference = asyncio.run(StreamRun(cluster.gateway.endpoint, [
        greedy_request(f"ref-{i}", prompt, NUM_TOKENS) for i, prompt in enumerate(cases)]).run())
    assert all(outcome.error is None for outcome in reference)

    load = SteadyLoad(lambda: [s.endpoint for s in cluster.services if s.kind == "gateway"], cases)
    load.start()
    restart_s = {}
    try:
        for name in RESTART_ORDER:
            started_s = time.monotonic()
            cluster.restart(next(s for s in cluster.services if s.name == name))
            restart_s[name] = time.monotonic() - started_s
    finally:
        load.stop()

    failed = [(case, error.code().name, error.details()) for case, _, error, _ in load.outcomes if error is not None]
    retried = sum(tries > 1 for *_, tries in load.outcomes)
    print(f"\nrolling restart: {len(load.outcomes)} requests, {len(failed)} failed, {retried} sent to the other "
          f"gateway after a refusal; restarts took {', '.join(f'{n} {s:.1f}s' for n, s in restart_s.items())}")
    assert len(load.outcomes) >= 4 * len(RESTART_ORDER)
    assert failed == []
    for case, tokens, _, _ in load.outcomes:
        assert tokens == reference[case].token_ids
    cluster.assert_all_kv_free()
