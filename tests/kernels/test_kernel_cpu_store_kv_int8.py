"""The compiled write into an int8 KV pool equals the reference's bit for bit: float32 and bfloat16
K/V, strided as the fused qkv projection leaves them, rows of zeros and exact .5 ties included;
arguments it cannot serve are left to the reference."""
import pytest
import torch

from pdserve.kernels import cpu_store_kv_int8
from pdserve.kernels.kv_quant import KV_SCALE_BYTES
from pdserve.kernels.reference import store_kv_reference

NUM_SLOTS, NUM_KV_HEADS = 40, 3


@pytest.fixture(scope="module", autouse=True)
def private_build_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
        cpu_store_kv_int8.load.cache_clear()
        if None in (cpu_store_kv_int8.load(dtype) for dtype in cpu_store_kv_int8.DTYPE_FLAGS):
            pytest.skip("no C compiler: the compiled CPU kernel is unavailable")
        yield
    cpu_store_kv_int8.load.cache_clear()


def fused_key_value(num_tokens, head_dim, dtype, generator):
    """key and value [num_tokens, NUM_KV_HEADS, head_dim] as views into one [num_tokens, q | k | v] row."""
    width = NUM_KV_HEADS * head_dim
    fused = torch.randn(num_tokens, 2 * width + 32, generator=generator).to(dtype)
    fused[0, 32:32 + width] = 0  # token 0's key: a row of zeros in every head
    fused[1, 32:32 + head_dim] = torch.tensor([127.0, 0.5, -1.5, 2.5] * (head_dim // 4))  # scale 1: exact ties
    return (fused[:, 32:32 + width].view(num_tokens, NUM_KV_HEADS, head_dim),
            fused[:, 32 + width:].view(num_tokens, NUM_KV_HEADS, head_dim))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_entries_equal_the_references_bit_for_bit(dtype, head_dim):
    generator = torch.Generator().manual_seed(head_dim)
    num_tokens = 7
    key, value = fused_key_value(num_tokens, head_dim, dtype, generator)
    slot_mapping = torch.randperm(NUM_SLOTS, generator=generator)[:num_tokens]
    shape = (NUM_SLOTS // 8, 8, NUM_KV_HEADS, head_dim + KV_SCALE_BYTES)
    k_cache = torch.randint(-128, 128, shape, generator=generator, dtype=torch.int8)
    v_cache = torch.randint(-128, 128, shape, generator=generator, dtype=torch.int8)
    expected_k, expected_v = k_cache.clone(), v_cache.clone()

    assert cpu_store_kv_int8.store_kv_int8(key, value, k_cache, v_cache, slot_mapping)
    store_kv_reference(key, value, expected_k, expected_v, slot_mapping)

    assert torch.equal(k_cache, expected_k) and torch.equal(v_cache, expected_v)


def test_heads_not_contiguous_within_a_token_are_left_to_the_reference():
    key = torch.randn(4, 64, NUM_KV_HEADS).transpose(1, 2)  # [4, NUM_KV_HEADS, 64], heads 1 element apart
    k_cache = torch.zeros(2, 8, NUM_KV_HEADS, 64 + KV_SCALE_BYTES, dtype=torch.int8)
    assert not cpu_store_kv_int8.store_kv_int8(key, key, k_cache, k_cache.clone(), torch.arange(4))
    assert not k_cache.any()
