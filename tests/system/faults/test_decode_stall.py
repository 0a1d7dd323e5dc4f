"""A decode replica that stalls mid-stream without dying (SIGSTOP, kept stopped): keepalive finds
it silent, its requests move to the other replica and end with the tokens of an unharmed run,
new requests meanwhile go elsewhere, and once it runs again every KV block comes back and every
request record is terminal."""
import asyncio
import os
import signal
import time

import pytest

from pdserve.v1 import gateway_pb2
from tests.system.faults.conftest import StreamRun, greedy_request, migrations, request_info
from tests.system.faults.test_decode_migration import kill_mid_stream, prompts

pytestmark = pytest.mark.faults

NUM_STREAMS = 16
NUM_TOKENS = 200
NUM_NEW = 8  # requests sent while the replica is stopped
NEW_EVERY_S = 0.5
NEW_TOKENS = 16
STALL_BOUND_S = 45.0  # how much longer than the unharmed run the stalled batch may take
NEW_REQUEST_BOUND_S = 15.0
TERMINAL = {gateway_pb2.REQUEST_STATE_FINISHED, gateway_pb2.REQUEST_STATE_FAILED, gateway_pb2.REQUEST_STATE_ABORTED}


def new_requests_meanwhile(new_prompts: list[list[int]], latencies_s: list):
    """An `after` for kill_mid_stream: sends `new_prompts` one every NEW_EVERY_S and records how
    long each took (or its error)."""
    async def after(run: StreamRun):
        async def one(i: int, prompt: list[int]) -> None:
            await asyncio.sleep(i * NEW_EVERY_S)
            started_s = time.monotonic()
            [outcome] = await StreamRun(run.endpoint, [greedy_request(f"new-{i}", prompt, NEW_TOKENS)]).run()
            latencies_s.append(outcome.error or time.monotonic() - started_s)
        await asyncio.gather(*(one(i, prompt) for i, prompt in enumerate(new_prompts)))
    return after


def sigstop(service) -> None:
    os.kill(service.process.pid, signal.SIGSTOP)


@pytest.mark.timeout(420)
def test_a_stopped_decode_replica_loses_no_request_and_its_blocks_come_back_after_it_resumes(
        make_cluster, e2e_model):
    cluster = make_cluster([("decode", "d0", ()), ("decode", "d1", ()), ("prefill", "p0", ()), ("gateway", "gw", ())])
    cases = prompts(e2e_model, NUM_STREAMS, seed=21)
    started_s = time.monotonic()
    reference = asyncio.run(StreamRun(cluster.gateway.endpoint, [
        greedy_request(f"ref-{i}", prompt, NUM_TOKENS) for i, prompt in enumerate(cases)]).run())
    unharmed_s = time.monotonic() - started_s
    assert all(outcome.error is None for outcome in reference)

    new_latencies_s: list = []
    run = StreamRun(cluster.gateway.endpoint, [greedy_request(f"r-{i}", p, NUM_TOKENS) for i, p in enumerate(cases)])
    started_s = time.monotonic()
    try:
        during = kill_mid_stream(cluster, min_tokens=20, min_left=50, strike=sigstop,
                                 after=new_requests_meanwhile(prompts(e2e_model, NUM_NEW, seed=22), new_latencies_s))
        outcomes = asyncio.run(run.run(during))
        harmed_s = time.monotonic() - started_s
        moved = migrations(cluster).get("decode_unavailable", 0)
    finally:
        for service in cluster.services:
            if service.process.poll() is None:
                os.kill(service.process.pid, signal.SIGCONT)
    print(f"\ndecode stopped: {NUM_STREAMS} streams x {NUM_TOKENS} tokens in {harmed_s:.1f}s against "
          f"{unharmed_s:.1f}s unharmed, {moved:.0f} migrations; new requests meanwhile: "
          f"{[f'{x:.1f}s' if isinstance(x, float) else x.code().name for x in new_latencies_s]}")

    failed = [(i, o.error.code(), o.error.details()) for i, o in enumerate(outcomes) if o.error is not None]
    assert failed == []
    for i, (outcome, want) in enumerate(zip(outcomes, reference)):
        assert outcome.token_ids == want.token_ids, f"stream {i} differs from the unharmed run"
    assert moved >= 1 and request_info(cluster, run.struck_request).decode_replica != run.victim
    assert harmed_s <= unharmed_s + STALL_BOUND_S
    served = [x for x in new_latencies_s if isinstance(x, float)]
    assert len(served) >= 0.9 * NUM_NEW, new_latencies_s
    assert max(served) <= NEW_REQUEST_BOUND_S, new_latencies_s

    cluster.wait_until(lambda: run.victim in cluster.replicas("decode"), f"{run.victim} to register again", 30.0)
    cluster.assert_all_kv_free(timeout_s=30.0)
    records = [f"r-{i}" for i in range(NUM_STREAMS)] + [f"new-{i}" for i in range(NUM_NEW)]
    assert all(request_info(cluster, request_id).state in TERMINAL for request_id in records)
