"""On CPU, every Linear layer multiplies by a weight packed once, at load, in oneDNN's layout.

PyTorch's CPU `linear` hands the [out, in] weight to a GEMM that lays it out for its inner loop
again on every call. With the few rows of a decode step that costs more than the product itself
(SmolLM2-135M on one core, 8 rows: float32 gate/up projection 0.75 ms plain against 0.37 ms
packed, its 49,152-wide LM head 20 ms against 9 ms; bfloat16 about 2x throughout). Packed once,
as vLLM's CPU backend does with oneDNN, each call is the product alone, on AMX tiles in bfloat16
where the CPU has them.

Invariant: a `PackedLinear` computes what `nn.Linear` computes with the same weight and bias, up
to the GEMM's summation order. It holds the packed copy only: the model's other readers of a
weight (a tied embedding) keep their own tensor.
"""
from __future__ import annotations

import torch
from torch import nn

# The row count oneDNN picks its blocked layout for; any row count runs on it. 64 serves decode
# steps (1-32 rows) within a few percent of a layout packed for their own size, and prefill
# chunks (hundreds of rows) as well as one packed for 400.
PACKING_ROWS_HINT = 64


def packs(dtype: torch.dtype, device: torch.device) -> bool:
    if device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    return dtype == torch.float32 or (dtype == torch.bfloat16 and torch.ops.mkldnn._is_mkldnn_bf16_supported())


class PackedLinear(nn.Module):
    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), PACKING_ROWS_HINT)
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [num_rows, in_features]
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")


def pack_linear_layers(model: nn.Module) -> None:
    """Replaces, in place, every `nn.Linear` in `model` with its `PackedLinear`."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, name, PackedLinear(child))
