"""Quantization at load (`--quantization int8|int4|w8a8`).

int8 and int4 are weight-only: a float checkpoint's Linear layers become `BlockLinear`s over
GGUF's block formats, which the block kernels serve (engine/block_linear.py). Each group of 32
consecutive weights of a row shares its scale:

    int8 -> Q8_0  34 bytes a group: fp16 scale, int8 q[32]            w = d * q
    int4 -> Q4_1  20 bytes a group: fp16 scale and min, uint4 q[32]   w = d * q + m

int4 is Q4_1 rather than the symmetric Q4_0 (18 bytes): its 16 levels span the group's own min
to max, where Q4_0's are centred on zero and spaced by the largest magnitude, so none is spent on
a side the group does not reach. Same 4 bits a weight, smaller error (on Gaussian weights, 7.8 %
relative RMS error against 8.6 %, and more on skewed groups), for one more fp16 a group: half a
bit a weight.

w8a8 multiplies in int8, weights and activations both (engine/int8_linear.py), in the layers
that read a norm's output (ROW_LAYERS: q/k/v and gate/up, two thirds of a Llama layer's
multiply-adds): each output row, its columns first multiplied by the layer's smoothing factors
(engine/smoothing.py), is one scale and int8 levels, and each call rounds its input's rows
likewise, their columns divided by the same factors. The layers that read the attention's output
(o_proj) and the gated activation (down_proj) stay in the serving dtype, and so does the head.
On SmolLM2-135M, teacher-forced against float32 (tests/real_model/test_quantization.py), with all
four decoder projections in int8 and smoothed, logprobs were 0.081 nats off on average (0.126
unsmoothed; the bfloat16 rule allows 0.05); with down_proj in float, 0.040 but 0.263 at the worst
(the rule allows 0.25); with o_proj in float too, 0.040 and 0.223, within the rule.
Experts are Q8_0 blocks, weight-only.

Quantized by int8 and int4: every Linear of the decoder layers and the head whose in_features is
a multiple of 32, a tied head from the embeddings' weight (which the lookup keeps in float), and
a mixture of experts' experts, each expert's projections a BlockLinear (engine/block_experts.py),
where both the hidden and the expert's intermediate size are multiples of 32. The head is Q8_0
under int4 too, as GGUF's 4-bit files keep their output matrix in 6 or 8 bits and GPTQ and AWQ
leave it unquantized: its error lands on every logit at once (on SmolLM2-135M a 4-bit head alone
moved 14 of 96 greedy argmaxes against float32, an 8-bit one none). Not: a mixture of
experts' router (its argmax picks the experts; vLLM keeps it in float too), embeddings, norms.

The weights are quantized from the checkpoint's tensors as stored (bfloat16, float16, float32:
each widened exactly to float32), not from their cast to the serving dtype, so a float32
checkpoint served in bfloat16 gets the blocks float32 serving gets.

Invariant: each `BlockLinear` made here holds `quantize_reference` of its checkpoint weight as
stored (a fused layer's parts quantized apiece, stacked in `checkpoint_parts` order, an expert's
gate then up); it computes what `nn.Linear` computes with `dequantize_reference` of those
blocks, up to summation order. Each `Int8Linear` holds `quantize_rows` of its checkpoint weight
as stored, its columns divided by its input factors (1 / its smoothing factors), stacked likewise.
"""
from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from pdserve.engine.block_experts import expert_weight_names, serve_experts_as_blocks
from pdserve.engine.block_linear import serve_blocks_as_stored
from pdserve.engine.int8_linear import serve_int8
from pdserve.engine.linear_layers import linear_layers
from pdserve.engine.moe import Experts, SparseMoE
from pdserve.kernels.block_quant_reference import WEIGHTS_PER_BLOCK, quantize_reference
from pdserve.kernels.int8_linear import quantize_rows

BLOCK_TYPES = {"int8": "q8_0", "int4": "q4_1"}  # weight-only engine_config.QUANTIZATIONS -> block type
ROW_QUANTIZATIONS = {"w8a8": "q8_0"}  # ROW_LAYERS as Int8Linear, experts in this block type, the rest float
ROW_LAYERS = ("qkv_proj", "gate_up_proj")  # the Linear layers (module names) that read a norm's output
HEAD_BLOCK_TYPE = "q8_0"

