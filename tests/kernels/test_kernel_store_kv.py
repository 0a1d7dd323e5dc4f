"""The Triton store_kv kernel writes exactly what the reference writes, under the interpreter.

Copies are exact, so every dtype x head dim x block size combination is checked bit for bit.
"""
import pytest
import torch

from pdserve.kernels.reference import store_kv_reference
from pdserve.kernels.triton_store_kv import store_kv

NUM_BLOCKS = 5
NUM_KV_HEADS = 3  # not a power of two: the head axis is padded and masked too


def random_tensor(shape, dtype, device, generator):
    return torch.randn(shape, generator=generator).to(device=device, dtype=dtype)


def random_caches(block_size, head_dim, dtype, device, generator):
    shape = (NUM_BLOCKS, block_size, NUM_KV_HEADS, head_dim)
    return random_tensor(shape, dtype, device, generator), random_tensor(shape, dtype, device, generator)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 80, 128])
@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_store_kv_matches_reference(dtype, head_dim, block_size, device):
    generator = torch.Generator().manual_seed(block_size + head_dim)
    num_tokens = block_size + 3
    slot_mapping = torch.randperm(NUM_BLOCKS * block_size, generator=generator)[:num_tokens].to(device)
    key = random_tensor((num_tokens, NUM_KV_HEADS, head_dim), dtype, device, generator)
    value = random_tensor((num_tokens, NUM_KV_HEADS, head_dim), dtype, device, generator)
    k_cache, v_cache = random_caches(block_size, head_dim, dtype, device, generator)
    expected_k, expected_v = k_cache.clone(), v_cache.clone()

    store_kv(key, value, k_cache, v_cache, slot_mapping)
    store_kv_reference(key, value, expected_k, expected_v, slot_mapping)

    assert torch.equal(k_cache, expected_k)
    assert torch.equal(v_cache, expected_v)


def test_store_kv_reads_strided_key_and_value_from_a_fused_projection(device):
    generator = torch.Generator().manual_seed(0)
    num_tokens, head_dim, block_size = 6, 64, 8
    fused_shape = (num_tokens, 2 * NUM_KV_HEADS * head_dim + 16)  # [num_tokens, k | v | other]
    fused = random_tensor(fused_shape, torch.float32, device, generator)
    key = fused[:, : NUM_KV_HEADS * head_dim].view(num_tokens, NUM_KV_HEADS, head_dim)
    value = fused[:, NUM_KV_HEADS * head_dim : -16].view(num_tokens, NUM_KV_HEADS, head_dim)
    slot_mapping = torch.tensor([3, 17, 18, 39, 0, 8], device=device)
    k_cache, v_cache = random_caches(block_size, head_dim, torch.float32, device, generator)
    expected_k, expected_v = k_cache.clone(), v_cache.clone()

    store_kv(key, value, k_cache, v_cache, slot_mapping)
    store_kv_reference(key, value, expected_k, expected_v, slot_mapping)

    assert torch.equal(k_cache, expected_k)
    assert torch.equal(v_cache, expected_v)
