"""Swapping a model's `nn.Linear` layers for other modules built from their checkpoint weights.

A Linear layer may load several checkpoint weights stacked (a fused q/k/v or gate/up: its
parent's `checkpoint_parts`, engine/model.py), so a replacement is built from the checkpoint
names of all its parts, in the order the layer stacks their rows.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator

from torch import nn


def linear_layers(model: nn.Module, prefix: str = "") -> Iterator[tuple[nn.Module, str, nn.Linear, list[str]]]:
    """Each `nn.Linear` of `model` (named under `prefix`) as (its parent, its attribute name, the
    layer, the checkpoint names of the weights it stacks, in order). The modules are listed before
    the first is yielded, so a caller may replace layers as it goes."""
    for path, module in list(model.named_modules(prefix=prefix)):
        dotted = f"{path}." if path else ""
        parts_of = getattr(module, "checkpoint_parts", {})
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                yield module, name, child, [f"{dotted}{part}.weight" for part in parts_of.get(name, (name,))]


def replace_linear_layers(model: nn.Module, build: Callable[[nn.Linear, list[str]], nn.Module | None]) -> int:
    """Replaces, in place, each `nn.Linear` of `model` for which `build(layer, names)` (names: the
    checkpoint names of the weights it stacks, in order) returns a module. Returns how many."""
    replaced = 0
    for parent, name, layer, names in linear_layers(model):
        if (replacement := build(layer, names)) is not None:
            setattr(parent, name, replacement)
            replaced += 1
    return replaced
