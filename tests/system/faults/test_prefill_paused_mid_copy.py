"""A prefill replica stopped (SIGSTOP) in the middle of its in-place copy into a decode replica's
shared-memory pool, and kept stopped past its reservation while other requests run, then let go
on (SIGCONT): its request fails cleanly, every other request streams exactly the tokens of an
unharmed run, and every KV block comes back.

The blocks of the stopped copy are the decode pool's first ones (the first reservation of a new
replica), so the test watches the first block's bytes in the segment and stops the writer once
they change. Whether it lands mid-copy or just after, what must hold is the same: the blocks the
writer may still write go to no other request. The decode replica hands freed blocks of an
unlanded reservation out first, so without a fence the requests sent while it is stopped would
get exactly those blocks, and its resumed copy would overwrite their KV.
"""
import asyncio
import mmap
import os
import re
import signal
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch

from pdserve.engine.config import ModelConfig
from pdserve.engine.kv_cache import KVCacheSpec
from tests.system.faults.conftest import StreamRun, assert_prefill_kv_free, greedy_request, request_info

pytestmark = pytest.mark.faults

BLOCK_SIZE = 16
VICTIM_TOKENS = 1900  # its KV (16 KiB a token here) takes the copy tens of milliseconds
NUM_OTHERS = 6
OTHER_TOKENS = 300
OTHER_OUTPUT_TOKENS = 120
RESERVATION_TIMEOUT_S = 2.0
WAIT_S = 90.0


@pytest.fixture(scope="module")
def e2e_model(tiny_model) -> str:
    return tiny_model(num_kv_heads=8, head_dim=64)


def kv_spec(model_dir: str) -> KVCacheSpec:
    config = ModelConfig.from_dir(model_dir)
    return KVCacheSpec(num_layers=config.num_layers, num_kv_heads=config.num_kv_heads, head_dim=config.head_dim,
                       block_size=BLOCK_SIZE, dtype=torch.float32)


