"""A decode replica killed with SIGKILL mid-stream: its requests move to the surviving replica
and every client's stream carries on with no error, no token lost or repeated, and the very
tokens an unharmed run gives (greedy and seeded sampling alike). With nowhere to move to, or a
migration limit of 0, the client gets a prompt UNAVAILABLE (HTTP 503), never a hang."""
import asyncio
import json
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence

import grpc
import pytest
import torch

from pdserve.engine.config import ModelConfig
from pdserve.v1 import common_pb2, gateway_pb2
from tests.system.faults.conftest import (
    StreamRun, assert_prefill_kv_free, greedy_request, migrations, num_prefills, recovery_s, request_info,
    wait_until_gone)

pytestmark = pytest.mark.faults

NUM_STREAMS = 16
NUM_TOKENS = 200


def prompts(e2e_model: str, num_prompts: int, seed: int = 11) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    vocab_size = ModelConfig.from_dir(e2e_model).vocab_size
    return [torch.randint(0, vocab_size, (int(n),), generator=generator).tolist()
            for n in torch.randint(8, 120, (num_prompts,), generator=generator)]


def kill_mid_stream(cluster, min_tokens: int, min_left: int, strike=None, after=None,
                    candidates: Sequence[str] | None = None, lengths: Mapping[str, int] | None = None):
    """A `during` that kills (or `strike`s: a function of the service) the decode replica serving
    a request once it is mid-stream (`StreamRun.wait_mid_stream`: one of `candidates`, any by
    default, has `min_tokens` and `min_left` more to come); it records on the run that request,
    the replica's name and the kill's time, then awaits `after(run)` if given. Waiting on one
    stream, not on the slowest of all, keeps the kill mid-stream however unevenly a loaded
    machine runs the replicas."""
    async def during(run: StreamRun):
        run.struck_request = await run.wait_mid_stream(min_tokens, min_left, candidates, lengths)
        run.victim = (await asyncio.to_thread(request_info, cluster, run.struck_request)).decode_replica
        (strike or cluster.kill)(next(s for s in cluster.services if s.name == run.victim))
        run.killed_s = time.monotonic()
        if after is not None:
            await after(run)
    return during


@pytest.mark.timeout(420)
def test_killing_a_decode_replica_mid_stream_loses_no_request_and_changes_no_token(make_cluster, e2e_model):
    cluster = make_cluster([("decode", "d0", ()), ("decode", "d1", ()), ("prefill", "p0", ()),
                            ("prefill", "p1", ()), ("gateway", "gw", ())])
    cases = prompts(e2e_model, NUM_STREAMS)
    reference = asyncio.run(StreamRun(cluster.gateway.endpoint, [
        greedy_request(f"ref-{i}", prompt, NUM_TOKENS) for i, prompt in enumerate(cases)]).run())
    assert all(outcome.error is None for outcome in reference)
    assert len({request_info(cluster, f"ref-{i}").decode_replica for i in range(NUM_STREAMS)}) == 2

    run = StreamRun(cluster.gateway.endpoint, [greedy_request(f"r-{i}", prompt, NUM_TOKENS) for i, prompt in enumerate(cases)])
    outcomes = asyncio.run(run.run(kill_mid_stream(cluster, min_tokens=20, min_left=50)))

    failed = [(i, outcome.error.code(), outcome.error.details()) for i, outcome in enumerate(outcomes) if outcome.error]
    moved = migrations(cluster).get("decode_unavailable", 0)
    num_moved = sum(num_prefills(request_info(cluster, f"r-{i}")) > 1 for i in range(NUM_STREAMS))
    print(f"\ndecode kill: {NUM_STREAMS} streams x {NUM_TOKENS} tokens, {len(failed)} failed, {num_moved} moved, "
          f"{moved:.0f} migrations, longest wait across the kill {recovery_s(outcomes, run.killed_s):.2f}s, "
          f"all done {max(o.ended_s for o in outcomes) - run.killed_s:.2f}s after it")
    assert failed == []
    assert moved >= 1 and any(o.arrival_s[-1] > run.killed_s for o in outcomes)  # the kill was mid-stream
    for i, (outcome, want) in enumerate(zip(outcomes, reference)):
        assert outcome.token_ids == want.token_ids, f"stream {i} differs from the unharmed run"
        assert outcome.last.finish_reason == common_pb2.FINISH_REASON_LENGTH
        assert (outcome.last.usage.prompt_tokens, outcome.last.usage.completion_tokens) == (len(cases[i]), NUM_TOKENS)
    assert request_info(cluster, run.struck_request).decode_replica != run.victim
    wait_until_gone(cluster, "decode", run.victim)
    cluster.assert_all_kv_free()
    assert_prefill_kv_free(cluster)


