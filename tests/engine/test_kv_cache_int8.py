"""`kv_cache_dtype="int8"`: the engine's KV pool holds int8 entries (kernels/kv_quant.py), and what
it serves stays within the fast tier's bfloat16 rule against transformers in float32
(teacher-forced: each token within BF16_LOGIT_TOL of transformers' best, at least
BF16_MIN_ARGMAX_AGREEMENT of them its argmax), with float32 activations so that the pool's
rounding is all that differs. Prompts cut into chunks read their earlier chunks' K and V back from
the int8 pool, so the chunked case checks prefill attention over it too; decode steps read it
through the compiled CPU kernel.
"""
import pytest
import torch

from pdserve.engine.llm import LLM
from tests.engine.test_greedy_matches_hf import BF16_LOGIT_TOL, BF16_MIN_ARGMAX_AGREEMENT
from tests.engine.test_quantize_at_load import MODELS, float32_agreement
from tests.helpers import ENGINE_OPTIONS


@pytest.mark.parametrize("arch, max_num_batched_tokens", [("llama", 2048), ("qwen2", 2048), ("llama", 64)])
def test_int8_kv_is_transformers_float32_argmax_within_the_bfloat16_rule(tiny_model, arch, max_num_batched_tokens):
    agreement, max_shortfall = float32_agreement(tiny_model(**MODELS[arch]), kv_cache_dtype="int8", dtype="float32",
                                                 max_num_batched_tokens=max_num_batched_tokens)
    assert agreement >= BF16_MIN_ARGMAX_AGREEMENT and max_shortfall <= BF16_LOGIT_TOL, (agreement, max_shortfall)


def test_an_int8_pool_of_the_same_bytes_holds_the_blocks_its_entries_fit(tiny_model):
    model_dir = tiny_model(**MODELS["llama"])
    int8, float32 = (LLM(model_dir, **{**ENGINE_OPTIONS, "dtype": "float32", "kv_cache_dtype": kv}).engine
                     for kv in ("int8", "auto"))
    assert int8.kv_cache.dtype == torch.int8 and float32.kv_cache.dtype == torch.float32
    head_dim = int8.kv_spec.head_dim
    assert int8.kv_cache.shape[-1] == head_dim + 4  # levels, then the scale's 4 bytes
    assert int8.kv_spec.bytes_per_block * 4 * head_dim == float32.kv_spec.bytes_per_block * (head_dim + 4)
    assert int8.allocator.num_blocks == ENGINE_OPTIONS["kv_cache_memory_bytes"] // int8.kv_spec.bytes_per_block
