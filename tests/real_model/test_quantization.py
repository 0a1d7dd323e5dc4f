"""`--quantization int8|int4` against float32 on the real SmolLM2-135M-Instruct, both pdserve's
engine with float32 activations, teacher-forced as tests/real_model/test_bfloat16.py measures
bfloat16: at each of float32's 96 greedy positions, the quantized engine's argmax and its logprob
of float32's token.

The float32 model is the pinned .gguf's weights widened: its decoder matrices Q4_1, its tied
head Q8_0. Quantizing them again, int8 spreads 255 levels over each group's 16 (0.6 % RMS error
a weight) and keeps the head exact; int4 finds the decoder's Q4_1 levels again exactly, so all of
its error is the head's, in 4 bits (9 % RMS error a weight).

- int8 is held to bfloat16's rule. Measured (AMD EPYC): 94 of 96 agree (97.9 %), max shortfall
  0.057, logprob error mean 0.024 and max 0.104 nats; bfloat16 on the same CPU: 92 of 96
  (95.8 %), max shortfall 0.062, logprob error mean 0.026 and max 0.131.
- int4 is not within it. Measured: 82 of 96 agree (85.4 %), max shortfall 1.37, logprob error
  mean 0.192 and max 0.79 nats. Held to looser bounds (INT4_RULE) with room for another CPU's
  summation order, still far from what a broken format costs (most argmaxes, whole nats).
"""
import pytest

from tests.real_model.conftest import MAX_TOKENS
from tests.real_model.test_bfloat16 import BFLOAT16_RULE, Rule, agreement_with_float32, greedy_steps

pytestmark = pytest.mark.real_model

INT4_RULE = Rule(min_top1=0.75, max_shortfall=2.0, mean_logprob_error=0.3, max_logprob_error=1.5)


def test_int8_agrees_with_float32_within_the_bfloat16_rule(smollm2_dir, prompts, engine_outputs):
    agreement = agreement_with_float32(
        engine_outputs, greedy_steps(smollm2_dir, prompts, engine_outputs, dtype="float32", quantization="int8"))
    print(f"\nint8 vs float32, {agreement}")
    assert agreement.num_positions == len(prompts) * MAX_TOKENS
    assert BFLOAT16_RULE.holds(agreement), agreement


def test_int4_agrees_with_float32_within_its_looser_bounds(smollm2_dir, prompts, engine_outputs):
    agreement = agreement_with_float32(
        engine_outputs, greedy_steps(smollm2_dir, prompts, engine_outputs, dtype="float32", quantization="int4"))
    print(f"\nint4 vs float32, {agreement}")
    assert agreement.num_positions == len(prompts) * MAX_TOKENS
    assert INT4_RULE.holds(agreement), agreement
