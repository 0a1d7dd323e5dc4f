"""The decode-step profile runs on the tiny model and accounts for the whole step: its parts add up
to the step time (through the modules, the forward's own parts; under a decode plan, the forward
whole), and the roofline is positive and below it."""
import pytest

from pdserve.bench.bandwidth import read_gbps
from pdserve.bench.profile_decode_step import profile
from pdserve.engine import LLM


@pytest.mark.parametrize("enforce_eager", [True, False], ids=["eager", "planned"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_parts_add_up_to_the_step(tiny_model, dtype, enforce_eager):
    llm = LLM(tiny_model(), dtype=dtype, kv_cache_memory_bytes=1 << 24, enable_prefix_caching=False,
              enforce_eager=enforce_eager)
    result = profile(llm, batch_size=3, context_len=40, num_steps=3, gbps=read_gbps(num_iters=1))
    assert sum(result["parts_ms"].values()) == pytest.approx(result["step_ms"], rel=1e-6)
    assert all(value_ms >= 0 for part, value_ms in result["parts_ms"].items() if part != "other in the forward")
    if enforce_eager:
        assert result["parts_ms"]["linear layers"] > 0 and result["parts_ms"]["decode attention"] > 0
    else:
        assert result["parts_ms"]["forward (decode plan)"] > 0 and "linear layers" not in result["parts_ms"]
    assert 0 < result["roofline_ms"] < result["step_ms"]
    assert not llm.engine.has_unfinished_requests()
