"""`--kv-cache-dtype int8` against float32 on the real SmolLM2-135M-Instruct, teacher-forced as
tests/real_model/test_bfloat16.py measures bfloat16: with float32 activations the int8 pool's
rounding is all that differs; with bfloat16 activations, as a CPU with AVX512-BF16 serves it by
default, both roundings add up. Both are held to bfloat16's rule.
"""
import pytest

from tests.real_model.conftest import MAX_TOKENS
from tests.real_model.test_bfloat16 import BFLOAT16_RULE, agreement_with_float32, greedy_steps

pytestmark = pytest.mark.real_model


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_an_int8_kv_cache_agrees_with_float32_within_the_bfloat16_rule(smollm2_dir, prompts, engine_outputs, dtype):
    agreement = agreement_with_float32(engine_outputs, greedy_steps(
        smollm2_dir, prompts, engine_outputs, dtype=dtype, kv_cache_dtype="int8"))
    print(f"\nint8 KV, {dtype} vs float32, {agreement}")
    assert agreement.num_positions == len(prompts) * MAX_TOKENS
    assert BFLOAT16_RULE.holds(agreement), agreement