@pytest.mark.timeout(420)
def test_a_migrated_seeded_sampled_request_gives_the_tokens_of_an_uninterrupted_run(make_cluster, e2e_model):
    cluster = make_cluster([("decode", "d0", ()), ("decode", "d1", ()), ("prefill", "p0", ()), ("gateway", "gw", ())])
    cases = prompts(e2e_model, 4, seed=5)

    def sampled(request_id: str, prompt: list[int]) -> gateway_pb2.GenerateRequest:
        return gateway_pb2.GenerateRequest(
            request_id=request_id, prompt_token_ids=gateway_pb2.TokenIds(ids=prompt),
            params=common_pb2.SamplingParams(
                max_tokens=120, temperature=0.9, top_p=0.95, seed=1234, ignore_eos=True, logprobs=1,
                presence_penalty=0.8, frequency_penalty=0.4, repetition_penalty=1.3, min_tokens=60))

    reference = asyncio.run(StreamRun(cluster.gateway.endpoint, [
        sampled(f"ref-{i}", prompt) for i, prompt in enumerate(cases)]).run())
    run = StreamRun(cluster.gateway.endpoint, [sampled(f"s-{i}", prompt) for i, prompt in enumerate(cases)])
    outcomes = asyncio.run(run.run(kill_mid_stream(cluster, min_tokens=15, min_left=40)))

    assert [outcome.error for outcome in outcomes] == [None] * len(cases)
    assert migrations(cluster).get("decode_unavailable", 0) >= 1
    assert request_info(cluster, run.struck_request).decode_replica != run.victim  # the struck stream itself moved
    for outcome, want in zip(outcomes, reference):
        assert outcome.token_ids == want.token_ids
        # A resumed request is re-prefilled in a different batch: fp32 sums reorder, so the
        # logprobs agree to rounding, not bit for bit.
        assert outcome.logprobs == pytest.approx(want.logprobs, abs=1e-3)
    wait_until_gone(cluster, "decode", run.victim)
    cluster.assert_all_kv_free()


def http_completion(cluster, prompt_ids: list[int]) -> tuple[int, dict]:
    model_name = cluster.model_dir.rstrip("/").rsplit("/", 1)[-1]
    body = json.dumps({"model": model_name, "prompt": prompt_ids, "max_tokens": 5}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{cluster.gateway.http_port}/v1/completions", body,
                                     {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.mark.timeout(300)
def test_with_no_decode_replica_left_requests_fail_unavailable_promptly(make_cluster, e2e_model):
    cluster = make_cluster([("decode", "d0", ()), ("prefill", "p0", ()), ("gateway", "gw", ())])
    cases = prompts(e2e_model, 2, seed=3)
    run = StreamRun(cluster.gateway.endpoint, [greedy_request(f"o-{i}", prompt, 1500) for i, prompt in enumerate(cases)])
    outcomes = asyncio.run(run.run(kill_mid_stream(cluster, min_tokens=3, min_left=500)))
    assert [outcome.error.code() for outcome in outcomes] == [grpc.StatusCode.UNAVAILABLE] * 2
    assert max(outcome.ended_s for outcome in outcomes) - run.killed_s < 5.0

    started_s = time.monotonic()
    status, body = http_completion(cluster, cases[0])  # the registry may still list d0: it is tried, then excluded
    assert status == 503 and body["error"]["type"] == "service_unavailable"
    assert time.monotonic() - started_s < 5.0


@pytest.mark.timeout(300)
def test_with_migration_limit_0_a_killed_decode_replica_fails_its_requests_unavailable(make_cluster, e2e_model):
    cluster = make_cluster([("decode", "d0", ()), ("decode", "d1", ()), ("prefill", "p0", ()),
                            ("gateway", "gw", ("--migration-limit", "0"))])
    cases = prompts(e2e_model, 4, seed=4)
    run = StreamRun(cluster.gateway.endpoint, [greedy_request(f"z-{i}", prompt, 400) for i, prompt in enumerate(cases)])
    outcomes = asyncio.run(run.run(kill_mid_stream(cluster, min_tokens=3, min_left=150)))
    failed = [outcome for outcome in outcomes if outcome.error is not None]
    assert failed and len(failed) < len(outcomes)  # the victim's requests fail, the survivor's finish
    assert all(o.error.code() == grpc.StatusCode.UNAVAILABLE and "migration limit 0" in o.error.details()
               for o in failed)
    assert max(outcome.ended_s for outcome in failed) - run.killed_s < 5.0
    assert migrations(cluster) == {}
