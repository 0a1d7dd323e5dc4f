"""A mixture of experts in place of the dense MLP (Mixtral, Qwen3-MoE).

Each token's output is its top-k experts' outputs weighted by the router's softmax over all
experts (those k weights renormalised to sum to 1 where the config says so). A layer's experts
are stacked into one tensor per projection, `gate_up_proj [num_experts, 2 * intermediate, hidden]`
and `down_proj [num_experts, hidden, intermediate]`; `Experts`' load hook stacks the checkpoint's
per-expert tensors into them (the family's renames have already given them Qwen3-MoE's names,
`mlp.experts.{e}.gate_proj|up_proj|down_proj`).
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from pdserve.engine.config import ModelConfig


class SparseMoE(nn.Module):
    def __init__(self, config: ModelConfig, act_and_mul: Callable[[torch.Tensor], torch.Tensor]):
        super().__init__()
        moe = config.parts.moe
        self.top_k = moe.num_experts_per_tok
        self.renormalize = moe.renormalize
        self.gate = nn.Linear(config.hidden_size, moe.num_experts, bias=False)
        self.experts = Experts(moe.num_experts, config.hidden_size, moe.intermediate_size, act_and_mul)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [num_tokens, hidden]
        probs = torch.softmax(self.gate(x), dim=-1, dtype=torch.float32)  # [num_tokens, num_experts]
        weights, expert_ids = probs.topk(self.top_k, dim=-1)  # [num_tokens, top_k]
        if self.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return self.experts(x, expert_ids, weights.to(x.dtype))


class Experts(nn.Module):
    """Stacked gated MLPs, run grouped: the (token, expert) assignments are sorted by expert, so
    each expert multiplies one contiguous block of the tokens routed to it, once per projection.

    The group sizes are read back to the host once per layer (a sync on CUDA); a grouped-GEMM
    kernel that takes the sizes on the device would remove it.
    """

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int,
                 act_and_mul: Callable[[torch.Tensor], torch.Tensor]):
        super().__init__()
        self.num_experts = num_experts
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size, hidden_size))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size))
        self.act_and_mul = act_and_mul
        self.register_load_state_dict_pre_hook(self._stack_checkpoint)

    def forward(self, x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        return run_grouped(x, expert_ids, weights, self.num_experts, self._expert_mlp)

    def _expert_mlp(self, expert: int, rows: torch.Tensor) -> torch.Tensor:
        hidden = self.act_and_mul(rows @ self.gate_up_proj[expert].T)  # [group_size, intermediate]
        return hidden @ self.down_proj[expert].T

    def _stack_checkpoint(self, module, state_dict, prefix, *args) -> None:
        """Per-expert gate, up [intermediate, hidden] and down [hidden, intermediate] become the
        stacked projections, expert e's gate then up at gate_up_proj[e]."""
        names = {part: [f"{prefix}{e}.{part}.weight" for e in range(self.num_experts)]
                 for part in ("gate_proj", "up_proj", "down_proj")}
        if not all(name in state_dict for part_names in names.values() for name in part_names):
            return  # the strict load names what is missing
        state_dict[f"{prefix}gate_up_proj"] = torch.stack([
            torch.cat([state_dict.pop(gate), state_dict.pop(up)])
            for gate, up in zip(names["gate_proj"], names["up_proj"])])
        state_dict[f"{prefix}down_proj"] = torch.stack([state_dict.pop(down) for down in names["down_proj"]])


def run_grouped(x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor, num_experts: int,
                expert_mlp: Callable[[int, torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """The weighted sum of each token's experts' outputs, `expert_mlp(expert, rows)` called once per
    expert on the rows routed to it: x [num_tokens, hidden]; expert_ids, weights [num_tokens, top_k]."""
    top_k = expert_ids.shape[1]
    order = expert_ids.flatten().argsort(stable=True)  # [num_tokens * top_k] assignments by expert
    tokens = order // top_k  # [num_tokens * top_k] the token of each assignment
    group_sizes = torch.bincount(expert_ids.flatten(), minlength=num_experts).tolist()
    outputs = [expert_mlp(expert, rows)  # rows: [group_size, hidden]
               for expert, rows in enumerate(x[tokens].split(group_sizes)) if len(rows)]
    weighted = torch.cat(outputs) * weights.flatten()[order, None]  # [num_tokens * top_k, hidden]
    return torch.zeros_like(x).index_add_(0, tokens, weighted)
