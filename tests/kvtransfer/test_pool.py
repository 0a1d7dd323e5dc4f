"""The decode pool's memory as a specification: a shared CPU pool is a named segment that the
owner unlinks, that another mapping sees byte for byte, and that never dangles under a tensor."""
import os

import pytest
import torch

from pdserve.engine.kv_cache import KVCacheSpec
from pdserve.protocol.errors import TransferError, TransportUnavailableError
from pdserve.kvtransfer.in_place import copy_blocks
from pdserve.kvtransfer.shm import SHM_DIR, map_shared_pool
from pdserve.kvtransfer.transports import create_kv_pool, target_fields
from pdserve.v1 import common_pb2

SPEC = KVCacheSpec(num_layers=2, num_kv_heads=2, head_dim=4, block_size=4, dtype=torch.bfloat16)


def test_shared_pool_is_visible_through_a_second_mapping_until_unlinked():
    pool = create_kv_pool(SPEC, num_blocks=6, device="cpu", shared=True)
    try:
        assert pool.tensor.shape == (2, 2, 6, 4, 2, 4) and pool.tensor.dtype == torch.bfloat16
        assert not pool.tensor.any()
        fields = target_fields(pool, common_pb2.TRANSPORT_SHM)
        name = fields["shm_name"]
        assert name.startswith("pdserve_kv_") and fields == {"shm_name": name, "pool_num_blocks": 6}
        view = map_shared_pool(name, SPEC, 6)
        view[1, 0, 5] = 2.0
        assert torch.all(pool.tensor[1, 0, 5] == 2.0)
    finally:
        pool.close()
    assert not os.path.exists(os.path.join(SHM_DIR, name))
    assert torch.all(pool.tensor[1, 0, 5] == 2.0)  # the owner's tensor outlives the name
    pool.close()  # idempotent


def test_mapping_a_missing_or_short_segment_fails_and_creates_nothing():
    with pytest.raises(TransferError, match="cannot open"):
        map_shared_pool("pdserve_kv_missing", SPEC, 6)
    assert not os.path.exists(os.path.join(SHM_DIR, "pdserve_kv_missing"))
    pool = create_kv_pool(SPEC, num_blocks=2, device="cpu", shared=True)
    try:
        with pytest.raises(TransferError, match="needs"):
            map_shared_pool(target_fields(pool, common_pb2.TRANSPORT_SHM)["shm_name"], SPEC, 6)
    finally:
        pool.close()


def test_private_pool_offers_no_shared_memory_or_cuda_ipc():
    pool = create_kv_pool(SPEC, num_blocks=2, device="cpu", shared=False)
    assert target_fields(pool, common_pb2.TRANSPORT_GRPC) == {"pool_num_blocks": 2}
    with pytest.raises(TransportUnavailableError, match="not shared"):
        target_fields(pool, common_pb2.TRANSPORT_SHM)
    with pytest.raises(TransportUnavailableError, match="CUDA"):
        target_fields(pool, common_pb2.TRANSPORT_CUDA_IPC)


def test_copy_blocks_moves_whole_blocks_in_order_and_nothing_else():
    src = torch.randn(2, 2, 5, 4, 2, 4).to(SPEC.dtype)
    dst = torch.zeros(2, 2, 8, 4, 2, 4, dtype=SPEC.dtype)
    copy_blocks(dst, [7, 0, 3], src, [4, 1, 2])
    assert torch.equal(dst[:, :, [7, 0, 3]], src[:, :, [4, 1, 2]])
    assert not dst[:, :, [1, 2, 4, 5, 6]].any()


def test_copy_blocks_handles_runs_of_consecutive_blocks():
    src = torch.randn(2, 2, 6, 4, 2, 4).to(SPEC.dtype)
    dst = torch.zeros(2, 2, 9, 4, 2, 4, dtype=SPEC.dtype)
    copy_blocks(dst, [2, 3, 4, 8, 0, 1], src, [0, 1, 2, 5, 3, 4])
    assert torch.equal(dst[:, :, [2, 3, 4, 8, 0, 1]], src[:, :, [0, 1, 2, 5, 3, 4]])
    assert not dst[:, :, [5, 6, 7]].any()
