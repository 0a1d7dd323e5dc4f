"""The public `kernels` API on CPU tensors: float32 and bfloat16 decode, masked or not, goes to the
compiled kernel when it builds; float32 and bfloat16 prefill without a softcap to the compiled
kernel where it runs on AVX-512; everything else to the references; a window below 1 or a softcap
not above 0 is refused; importing loads no kernel."""
import subprocess
import sys

import pytest
import torch

from pdserve import kernels
from pdserve.kernels import cpu_decode_attention, cpu_prefill_attention
from pdserve.kernels.reference import (
    decode_attention_reference,
    prefill_attention_reference,
    store_kv_reference,
)
from tests.kernels.conftest import KernelCase


def test_import_loads_no_triton_kernel_module():
    probe = "import sys, pdserve.kernels; print([m for m in sys.modules if m.startswith('pdserve.kernels.triton')])"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_cpu_store_kv_is_the_reference():
    key = torch.randn(3, 2, 64)  # [num_tokens, num_kv_heads, head_dim]
    value = torch.randn(3, 2, 64)
    slot_mapping = torch.tensor([9, 0, 30])
    k_cache, v_cache = torch.zeros(4, 8, 2, 64), torch.zeros(4, 8, 2, 64)
    expected_k, expected_v = k_cache.clone(), v_cache.clone()

    kernels.store_kv(key, value, k_cache, v_cache, slot_mapping)
    store_kv_reference(key, value, expected_k, expected_v, slot_mapping)

    assert torch.equal(k_cache, expected_k) and torch.equal(v_cache, expected_v)


@pytest.mark.parametrize("masking", [{}, dict(sliding_window=3, logit_softcap=2.0)], ids=["unmasked", "masked"])
def test_cpu_attention_dispatch(kernel_case, masking, paged_batch):
    batch = paged_batch([kernel_case.block_size + 2, 3], [2, 1], kernel_case, device="cpu")
    cache = (batch.k_cache, batch.v_cache, batch.block_tables)
    last_tokens = batch.query[batch.query_start_loc[1:].long() - 1]  # [num_seqs, num_heads, head_dim]
    decode_args = (last_tokens, *cache, batch.context_lens, batch.scale)
    prefill_args = (batch.query, *cache, batch.query_start_loc, batch.context_lens, batch.scale)

    decoded = kernels.decode_attention(*decode_args, **masking)
    prefilled = kernels.prefill_attention(*prefill_args, **masking)

    library = cpu_decode_attention.load(kernel_case.dtype)
    if library is None:
        assert torch.equal(decoded, decode_attention_reference(*decode_args, **masking))
    else:
        assert torch.equal(decoded, cpu_decode_attention.decode_attention(library, *decode_args, **masking))
    prefill_library = cpu_prefill_attention.load(kernel_case.dtype)
    if (not masking and prefill_library is not None
            and cpu_prefill_attention.vectorised(prefill_library, kernel_case.head_dim)):
        assert torch.equal(prefilled, cpu_prefill_attention.prefill_attention(prefill_library, *prefill_args))
    else:
        assert torch.equal(prefilled, prefill_attention_reference(*prefill_args, **masking))


@pytest.mark.parametrize("masking", [dict(sliding_window=0), dict(logit_softcap=0.0), dict(logit_softcap=-1.0)])
def test_a_window_below_one_or_a_softcap_not_above_zero_is_refused(masking, paged_batch):
    batch = paged_batch([3], [3], KernelCase(torch.float32, 1, 8, 64), device="cpu")
    cache = (batch.k_cache, batch.v_cache, batch.block_tables)
    with pytest.raises(ValueError):
        kernels.decode_attention(batch.query[:1], *cache, batch.context_lens, batch.scale, **masking)
    with pytest.raises(ValueError):
        kernels.prefill_attention(batch.query, *cache, batch.query_start_loc, batch.context_lens, batch.scale,
                                  **masking)
