"""`quantization="w8a8"` serves each decoder layer's q/k/v and gate/up projections as an
`Int8Linear` holding `quantize_rows` of its checkpoint weights as stored, each column divided by
the layer's input factor 1 / s (s: its smoothing factors; a fused layer's parts stacked), its
input multiplied by that factor; o_proj,
down_proj and the head stay in the serving dtype, experts become Q8_0 blocks. s follows
SmoothQuant's rule from the largest activation of each input column on the calibration text,
which transformers' model sees too.

Against transformers, float32 on both sides:
- with its q/k/v and gate/up layers multiplying int8 levels of their smoothed input rows by the
  levels of their smoothed weights (kernels.int8_linear_reference), greedy tokens are equal token
  for token: its separate q/k/v (gate/up) layers round the same input rows to the same levels as
  the engine's fused one;
- on the checkpoint itself, held to the fast tier's bfloat16 rule, as int8 weights are.
"""
import pytest
import torch
from safetensors.torch import load_file
from torch import nn
from transformers import AutoModelForCausalLM

from pdserve.engine.block_linear import BlockLinear
from pdserve.engine.config import ModelConfig
from pdserve.engine.int8_linear import Int8Linear
from pdserve.engine.llm import LLM
from pdserve.engine.smoothing import ALPHA, CALIBRATION_TEXT, MIN_MAGNITUDE
from pdserve.engine.weights import load_model
from pdserve.kernels.int8_linear import int8_linear_reference, quantize_rows
from pdserve.protocol.sampling_params import SamplingParams
from pdserve.protocol.tokenizer import load_tokenizer
from tests.engine.test_greedy_matches_hf import BF16_LOGIT_TOL, BF16_MIN_ARGMAX_AGREEMENT
from tests.engine.test_quantize_at_load import MODELS, float32_agreement
from tests.family_configs import mixtral_config
from tests.helpers import ENGINE_OPTIONS

CPU = torch.device("cpu")
ROW_PARTS = {"self_attn.qkv_proj": ("q_proj", "k_proj", "v_proj"), "mlp.gate_up_proj": ("gate_proj", "up_proj")}


def load(model_dir: str, dtype: torch.dtype = torch.float32):
    return load_model(model_dir, ModelConfig.from_dir(model_dir), dtype, CPU, quantization="w8a8")


