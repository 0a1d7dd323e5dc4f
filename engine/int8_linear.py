"""Linear layers that multiply in int8, weights and activations both (`--quantization w8a8`):
each output row of the weight is kept as int8 levels and a float32 scale, and each call rounds
its input's rows to levels the same way (kernels/int8_linear.py), each input column first
divided by the factor its weight column was multiplied by (engine/smoothing.py).

Where a prefill is compute-bound, int8 products run at twice bfloat16's rate on a CPU with
AVX512-VNNI; where a decode step is bound by reading its weights, they are half bfloat16's bytes.

Invariant: an `Int8Linear` computes `kernels.int8_linear` with its input factors f (1 / the
layer's smoothing factors), the levels and scales of `quantize_rows` of its checkpoint weight as
stored with each column divided by f (a fused layer's parts apiece, stacked in
`checkpoint_parts` order), and the layer's bias.
"""
from __future__ import annotations

import torch
from torch import nn

from pdserve.engine.linear_layers import replace_linear_layers
from pdserve.kernels.int8_linear import int8_linear


class Int8Linear(nn.Module):
    def __init__(self, levels: torch.Tensor, scales: torch.Tensor, input_factors: torch.Tensor | None,
                 bias: torch.Tensor | None):
        """levels: int8 [out_features, in_features]; scales: float32 [out_features]; input_factors:
        float32 [in_features], what each input column is multiplied by (None: 1)."""
        super().__init__()
        self.out_features, self.in_features = levels.shape
        self.register_buffer("levels", levels)
        self.register_buffer("scales", scales)
        self.register_buffer("input_factors", input_factors)
        self.bias = bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [num_rows, in_features]
        return int8_linear(x, self.levels, self.scales, self.bias, self.input_factors)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}"


def serve_int8(model: nn.Module, rows: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]) -> int:
    """Replaces, in place, each `nn.Linear` of `model` whose checkpoint weights are all in `rows`
    (name -> (levels, scales, input factors), the parts of a layer sharing their input factors)
    by an `Int8Linear` over them stacked, on the layer's device. Returns how many layers were
    replaced."""
    def build(layer: nn.Linear, names: list[str]) -> Int8Linear | None:
        sources = [rows.get(name) for name in names]
        if None in sources:
            return None
        device, input_factors = layer.weight.device, sources[0][2]
        return Int8Linear(torch.cat([levels for levels, _, _ in sources]).to(device),
                          torch.cat([scales for _, scales, _ in sources]).to(device),
                          None if input_factors is None else input_factors.to(device), layer.bias)

    return replace_linear_layers(model, build)