def prompts(model_dir: str, num_prompts: int, num_tokens: int, seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    vocab_size = ModelConfig.from_dir(model_dir).vocab_size
    return torch.randint(0, vocab_size, (num_prompts, num_tokens), generator=generator).tolist()


def decode_pool(pid: int, spec: KVCacheSpec) -> np.ndarray:
    """The decode replica's pool as it lives in shared memory, read-only:
    [num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]."""
    [path] = set(re.findall(r"/dev/shm/pdserve_kv_\w+", Path(f"/proc/{pid}/maps").read_text()))
    with open(path, "rb") as segment:
        memory = mmap.mmap(segment.fileno(), 0, prot=mmap.PROT_READ)
    num_blocks = len(memory) // spec.bytes_per_block
    return np.frombuffer(memory, dtype=np.float32, count=num_blocks * spec.bytes_per_block // 4).reshape(
        spec.shape(num_blocks))


def prefill_replica_of(cluster, request_id: str) -> str:
    """The prefill replica the gateway placed the request on; "" until then."""
    try:
        return request_info(cluster, request_id).prefill_replica
    except grpc.RpcError as error:
        if error.code() != grpc.StatusCode.NOT_FOUND:  # not yet at the gateway
            raise
        return ""


def stop_once_written(pool: np.ndarray, pid: int, num_blocks: int) -> bool:
    """Stops `pid` as soon as the pool's first block changes (its copy of blocks 0 to
    num_blocks - 1 has begun); True if it stopped before the copy's last write, the last layer
    of its last block."""
    deadline_s = time.monotonic() + WAIT_S
    while not pool[0, 0, 0].any():
        assert time.monotonic() < deadline_s, "the victim's KV never reached the decode pool"
    os.kill(pid, signal.SIGSTOP)
    while not all(stat.read_text().rsplit(")", 1)[1].split()[0] == "T"
                  for stat in Path(f"/proc/{pid}/task").glob("*/stat")):
        assert time.monotonic() < deadline_s, f"process {pid} did not stop"
    return not pool[-1, 1, num_blocks - 1].any()


@pytest.mark.timeout(600)
def test_a_prefill_replica_stopped_mid_copy_past_its_reservation_writes_into_no_other_request(
        make_cluster, e2e_model):
    cluster = make_cluster([
        ("decode", "d0", ("--reservation-timeout-s", str(RESERVATION_TIMEOUT_S), "--no-enable-prefix-caching",
                          "--block-size", str(BLOCK_SIZE))),
        ("prefill", "p0", ("--no-enable-prefix-caching", "--block-size", str(BLOCK_SIZE))),
        ("prefill", "p1", ("--no-enable-prefix-caching", "--block-size", str(BLOCK_SIZE))),
        ("gateway", "gw", ("--prefill-placement", "remote", "--transport", "shm", "--migration-limit", "0"))])
    pid_of = {service.name: service.process.pid for service in cluster.services}
    spec = kv_spec(e2e_model)
    pool = decode_pool(pid_of["d0"], spec)
    assert not pool.any(), "the decode pool was written before the first request"
    [victim_prompt] = prompts(e2e_model, 1, VICTIM_TOKENS, seed=31)
    others = prompts(e2e_model, NUM_OTHERS, OTHER_TOKENS, seed=32)
    victim_blocks = -(-VICTIM_TOKENS // BLOCK_SIZE)
    stopped_mid_copy: list[bool] = []
    meanwhile = StreamRun(cluster.gateway.endpoint, [greedy_request(f"other-{i}", prompt, OTHER_OUTPUT_TOKENS)
                                                     for i, prompt in enumerate(others)])

    async def stop_the_victims_writer_mid_copy(run: StreamRun) -> None:
        """Stops the victim's prefill replica once its copy began, runs the others once the
        victim has failed, and lets the replica go on once each of them has its first token."""
        deadline_s = time.monotonic() + WAIT_S
        while not (writer := await asyncio.to_thread(prefill_replica_of, cluster, "victim")):
            assert time.monotonic() < deadline_s, "the victim was never placed"
            await asyncio.sleep(0.01)
        run.victim = writer
        stopped_mid_copy.append(await asyncio.to_thread(stop_once_written, pool, pid_of[run.victim], victim_blocks))
        run.killed_s = time.monotonic()
        await run.wait_for(lambda outcomes: outcomes[0].ended_s > 0, "the victim to end", WAIT_S)
        streams = asyncio.create_task(meanwhile.run())
        await meanwhile.wait_for(lambda outcomes: all(o.token_ids or o.error for o in outcomes),
                                 "every other request to start", WAIT_S)
        assert time.monotonic() - run.killed_s > RESERVATION_TIMEOUT_S  # its reservation is over
        os.kill(pid_of[run.victim], signal.SIGCONT)  # its copy carries on, into the blocks it had
        await streams

    run = StreamRun(cluster.gateway.endpoint, [greedy_request("victim", victim_prompt, 8)])
    try:
        [victim] = asyncio.run(run.run(stop_the_victims_writer_mid_copy))
    finally:
        if run.victim is not None:
            os.kill(pid_of[run.victim], signal.SIGCONT)
    print(f"\nprefill replica {run.victim} stopped {'mid-copy' if stopped_mid_copy == [True] else 'after its copy'}; "
          f"its request ended with {victim.error.code().name if victim.error else 'no error'}")

    assert victim.error is not None and victim.error.code() == grpc.StatusCode.UNAVAILABLE, victim.error
    outcomes = meanwhile.outcomes
    assert [o.error for o in outcomes] == [None] * NUM_OTHERS
    cluster.assert_all_kv_free(timeout_s=30.0)
    assert_prefill_kv_free(cluster, timeout_s=30.0)
    reference = asyncio.run(StreamRun(cluster.gateway.endpoint, [
        greedy_request(f"ref-{i}", prompt, OTHER_OUTPUT_TOKENS) for i, prompt in enumerate(others)]).run())
    for i, (outcome, want) in enumerate(zip(outcomes, reference)):
        assert want.error is None and len(want.token_ids) == OTHER_OUTPUT_TOKENS
        assert outcome.token_ids == want.token_ids, f"request other-{i} differs from the unharmed run"
