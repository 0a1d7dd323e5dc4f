"""The in-place transports' write fence as a specification: the decode end cannot close a
reservation's fence while a writer holds it (mid-copy, stopped, however long), a writer that
comes after the close writes nothing, and a writer's process that dies lets go of it. The shm
sender is checked against it in this process: a decode pool in shared memory and its fence here,
commits recorded instead of sent."""
import asyncio
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

from pdserve.engine.kv_cache import KVCacheSpec
from pdserve.kvtransfer.in_place import copy_blocks
from pdserve.kvtransfer.layout import make_layout
from pdserve.kvtransfer.shm import ShmSender, create_shared_pool
from pdserve.kvtransfer.target import KVTarget
from pdserve.kvtransfer.wire import target_to_proto
from pdserve.kvtransfer.write_fence import WriteFence, hold
from pdserve.protocol.errors import TransferError
from pdserve.v1 import common_pb2

SPEC = KVCacheSpec(num_layers=3, num_kv_heads=2, head_dim=8, block_size=4, dtype=torch.float32)
LAYOUT = make_layout("tiny", SPEC)
NUM_DECODE_BLOCKS = 16
WAIT_S = 10.0


@pytest.fixture
def fence():
    fence = WriteFence(NUM_DECODE_BLOCKS)
    yield fence
    fence.close()


@pytest.fixture
def decode_pool():
    pool = create_shared_pool(SPEC, NUM_DECODE_BLOCKS)
    yield pool
    pool.close()


def target_of(fence: WriteFence, block_ids: tuple[int, ...], shm_name: str = "", ttl_s: float = 60.0) -> KVTarget:
    return KVTarget("r", block_ids, LAYOUT, common_pb2.TRANSPORT_SHM, shm_name=shm_name,
                    pool_num_blocks=NUM_DECODE_BLOCKS, deadline_unix_s=time.time() + ttl_s,
                    fence_name=fence.name, fence_generation=fence.generation(block_ids[0]))


def test_the_fence_cannot_close_under_a_writer_and_no_writer_passes_it_once_closed(fence):
    target = target_of(fence, (5, 6))
    with hold(target):
        assert fence.try_close(5) is False
        assert fence.try_close(6) is True  # another reservation's first block: not this one's
    assert fence.try_close(5) is True
    with pytest.raises(TransferError, match="reservation ended before the copy"):
        with hold(target):
            pytest.fail("a writer passed a closed fence")


def test_a_fence_gone_with_its_decode_replica_lets_no_writer_pass():
    fence = WriteFence(NUM_DECODE_BLOCKS)
    target = target_of(fence, (1,))
    fence.close()
    with pytest.raises(TransferError, match="write fence"):
        with hold(target):
            pytest.fail("a writer passed a fence that is gone")


HOLDER = """
import sys, time
from pdserve.kvtransfer.write_fence import hold
from pdserve.kvtransfer.wire import target_from_proto
from pdserve.v1 import kv_transfer_pb2
with hold(target_from_proto(kv_transfer_pb2.KVTarget.FromString(bytes.fromhex(sys.argv[1])))):
    print("holding", flush=True)
    time.sleep(600)
"""


def test_a_stopped_writer_keeps_the_fence_and_a_dead_one_lets_go(fence):
    wire = target_to_proto(target_of(fence, (3,))).SerializeToString().hex()
    writer = subprocess.Popen([sys.executable, "-c", HOLDER, wire], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "holding"
        os.kill(writer.pid, signal.SIGSTOP)
        assert fence.try_close(3) is False
        writer.kill()
        writer.wait(WAIT_S)
        assert fence.try_close(3) is True
    finally:
        if writer.poll() is None:
            os.kill(writer.pid, signal.SIGCONT)
            writer.kill()
            writer.wait(WAIT_S)


class ShmSenderToHere(ShmSender):
    """Writes into this process's shared pool; records its commits instead of sending them. With
    `pause_mid_copy`, it stops after the first layer until `resume` is set, as a stopped process."""

    def __init__(self, pause_mid_copy: bool = False):
        super().__init__(LAYOUT, rpc_timeout_s=1.0)
        self.pause_mid_copy = pause_mid_copy
        self.mid_copy, self.resume = threading.Event(), threading.Event()
        self.commits: list[str] = []

        async def commit(request_id, target, layout, num_bytes):
            self.commits.append(request_id)
        self._client.commit = commit

    def _copy(self, dst, dst_block_ids, src, src_block_ids):
        if not self.pause_mid_copy:
            return super()._copy(dst, dst_block_ids, src, src_block_ids)
        copy_blocks(dst[:1], dst_block_ids, src[:1], src_block_ids)
        self.mid_copy.set()
        assert self.resume.wait(WAIT_S)
        copy_blocks(dst[1:], dst_block_ids, src[1:], src_block_ids)


def prefill_kv() -> torch.Tensor:
    return torch.randn(SPEC.shape(4), generator=torch.Generator().manual_seed(0))


def test_a_send_under_an_open_fence_lands_and_commits(fence, decode_pool):
    sender, kv = ShmSenderToHere(), prefill_kv()
    asyncio.run(sender.send("r", kv, [2, 3], target_of(fence, (7, 8), decode_pool.segment_name)))
    assert torch.equal(decode_pool.tensor[:, :, [7, 8]], kv[:, :, [2, 3]])
    assert sender.commits == ["r"]


def test_a_send_after_the_fence_closed_writes_nothing(fence, decode_pool):
    sender = ShmSenderToHere()
    target = target_of(fence, (7, 8), decode_pool.segment_name)
    assert fence.try_close(7)  # the reservation ended before the sender's turn came
    with pytest.raises(TransferError, match="reservation ended before the copy"):
        asyncio.run(sender.send("r", prefill_kv(), [2, 3], target))
    assert not decode_pool.tensor.any() and sender.commits == []


def test_a_sender_stopped_mid_copy_past_the_deadline_keeps_the_blocks_until_it_has_finished(fence, decode_pool):
    sender, kv = ShmSenderToHere(pause_mid_copy=True), prefill_kv()
    target = target_of(fence, (7, 8), decode_pool.segment_name, ttl_s=0.2)

    async def stop_mid_copy_past_the_deadline():
        send = asyncio.create_task(sender.send("r", kv, [2, 3], target))
        assert await asyncio.to_thread(sender.mid_copy.wait, WAIT_S)
        while time.time() < target.deadline_unix_s:
            await asyncio.sleep(0.05)
        assert fence.try_close(7) is False  # the decode end cannot hand the blocks to anyone
        sender.resume.set()
        with pytest.raises(TransferError, match="expired before the copy ended"):
            await send
        assert fence.try_close(7) is True

    asyncio.run(stop_mid_copy_past_the_deadline())
    assert torch.equal(decode_pool.tensor[:, :, [7, 8]], kv[:, :, [2, 3]])  # into its own blocks only
    assert not decode_pool.tensor[:, :, [b for b in range(NUM_DECODE_BLOCKS) if b not in (7, 8)]].any()
    assert sender.commits == []
