"""TRANSPORT_CUDA_IPC's policy where no GPU is: what a KV target carries of the decode pool, when
the prefill end opens and closes its mappings (a fake mapping stands for the CUDA one), and the
deadline checked again once a copy ends. The CUDA calls themselves run in scripts/gpu_check.sh."""
import asyncio
import time

import pytest
import torch

from pdserve.engine.kv_cache import KVCacheSpec
from pdserve.kvtransfer.cuda_ipc import CudaIpcKVPool, OpenedPools, PoolExport, target_fields
from pdserve.protocol.errors import TransferError, TransportUnavailableError
from pdserve.kvtransfer.in_place import InPlaceSender, copy_blocks
from pdserve.kvtransfer.layout import make_layout
from pdserve.kvtransfer.target import KVTarget
from pdserve.kvtransfer.wire import target_from_proto, target_to_proto
from pdserve.kvtransfer.write_fence import WriteFence
from pdserve.v1 import common_pb2

SPEC = KVCacheSpec(num_layers=2, num_kv_heads=2, head_dim=8, block_size=4, dtype=torch.float32)
LAYOUT = make_layout("tiny", SPEC)
EXPORT = PoolExport(generation="a" * 32, mem_handle=bytes(range(64)), num_bytes=8 * SPEC.bytes_per_block)


def test_the_pool_export_crosses_the_wire_in_the_target_unchanged():
    target = KVTarget("r", (1, 2), LAYOUT, common_pb2.TRANSPORT_CUDA_IPC, cuda_ipc_handle=EXPORT.encode(),
                      cuda_device=3, pool_num_blocks=8)
    received = target_from_proto(target_to_proto(target))
    assert PoolExport.decode(received.cuda_ipc_handle) == EXPORT
    assert received.cuda_device == 3


@pytest.mark.parametrize("handle", [b"", b"{}", b"not json", b'{"generation": "g", "num_bytes": 1, "mem_handle": "!!"}'])
def test_a_malformed_handle_is_a_transfer_error(handle):
    with pytest.raises(TransferError, match="malformed cuda_ipc_handle"):
        PoolExport.decode(handle)


def test_a_pool_torch_allocated_without_cupy_refuses_cuda_ipc_and_says_why():
    pool = CudaIpcKVPool(SPEC, SPEC.allocate(8, torch.device("cpu")), exportable=False)
    with pytest.raises(TransportUnavailableError, match="cupy"):
        target_fields(pool)


class Mappings:
    """Fake mappings: records what is opened and closed."""

    def __init__(self):
        self.opened: list[str] = []
        self.closed: list[str] = []

    def opener(self, generation: str):
        return lambda: self.opened.append(generation) or f"mapping of {generation}"

    def close(self, mapping: str) -> None:
        self.closed.append(mapping.removeprefix("mapping of "))


def test_a_pool_is_opened_once_per_generation_and_a_new_generation_closes_the_old():
    mappings = Mappings()
    opened = OpenedPools(mappings.close)
    for _ in range(3):
        assert opened.acquire("decode-0", "g1", mappings.opener("g1")) == "mapping of g1"
        opened.release("g1")
    opened.acquire("decode-1", "h1", mappings.opener("h1"))
    opened.release("h1")
    assert mappings.opened == ["g1", "h1"] and mappings.closed == []

    opened.acquire("decode-0", "g2", mappings.opener("g2"))  # decode-0 came back with a new pool
    assert mappings.opened == ["g1", "h1", "g2"] and mappings.closed == ["g1"]
    with pytest.raises(TransferError, match="newer pool"):
        opened.acquire("decode-0", "g1", mappings.opener("g1"))
    opened.release("g2")
    opened.close()
    assert sorted(mappings.closed) == ["g1", "g2", "h1"]


def test_a_mapping_in_use_is_closed_only_when_its_last_copy_ends():
    mappings = Mappings()
    opened = OpenedPools(mappings.close)
    opened.acquire("decode-0", "g1", mappings.opener("g1"))
    opened.acquire("decode-0", "g1", mappings.opener("g1"))
    opened.acquire("decode-0", "g2", mappings.opener("g2"))
    opened.release("g1")
    assert mappings.closed == []
    opened.release("g1")
    assert mappings.closed == ["g1"]
    opened.close()
    assert mappings.closed == ["g1"]  # g2 is still in use
    opened.release("g2")
    assert mappings.closed == ["g1", "g2"]


class SlowCopySender(InPlaceSender):
    """Copies into a local pool, taking `copy_s`; records commits instead of sending them."""
    transport = common_pb2.TRANSPORT_CUDA_IPC

    def __init__(self, copy_s: float):
        super().__init__(LAYOUT, rpc_timeout_s=1.0)
        self.copy_s = copy_s
        self.decode_pool = SPEC.allocate(8, torch.device("cpu"))
        self.commits: list[str] = []

        async def commit(request_id, target, layout, num_bytes):
            self.commits.append(request_id)
        self._client.commit = commit

    def _open_pool(self, target, kv_cache):
        return self.decode_pool

    def _copy(self, dst, dst_block_ids, src, src_block_ids):
        time.sleep(self.copy_s)
        copy_blocks(dst, dst_block_ids, src, src_block_ids)


@pytest.fixture
def fence():
    fence = WriteFence(8)
    yield fence
    fence.close()


@pytest.mark.parametrize("copy_s, commits", [(0.0, ["r"]), (0.5, [])])
def test_a_reservation_that_expires_during_the_copy_is_not_committed(fence, copy_s, commits):
    sender = SlowCopySender(copy_s)
    target = KVTarget("r", (5, 6), LAYOUT, common_pb2.TRANSPORT_CUDA_IPC, pool_num_blocks=8,
                      deadline_unix_s=time.time() + 0.25, fence_name=fence.name, fence_generation=fence.generation(5))
    send = sender.send("r", SPEC.allocate(4, torch.device("cpu")).normal_(), [0, 1], target)
    if commits:
        asyncio.run(send)
    else:
        with pytest.raises(TransferError, match="expired before the copy ended"):
            asyncio.run(send)
    assert sender.commits == commits
