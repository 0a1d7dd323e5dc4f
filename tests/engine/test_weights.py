"""Loading a checkpoint builds the model without memory of its own: every parameter is the
checkpoint's tensor, in the target dtype, on the target device."""
from pathlib import Path

import pytest
import torch

from pdserve.engine import weights
from pdserve.engine.config import ModelConfig
from pdserve.engine.weights import load_model


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_parameters_are_the_checkpoint_cast_once_and_the_model_is_built_on_meta(tiny_model, monkeypatch, dtype):
    tiny_model_dir = Path(tiny_model(dtype="float32"))
    built_on: list[set[str]] = []
    real_causal_lm = weights.CausalLM

    def recording_causal_lm(*args, **kwargs):
        model = real_causal_lm(*args, **kwargs)
        built_on.append({parameter.device.type for parameter in model.parameters()})
        return model

    monkeypatch.setattr(weights, "CausalLM", recording_causal_lm)
    config = ModelConfig.from_dir(tiny_model_dir)
    model = load_model(tiny_model_dir, config, dtype, torch.device("cpu"))
    assert built_on == [{"meta"}]
    assert {(p.dtype, p.device.type) for p in model.parameters()} == {(dtype, "cpu")}
    assert model.rotary.inv_freq.dtype == torch.float32 and model.rotary.inv_freq.device.type == "cpu"
