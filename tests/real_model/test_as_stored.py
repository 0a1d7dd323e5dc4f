"""`--quantized-weights as-stored` against float32 on the real SmolLM2-135M-Instruct: the pinned
.gguf's Q4_1 and Q8_0 matrices multiplied as stored (engine/block_linear.py), teacher-forced as
tests/real_model/test_bfloat16.py measures bfloat16, at each of float32's 96 greedy positions.

The float32 model is those very blocks dequantized, so with float32 activations the two differ in
summation order alone: the kernel's exact float32 weights, summed in another order, move a
logprob by about 1e-5 nats. With bfloat16 activations the kernel multiplies the weights rounded to
bfloat16, as a bfloat16 model does, and is held to bfloat16's rule. So is
"as-stored-int8-activations", whose Q4 matrices multiply a decode step's activations quantized to
int8 per block of 32, as llama.cpp does. "as-stored-int8-prefill" quantizes a prefill's activations
too, every position's KV then computed from them: it is held to a looser rule, which says how far
it falls from float32 (on this model top-1 agreement 0.93, logprob error mean 0.076 max 0.35 nats).
"""
import pytest

from tests.real_model.conftest import MAX_TOKENS
from tests.real_model.test_bfloat16 import BFLOAT16_RULE, Rule, agreement_with_float32, greedy_steps

pytestmark = pytest.mark.real_model

FLOAT32_MAX_LOGPROB_ERROR = 1e-3  # nats: summation order, with two orders of magnitude to spare
INT8_PREFILL_RULE = Rule(min_top1=0.9, max_shortfall=0.5, mean_logprob_error=0.1, max_logprob_error=0.5)


def test_blocks_as_stored_in_float32_agree_with_the_dequantized_model_but_for_summation_order(
        smollm2_dir, prompts, engine_outputs):
    agreement = agreement_with_float32(engine_outputs, greedy_steps(
        smollm2_dir, prompts, engine_outputs, dtype="float32", quantized_weights="as-stored"))
    print(f"\nas stored, float32 vs float32 dequantized, {agreement}")
    assert agreement.num_positions == len(prompts) * MAX_TOKENS
    assert agreement.max_logprob_error <= FLOAT32_MAX_LOGPROB_ERROR
    assert agreement.max_shortfall <= FLOAT32_MAX_LOGPROB_ERROR  # a different argmax only at an exact tie


@pytest.mark.parametrize("quantized_weights", ["as-stored", "as-stored-int8-activations"])
def test_blocks_in_bfloat16_agree_with_float32_within_the_bfloat16_rule(smollm2_dir, prompts, engine_outputs,
                                                                         quantized_weights):
    agreement = agreement_with_float32(engine_outputs, greedy_steps(
        smollm2_dir, prompts, engine_outputs, dtype="bfloat16", quantized_weights=quantized_weights))
    print(f"\n{quantized_weights}, bfloat16 vs float32, {agreement}")
    assert agreement.num_positions == len(prompts) * MAX_TOKENS
    assert BFLOAT16_RULE.holds(agreement), agreement


def test_int8_prefill_in_bfloat16_agrees_with_float32_within_its_looser_rule(smollm2_dir, prompts, engine_outputs):
    agreement = agreement_with_float32(engine_outputs, greedy_steps(
        smollm2_dir, prompts, engine_outputs, dtype="bfloat16", quantized_weights="as-stored-int8-prefill"))
    print(f"\nas-stored-int8-prefill, bfloat16 vs float32, {agreement}")
    assert agreement.num_positions == len(prompts) * MAX_TOKENS
    assert INT8_PREFILL_RULE.holds(agreement), agreement
