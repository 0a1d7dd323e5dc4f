"""A mixture of experts whose projections stay in blocks (`--quantization int8|int4`): each expert's
fused gate_up and its down projection are a `BlockLinear`, run grouped as `Experts` runs its
stacked float weights (engine/moe.py: one call per expert per projection on the rows routed to it).

Invariant: expert e's gate_up holds its checkpoint gate then up weights' blocks, stacked, and its
down its down weight's; a layer's experts go to blocks only when every expert's three weights are
there (all of one block type), so no layer mixes blocks and floats.
"""
from __future__ import annotations

import torch
from torch import nn

from pdserve.engine.block_linear import BlockLinear
from pdserve.engine.moe import Experts, run_grouped

EXPERT_PARTS = ("gate_proj", "up_proj", "down_proj")  # an expert's checkpoint weights, after the renames


class BlockExperts(nn.Module):
    def __init__(self, gate_up: list[BlockLinear], down: list[BlockLinear], act_and_mul):
        super().__init__()
        self.num_experts = len(gate_up)
        self.gate_up = nn.ModuleList(gate_up)
        self.down = nn.ModuleList(down)
        self.act_and_mul = act_and_mul

    def forward(self, x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        return run_grouped(x, expert_ids, weights, self.num_experts, self._expert_mlp)

    def _expert_mlp(self, expert: int, rows: torch.Tensor) -> torch.Tensor:
        return self.down[expert](self.act_and_mul(self.gate_up[expert](rows)))


def expert_weight_names(experts_path: str, experts: Experts) -> list[str]:
    """The checkpoint names of a layer's experts' weights, expert by expert, in EXPERT_PARTS order."""
    return [f"{experts_path}.{e}.{part}.weight" for e in range(experts.num_experts) for part in EXPERT_PARTS]


def serve_experts_as_blocks(model: nn.Module, blocks: dict[str, tuple[str, torch.Tensor]]) -> int:
    """Replaces, in place, each `Experts` of `model` whose every weight is in `blocks` (name ->
    (block type, uint8 blocks)), of one type, by a `BlockExperts` over them on its device. Returns
    how many were replaced."""
    replaced = 0
    for path, module in list(model.named_modules()):
        experts = getattr(module, "experts", None)
        if not isinstance(experts, Experts):
            continue
        sources = [blocks.get(name) for name in expert_weight_names(f"{path}.experts", experts)]
        if None in sources or len({block_type for block_type, _ in sources}) != 1:
            continue
        block_type, device = sources[0][0], experts.gate_up_proj.device
        hidden_size, intermediate_size = experts.down_proj.shape[1:]
        gate_up, down = [], []
        for e in range(experts.num_experts):  # sources: expert by expert, gate, up, down
            (_, gate), (_, up), (_, down_blocks) = sources[3 * e:3 * e + 3]
            gate_up.append(BlockLinear(torch.cat([gate, up]).to(device), block_type, hidden_size, None))
            down.append(BlockLinear(down_blocks.to(device), block_type, intermediate_size, None))
        module.experts = BlockExperts(gate_up, down, experts.act_and_mul)
        replaced += 1
    return replaced