def calibration_maxima(model_dir: str) -> dict[str, torch.Tensor]:
    """transformers' float32 model on the calibration text: module path -> largest |x_j| of the
    input of each q_proj and gate_proj."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    maxima = {}

    def recorder(path):
        return lambda module, inputs: maxima.__setitem__(path, inputs[0][0].abs().amax(dim=0))

    for path, module in model.named_modules():
        if path.endswith(("q_proj", "gate_proj")):
            module.register_forward_pre_hook(recorder(path))
    with torch.no_grad():
        model(torch.tensor([load_tokenizer(model_dir).encode(CALIBRATION_TEXT)]))
    return maxima


@pytest.mark.parametrize("arch", sorted(MODELS))
def test_q_k_v_and_gate_up_hold_the_int8_rows_of_their_smoothed_checkpoint_weights(tiny_model, arch):
    model_dir = tiny_model(**MODELS[arch])
    checkpoint = load_file(f"{model_dir}/model.safetensors")
    model = load(model_dir)
    maxima = calibration_maxima(model_dir)
    layers = dict(model.named_modules())
    for i in range(model.config.num_layers):
        for layer, parts in ROW_PARTS.items():
            module = layer.split(".")[0]
            served = layers[f"model.layers.{i}.{layer}"]
            weights = [checkpoint[f"model.layers.{i}.{module}.{part}.weight"] for part in parts]
            activations = maxima[f"model.layers.{i}.{module}.{parts[0]}"].clamp(min=MIN_MAGNITUDE)
            columns = torch.cat(weights).abs().amax(dim=0).clamp(min=MIN_MAGNITUDE)
            smoothing = activations ** ALPHA / columns ** (1 - ALPHA)
            assert isinstance(served, Int8Linear), layer
            torch.testing.assert_close(served.input_factors, 1 / smoothing, rtol=1e-4, atol=0)
            levels, scales = zip(*(quantize_rows(weight / served.input_factors) for weight in weights))
            assert torch.equal(served.levels, torch.cat(levels)) and torch.equal(served.scales, torch.cat(scales))
    assert {name for name, layer in layers.items() if isinstance(layer, (Int8Linear, BlockLinear))} == {
        f"model.layers.{i}.{layer}" for i in range(model.config.num_layers) for layer in ROW_PARTS}


def test_experts_are_q8_0_blocks_and_the_router_o_proj_and_head_stay_float(hf_model):
    model = load(hf_model(mixtral_config()))
    layer = model.model.layers[0]
    assert isinstance(layer.self_attn.qkv_proj, Int8Linear)
    for float_layer in (layer.self_attn.o_proj, layer.mlp.gate, model.lm_head):
        assert not isinstance(float_layer, (BlockLinear, Int8Linear))
    experts = [module for module in layer.mlp.experts.modules() if isinstance(module, (BlockLinear, Int8Linear))]
    assert experts and all(isinstance(module, BlockLinear) and module.block_type == "q8_0" for module in experts)


class ReferenceInt8Linear(nn.Module):
    """A transformers Linear multiplying in int8 with the engine's smoothing factors of its layer."""

    def __init__(self, linear: nn.Linear, input_factors: torch.Tensor):
        super().__init__()
        self.levels, self.scales = quantize_rows(linear.weight / input_factors)
        self.input_factors, self.bias = input_factors, linear.bias

    def forward(self, x):
        out = int8_linear_reference(x.flatten(0, -2), self.levels, self.scales, self.bias, self.input_factors)
        return out.view(*x.shape[:-1], -1)


def w8a8_transformers(model_dir: str, engine_layers: dict[str, nn.Module]) -> nn.Module:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.generation_config.eos_token_id = None
    with torch.no_grad():
        for i, decoder_layer in enumerate(model.model.layers):
            for layer, parts in ROW_PARTS.items():
                module = decoder_layer.get_submodule(layer.split(".")[0])
                input_factors = engine_layers[f"model.layers.{i}.{layer}"].input_factors
                for part in parts:
                    setattr(module, part, ReferenceInt8Linear(getattr(module, part), input_factors))
    return model


@pytest.mark.parametrize("arch", sorted(MODELS))
def test_greedy_tokens_equal_transformers_multiplying_int8_levels(tiny_model, arch):
    model_dir = tiny_model(**MODELS[arch])
    generator = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, 4096, (length,), generator=generator).tolist() for length in (1, 7, 40, 130)]
    max_tokens = 8
    llm = LLM(model_dir, **{**ENGINE_OPTIONS, "dtype": "float32"}, quantization="w8a8")
    outputs = llm.generate(prompts, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
                           use_tqdm=False)
    oracle = w8a8_transformers(model_dir, dict(llm.engine.runner.model.named_modules()))
    for prompt, output in zip(prompts, outputs):
        ids = torch.tensor([prompt])
        expected = oracle.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                                   do_sample=False, pad_token_id=0)[0, len(prompt):].tolist()
        assert list(output.outputs[0].token_ids) == expected, f"prompt of {len(prompt)} tokens"


@pytest.mark.parametrize("arch", sorted(MODELS))
def test_w8a8_is_transformers_float32_argmax_within_the_bfloat16_rule(tiny_model, arch):
    agreement, max_shortfall = float32_agreement(tiny_model(**MODELS[arch]), quantization="w8a8")
    assert agreement >= BF16_MIN_ARGMAX_AGREEMENT and max_shortfall <= BF16_LOGIT_TOL, (agreement, max_shortfall)
