"""A prefill replica killed with SIGKILL while long prompts are in flight on it: each of its
requests is prefilled again on the other replica, into a fresh reservation, and every client
gets the output of an unharmed run; no KV block stays taken on either side."""
import asyncio
import time

import grpc
import pytest
import torch

from pdserve.engine.config import ModelConfig
from pdserve.v1 import gateway_pb2
from tests.system.faults.conftest import (
    StreamRun, assert_prefill_kv_free, greedy_request, migrations, num_prefills, recovery_s, request_info,
    wait_until_gone)

pytestmark = pytest.mark.faults

NUM_REQUESTS = 16
NUM_TOKENS = 8


def long_prompts(e2e_model: str) -> list[list[int]]:
    generator = torch.Generator().manual_seed(21)
    vocab_size = ModelConfig.from_dir(e2e_model).vocab_size
    return [torch.randint(0, vocab_size, (int(n),), generator=generator).tolist()
            for n in torch.randint(600, 1200, (NUM_REQUESTS,), generator=generator)]


@pytest.mark.timeout(420)
def test_killing_a_prefill_replica_with_prompts_in_flight_loses_no_request(make_cluster, e2e_model):
    cluster = make_cluster([("decode", "d0", ()), ("decode", "d1", ()), ("prefill", "p0", ()),
                            ("prefill", "p1", ()), ("gateway", "gw", ("--prefill-placement", "remote"))])
    cases = long_prompts(e2e_model)
    reference = asyncio.run(StreamRun(cluster.gateway.endpoint, [
        greedy_request(f"ref-{i}", prompt, NUM_TOKENS) for i, prompt in enumerate(cases)]).run())
    assert all(outcome.error is None for outcome in reference)

    async def kill_a_busy_prefill_replica(run: StreamRun):
        """Kills the replica of the first request found still prefilling, the latest sent first
        (the likeliest to be queued behind others), as soon as it is found."""
        deadline_s = time.monotonic() + 60.0
        while (victim := await asyncio.to_thread(_a_prefilling_replica, cluster)) is None:
            assert time.monotonic() < deadline_s, "no request was seen prefilling"
            await asyncio.sleep(0.01)
        cluster.kill(next(s for s in cluster.services if s.name == victim))
        run.victim, run.killed_s = victim, time.monotonic()

    run = StreamRun(cluster.gateway.endpoint, [greedy_request(f"p-{i}", p, NUM_TOKENS) for i, p in enumerate(cases)])
    outcomes = asyncio.run(run.run(kill_a_busy_prefill_replica))

    failed = [(i, o.error.code(), o.error.details()) for i, o in enumerate(outcomes) if o.error is not None]
    moved = migrations(cluster).get("prefill_unavailable", 0)
    num_moved = sum(num_prefills(request_info(cluster, f"p-{i}")) > 1 for i in range(NUM_REQUESTS))
    print(f"\nprefill kill: {NUM_REQUESTS} requests of {min(map(len, cases))}-{max(map(len, cases))} prompt tokens, "
          f"{len(failed)} failed, {num_moved} moved, {moved:.0f} migrations, longest wait across the kill "
          f"{recovery_s(outcomes, run.killed_s):.2f}s, all done {max(o.ended_s for o in outcomes) - run.killed_s:.2f}s "
          f"after it")
    assert failed == []
    assert moved >= 1
    for i, (outcome, want) in enumerate(zip(outcomes, reference)):
        assert outcome.token_ids == want.token_ids, f"request {i} differs from the unharmed run"
        assert outcome.last.usage.prompt_tokens == len(cases[i])
    wait_until_gone(cluster, "prefill", run.victim)
    cluster.assert_all_kv_free()
    assert_prefill_kv_free(cluster)


def _a_prefilling_replica(cluster) -> str | None:
    for i in reversed(range(NUM_REQUESTS)):
        try:
            info = request_info(cluster, f"p-{i}")
        except grpc.RpcError as error:
            if error.code() != grpc.StatusCode.NOT_FOUND:  # not yet at the gateway
                raise
            continue
        if info.state == gateway_pb2.REQUEST_STATE_PREFILLING and info.prefill_replica:
            return info.prefill_replica
    return None
