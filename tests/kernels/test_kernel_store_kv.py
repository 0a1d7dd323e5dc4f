"""The Triton store_kv kernel writes exactly what the reference writes, under the interpreter.

Copies are exact, so every dtype x head dim x block size combination is checked bit for bit.
So are int8 pools' entries (one head dim per dtype): the kernel rounds x / scale half to even as
torch.round does, checked on exact ties, and a zero row gets scale 0 and levels 0.
"""
import pytest
import torch

from pdserve.kernels.kv_quant import kv_entry_size
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


@pytest.mark.parametrize("dtype, head_dim", [(torch.float32, 64), (torch.float16, 80), (torch.bfloat16, 128)])
def test_store_kv_into_an_int8_pool_matches_reference(dtype, head_dim, device):
    generator = torch.Generator().manual_seed(head_dim)
    block_size, num_tokens = 16, 19
    slot_mapping = torch.randperm(NUM_BLOCKS * block_size, generator=generator)[:num_tokens].to(device)
    key = random_tensor((num_tokens, NUM_KV_HEADS, head_dim), dtype, device, generator)
    value = random_tensor((num_tokens, NUM_KV_HEADS, head_dim), dtype, device, generator)
    key[0, 0] = torch.arange(head_dim) % 8 - 3.5  # ties, -3.5 to 3.5, which round half to even ...
    key[0, 0, 0] = 127  # ... at scale 1
    value[0, 0] = 0
    cache_shape = (NUM_BLOCKS, block_size, NUM_KV_HEADS, kv_entry_size(head_dim, torch.int8))
    k_cache = torch.randint(-128, 128, cache_shape, generator=generator, dtype=torch.int8).to(device)
    v_cache = torch.randint(-128, 128, cache_shape, generator=generator, dtype=torch.int8).to(device)
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
