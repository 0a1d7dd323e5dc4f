"""SmoothQuant's migration of activation outliers into the weights, for `--quantization w8a8`.

A few input columns of a Linear layer carry activations far above the rest of their row (on
SmolLM2-135M, layer 29's gate/up projection reads up to 30.9 in one column where the median column
peaks at 0.36), and an int8 row's step is its largest value / 127, which leaves the other columns
a few levels.
So each weight column j is multiplied by s_j and each activation column divided by it (the layer
computes the same product), with

    s_j = a_j ** ALPHA / w_j ** (1 - ALPHA)

a_j being the largest |x_j| the layer saw on CALIBRATION_TEXT and w_j the largest |W_ij| of its
weight: the outliers' range is split between activations and weights. The activations are
measured once, at load, by one prefill of that text through the model still in float.

Invariant: the factors depend only on the checkpoint, the dtype and the device: one text, one
forward; a fused layer's parts share their layer's factors.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from pdserve.engine.attention_metadata import AttentionMetadata
from pdserve.engine.linear_layers import linear_layers
from pdserve.engine.model import CausalLM

ALPHA = 0.5  # SmoothQuant's default migration strength
MIN_MAGNITUDE = 1e-5  # a column never seen (or all zero) keeps a finite factor
BLOCK_SIZE = 16  # of the calibration forward's own KV cache

CALIBRATION_TEXT = (
    "The river runs through the old town, past the market and the stone bridge, and then out into "
    "the fields where farmers grow wheat, barley and potatoes. In spring the water rises and the "
    "children watch the boats carry timber down to the coast. A train leaves the station at seven "
    "every morning; it reaches the capital before noon, and most passengers read or sleep on the "
    "way. Questions about the weather, the price of bread or the next election fill the cafes.\n\n"
    "def mean(values):\n    return sum(values) / len(values) if values else 0.0\n\n"
    "Table 3 lists 12 samples: 4.5 g, 7.25 g and 19 g of salt in 100 ml of water at 20 °C. "
    "Q: What is the capital of France? A: Paris. Q: How many legs does a spider have? A: Eight.\n"
    "She said, \"We will meet again on Monday, 3 March, at the library on Elm Street.\" "
    "Les enfants jouent dans le jardin. Die Katze schläft auf dem Sofa. El cielo está despejado."
)


def smoothing_factors(model: CausalLM, token_ids: list[int]) -> dict[str, torch.Tensor]:
    """The checkpoint name of each weight of the decoder layers' Linear layers -> its layer's s,
    float32 [in_features] on the CPU, measured by a prefill of `token_ids` through `model`."""
    maxima: dict[str, torch.Tensor] = {}  # a layer's first checkpoint name -> largest |x_j| seen
    layers: dict[str, tuple[nn.Linear, list[str]]] = {}
    hooks = []
    for _, _, layer, names in linear_layers(model.model.layers, prefix="model.layers"):
        layers[names[0]] = (layer, names)
        hooks.append(layer.register_forward_pre_hook(_recorder(maxima, names[0])))
    try:
        _prefill(model, token_ids)
    finally:
        for hook in hooks:
            hook.remove()
    factors = {}
    for key, (layer, names) in layers.items():
        if key in maxima:
            activations = maxima[key].clamp(min=MIN_MAGNITUDE)
            weights = layer.weight.detach().abs().amax(dim=0).float().clamp(min=MIN_MAGNITUDE)
            factors |= dict.fromkeys(names, (activations ** ALPHA / weights ** (1 - ALPHA)).cpu())
    return factors


def _recorder(maxima: dict[str, torch.Tensor], key: str) -> Callable:
    def record(module: nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
        seen = inputs[0].detach().abs().flatten(0, -2).amax(dim=0).float()  # [in_features]
        maxima[key] = seen if key not in maxima else torch.maximum(maxima[key], seen)
    return record


@torch.inference_mode()
def _prefill(model: CausalLM, token_ids: list[int]) -> None:
    """One prompt of `token_ids` through `model`, over a KV cache of its own."""
    config, device, num_tokens = model.config, model.model.norm.weight.device, len(token_ids)
    num_blocks = -(-num_tokens // BLOCK_SIZE)
    kv_cache = torch.zeros(config.num_layers, 2, num_blocks, BLOCK_SIZE, config.num_kv_heads, config.head_dim,
                           dtype=model.dtype, device=device)
    block_table = torch.arange(num_blocks, dtype=torch.int32, device=device)[None]  # [1, num_blocks]
    positions = torch.arange(num_tokens, device=device)
    attn = AttentionMetadata(
        slot_mapping=positions, num_decode_tokens=0,
        decode_block_tables=block_table[:0], decode_context_lens=torch.zeros(0, dtype=torch.int32, device=device),
        prefill_block_tables=block_table,
        prefill_query_start_loc=torch.tensor([0, num_tokens], dtype=torch.int32, device=device),
        prefill_context_lens=torch.tensor([num_tokens], dtype=torch.int32, device=device))
    model(torch.tensor(token_ids, device=device), positions, kv_cache, attn)
