"""An int8 KV pool on a GPU (the Triton store, decode and prefill kernels) holds the engine to the
rule it meets on a CPU (tests/engine/test_kv_cache_int8.py): transformers' float32 argmax within
the bfloat16 rule, float32 activations, prompts cut into chunks that read their earlier chunks back."""
import pytest
import torch

from tests.engine.test_greedy_matches_hf import BF16_LOGIT_TOL, BF16_MIN_ARGMAX_AGREEMENT
from tests.engine.test_quantize_at_load import MODELS, float32_agreement

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_an_int8_kv_pool_on_a_gpu_is_transformers_float32_argmax_within_the_bfloat16_rule(tiny_model):
    agreement, max_shortfall = float32_agreement(tiny_model(**MODELS["llama"]), device="cuda", dtype="float32",
                                                 kv_cache_dtype="int8", max_num_batched_tokens=64)
    assert agreement >= BF16_MIN_ARGMAX_AGREEMENT and max_shortfall <= BF16_LOGIT_TOL, (agreement, max_shortfall)
