"""A CPU decode plan over a GGUF's weights served as stored: Q4 layers packed for int8 activations
(which a plan calls directly) beside layers of other block types and float ones (which it calls
through their modules) compute what the modules compute, bit for bit."""
import pytest

from tests.engine.test_cpu_decode_plan import assert_plan_equals_modules


@pytest.mark.parametrize("quantized_weights", ["as-stored", "as-stored-int8-activations", "as-stored-int8-prefill"])
def test_a_plan_over_stored_blocks_computes_what_the_modules_compute(converted, quantized_weights):
    assert_plan_equals_modules(str(converted("mixed")), 2, dtype="bfloat16", quantized_weights=quantized_weights)

