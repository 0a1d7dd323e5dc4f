"""A prefill replica killed with SIGKILL while long prompts are in flight on it: each of its
requests is prefilled again on the other replica, into a fresh reservation, and every client
gets the output of an unharmed run; no KV block stays taken on either side."""
import asyncio
import time

import pytest
import torch

from engine.config import ModelConfig
from tests.faults.conftest import (
    StreamRun, assert_prefill_kv_free, greedy_request, migrations, num_prefills, recovery_s, request_info,
    wait_until_gone)

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
                            ("prefill", "p1", ()), ("gateway", "gw", ())])
    cases = long_prompts(e2e_model)
    reference = asyncio.run(StreamRun(cluster.gateway.endpoint, [
        greedy_request(f"ref-{i}", prompt, NUM_TOKENS) for i, prompt in enumerate(cases)]).run())
    assert all(outcome.error is None for outcome in reference)

    async def kill_a_busy_prefill_replica(run: StreamRun):
        await run.wait_for(lambda outcomes: any(o.token_ids for o in outcomes), "a first token")
        waiting = [f"p-{i}" for i, o in enumerate(run.outcomes) if not o.token_ids]
        infos = [await asyncio.to_thread(request_info, cluster, request_id) for request_id in waiting]
        run.victim = next(info.prefill_replica for info in infos if info.prefill_replica)
        cluster.kill(next(s for s in cluster.services if s.name == run.victim))
        run.killed_s = time.monotonic()

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