# Rows are quantized this many weights at a time (16 MiB of float32), so that the reference's
# temporaries stay bounded whatever the matrix (a head of 128K rows by 4K is 2 GiB each). Not much
# fewer: each chunk is some fifteen torch ops, each a parallel region, and on cores shared with
# other work every region can wait a time slice for its threads.
CHUNK_WEIGHTS = 2**22


def weight_names_to_quantize(model: nn.Module) -> set[str]:
    """The checkpoint names (after the family's renames) of the weights of the Linear layers and
    experts of `model` to quantize: a fused layer's parts (`checkpoint_parts`), a tied head's
    embeddings, each expert's gate, up and down."""
    names = {name for path, module in model.named_modules()
             if isinstance(module, Experts)
             and all(size % WEIGHTS_PER_BLOCK == 0 for size in module.down_proj.shape[1:])  # hidden, intermediate
             for name in expert_weight_names(path, module)}
    for parent, _, layer, layer_names in linear_layers(model):
        if not isinstance(parent, SparseMoE) and layer.in_features % WEIGHTS_PER_BLOCK == 0:  # a router stays float
            names.update(layer_names)
    return names


def quantize_linear_layers(model: nn.Module, weights: Iterable[tuple[str, torch.Tensor]], quantization: str,
                           device: torch.device, smoothing: dict[str, torch.Tensor] | None = None) -> int:
    """Replaces, in place, each Linear layer (and each layer's experts) of `model` whose checkpoint
    weights are all among `weights` ((name, tensor as stored)) by a `BlockLinear` (a
    `BlockExperts`) over their blocks in `quantization`'s format (the head's in HEAD_BLOCK_TYPE),
    or, under a ROW_QUANTIZATIONS scheme, each of its ROW_LAYERS by an `Int8Linear` over its
    weight's columns divided by its input factors 1 / `smoothing[name]` (none where absent), its
    other Linear layers left as they are, on `device`. Returns how many layers were replaced."""
    head, experts = head_weight_names(model), expert_names(model)
    by_rows = row_layer_names(model) if quantization in ROW_QUANTIZATIONS else set()
    blocks, rows = {}, {}
    for name, weight in weights:
        if name in by_rows:
            factors = (smoothing or {}).get(name)
            input_factors = None if factors is None else 1 / factors
            levels, scales = int8_rows(weight if factors is None else weight.float() / input_factors)
            rows[name] = (levels.to(device), scales.to(device), input_factors)
            continue
        if quantization in ROW_QUANTIZATIONS and name not in experts:
            continue
        block_type = HEAD_BLOCK_TYPE if name in head else {**BLOCK_TYPES, **ROW_QUANTIZATIONS}[quantization]
        blocks[name] = (block_type, quantized(weight, block_type).to(device))
    return (serve_int8(model, rows) + serve_blocks_as_stored(model, blocks, device)
            + serve_experts_as_blocks(model, blocks))


def head_weight_names(model: nn.Module) -> set[str]:
    """The checkpoint names of the head's weight: lm_head's, or a tied head's embeddings."""
    return {f"{part}.weight" for part in getattr(model, "checkpoint_parts", {}).get("lm_head", ("lm_head",))}


def row_layer_names(model: nn.Module) -> set[str]:
    """The checkpoint names of the weights of `model`'s ROW_LAYERS (a fused layer's parts)."""
    return {weight_name for _, name, _, names in linear_layers(model) if name in ROW_LAYERS for weight_name in names}


def expert_names(model: nn.Module) -> set[str]:
    return {name for path, module in model.named_modules() if isinstance(module, Experts)
            for name in expert_weight_names(path, module)}


def int8_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`quantize_rows(weight)`, computed CHUNK_WEIGHTS at a time: [N, K] -> (int8 [N, K], float32 [N])."""
    chunks = [quantize_rows(rows) for rows in weight.split(_rows_per_chunk(weight))]
    return torch.cat([levels for levels, _ in chunks]), torch.cat([scales for _, scales in chunks])


def quantized(weight: torch.Tensor, block_type: str) -> torch.Tensor:
    """`quantize_reference(weight, block_type)`, computed CHUNK_WEIGHTS at a time: [N, K] -> uint8
    [N, (K / 32) * block_bytes]."""
    return torch.cat([quantize_reference(rows, block_type) for rows in weight.split(_rows_per_chunk(weight))])


def _rows_per_chunk(weight: torch.Tensor) -> int:
    return max(1, CHUNK_WEIGHTS // max(1, weight.shape[-1]))
