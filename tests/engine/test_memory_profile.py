"""Sizing a GPU replica's KV pool: its share of the GPU less the peak of the largest step, never
more than is free; the profile step is that largest step (run here on the CPU model)."""
import pytest
import torch

from pdserve.engine.config import ModelConfig
from pdserve.engine.engine_config import EngineConfig
from pdserve.protocol.errors import InvalidConfigError
from pdserve.engine.kv_cache import KVCacheSpec
from pdserve.engine.memory_profile import kv_pool_bytes, profile_step
from pdserve.engine.weights import load_model

GIB = 2**30


@pytest.mark.parametrize("total, utilization, peak, free, expected", [
    (80 * GIB, 0.9, 20 * GIB, 60 * GIB, 52 * GIB),  # 72 GiB share - 20 GiB peak
    (80 * GIB, 0.5, 20 * GIB, 60 * GIB, 20 * GIB),
    (80 * GIB, 0.9, 20 * GIB, 30 * GIB, 30 * GIB),  # another process holds the rest
    (80 * GIB, 0.2, 20 * GIB, 60 * GIB, 0),  # the share does not even hold the peak
])
def test_the_pool_is_the_share_less_the_peak_held_to_what_is_free(total, utilization, peak, free, expected):
    assert kv_pool_bytes(total, utilization, peak, free) == expected


@pytest.mark.parametrize("utilization", [0.0, 1.5])
def test_a_utilization_outside_zero_to_one_is_refused(utilization):
    with pytest.raises(InvalidConfigError, match="gpu_memory_utilization"):
        EngineConfig(model="m", gpu_memory_utilization=utilization)


@pytest.fixture(scope="module")
def cpu_model(tiny_model):
    model_dir = tiny_model(dtype="float32")
    config = ModelConfig.from_dir(model_dir)
    return load_model(model_dir, config, torch.float32, torch.device("cpu")), config


@pytest.mark.parametrize("num_tokens, max_num_seqs, num_seqs", [(100, 8, 8), (5, 8, 5), (1, 256, 1)])
def test_the_profile_step_runs_the_token_budget_with_logits_for_each_sequence(cpu_model, num_tokens, max_num_seqs,
                                                                              num_seqs):
    model, config = cpu_model
    spec = KVCacheSpec.for_model(config, 16, torch.float32)
    logits = profile_step(model, spec, num_tokens, max_num_seqs, torch.device("cpu"))
    assert logits.shape == (num_seqs, config.vocab_size)
    assert torch.isfinite(logits).all()
