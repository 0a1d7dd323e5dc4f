"""Swapping a model's `nn.Linear` layers for other modules built from their checkpoint weights.

A Linear layer may load several checkpoint weights stacked (a fused q/k/v or gate/up: its
parent's `checkpoint_parts`, engine/model.py), so a replacement is built from the checkpoint
names of all its parts, in the order the layer stacks their rows.
"""
from __future__ import annotations

from collections.abc import Callable

from torch import nn


def replace_linear_layers(model: nn.Module, build: Callable[[nn.Linear, list[str]], nn.Module | None]) -> int:
    """Replaces, in place, each `nn.Linear` of `model` for which `build(layer, names)` (names: the
    checkpoint names of the weights it stacks, in order) returns a module. Returns how many."""
    replaced = 0
    for path, module in list(model.named_modules()):
        prefix = f"{path}." if path else ""
        parts_of = getattr(module, "checkpoint_parts", {})
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                replacement = build(child, [f"{prefix}{part}.weight" for part in parts_of.get(name, (name,))])
                if replacement is not None:
                    setattr(module, name, replacement)
                    replaced += 1
    return replaced
