"""Weight-only quantization at load (`--quantization int8|int4`): a float checkpoint's Linear
layers become `BlockLinear`s over GGUF's block formats, which the block kernels serve
(engine/block_linear.py). Each group of 32 consecutive weights of a row shares its scale:

    int8 -> Q8_0  34 bytes a group: fp16 scale, int8 q[32]            w = d * q
    int4 -> Q4_1  20 bytes a group: fp16 scale and min, uint4 q[32]   w = d * q + m

int4 is Q4_1 rather than the symmetric Q4_0 (18 bytes): its 16 levels span the group's own min
to max, where Q4_0's are centred on zero and spaced by the largest magnitude, so none is spent on
a side the group does not reach. Same 4 bits a weight, smaller error (on Gaussian weights, 7.8 %
relative RMS error against 8.6 %, and more on skewed groups), for one more fp16 a group: half a
bit a weight.

Quantized: every Linear of the decoder layers and the head whose in_features is a multiple of
32, a tied head from the embeddings' weight (which the lookup keeps in float), and a mixture of
experts' experts, each expert's projections a BlockLinear (engine/block_experts.py), where both
the hidden and the expert's intermediate size are multiples of 32. The head is Q8_0
under int4 too, as GGUF's 4-bit files keep their output matrix in 6 or 8 bits and GPTQ and AWQ
leave it unquantized: its error lands on every logit at once (on SmolLM2-135M a 4-bit head alone
moved 14 of 96 greedy argmaxes against float32, an 8-bit one none). Not: a mixture of
experts' router (its argmax picks the experts; vLLM keeps it in float too), embeddings, norms.

The weights are quantized from the checkpoint's tensors as stored (bfloat16, float16, float32:
each widened exactly to float32), not from their cast to the serving dtype, so a float32
checkpoint served in bfloat16 gets the blocks float32 serving gets.

Invariant: each `BlockLinear` made here holds `quantize_reference` of its checkpoint weight as
stored (a fused layer's parts quantized apiece, stacked in `checkpoint_parts` order, an expert's
gate then up); it computes
what `nn.Linear` computes with `dequantize_reference` of those blocks, up to summation order.
"""
from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from pdserve.engine.block_experts import expert_weight_names, serve_experts_as_blocks
from pdserve.engine.block_linear import serve_blocks_as_stored
from pdserve.engine.moe import Experts, SparseMoE
from pdserve.kernels.block_quant_reference import WEIGHTS_PER_BLOCK, quantize_reference

BLOCK_TYPES = {"int8": "q8_0", "int4": "q4_1"}  # engine_config.QUANTIZATIONS -> block type
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
    names = set()
    for path, module in model.named_modules():
        if isinstance(module, Experts):
            if all(size % WEIGHTS_PER_BLOCK == 0 for size in module.down_proj.shape[1:]):  # hidden, intermediate
                names.update(expert_weight_names(path, module))
            continue
        if isinstance(module, SparseMoE):
            continue  # its router stays float
        prefix = f"{path}." if path else ""
        parts_of = getattr(module, "checkpoint_parts", {})
        for name, child in module.named_children():
            if isinstance(child, nn.Linear) and child.in_features % WEIGHTS_PER_BLOCK == 0:
                names.update(f"{prefix}{part}.weight" for part in parts_of.get(name, (name,)))
    return names


def quantize_linear_layers(model: nn.Module, weights: Iterable[tuple[str, torch.Tensor]], quantization: str,
                           device: torch.device) -> int:
    """Replaces, in place, each Linear layer (and each layer's experts) of `model` whose checkpoint
    weights are all among `weights` ((name, tensor as stored)) by a `BlockLinear` (a
    `BlockExperts`) over their blocks in `quantization`'s format (the head's in HEAD_BLOCK_TYPE),
    on `device`. Returns how many layers were replaced."""
    head, blocks = head_weight_names(model), {}
    for name, weight in weights:
        block_type = HEAD_BLOCK_TYPE if name in head else BLOCK_TYPES[quantization]
        blocks[name] = (block_type, quantized(weight, block_type).to(device))
    return serve_blocks_as_stored(model, blocks) + serve_experts_as_blocks(model, blocks)


def head_weight_names(model: nn.Module) -> set[str]:
    """The checkpoint names of the head's weight: lm_head's, or a tied head's embeddings."""
    return {f"{part}.weight" for part in getattr(model, "checkpoint_parts", {}).get("lm_head", ("lm_head",))}


def quantized(weight: torch.Tensor, block_type: str) -> torch.Tensor:
    """`quantize_reference(weight, block_type)`, computed CHUNK_WEIGHTS at a time: [N, K] -> uint8
    [N, (K / 32) * block_bytes]."""
    rows_per_chunk = max(1, CHUNK_WEIGHTS // max(1, weight.shape[-1]))
    return torch.cat([quantize_reference(rows, block_type) for rows in weight.split(rows_per_chunk)])
