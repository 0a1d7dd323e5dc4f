"""Builds a `CausalLM` from a Hugging Face folder's *.safetensors.

Hugging Face keeps q/k/v and gate/up as separate tensors; the model fuses them, so they are
concatenated here in the order the model splits them (q, k, v and gate, up). Checkpoints that
store them fused already (Phi-3's qkv_proj and gate_up_proj) load as they are. A mixture-of-
experts layer keeps one tensor per projection for all its experts: expert e's gate and up
become `mlp.experts.gate_up_proj[e]`, its down `mlp.experts.down_proj[e]`. Mixtral names its
experts' projections w1 (gate), w3 (up) and w2 (down) under `block_sparse_moe`; they are renamed
first, as transformers renames them.

The model is built on the meta device and its parameters are the checkpoint's tensors, each
read, cast to the target dtype and moved to the target device one at a time: no parameter is
ever materialised in the default dtype, so loading needs the weights' memory and no more. On
CPU the Linear layers then trade their weights for oneDNN-packed copies (engine/cpu_linear.py).
"""
from __future__ import annotations

import re
from pathlib import Path

import torch
from safetensors import safe_open

from pdserve.engine.config import ModelConfig
from pdserve.engine.cpu_linear import pack_linear_layers, packs
from pdserve.protocol.errors import InvalidModelError
from pdserve.engine.model import CausalLM

_PACKED = {
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
}
_RENAMED = (
    (re.compile(r"\.block_sparse_moe\."), ".mlp."),
    (re.compile(r"(\.experts\.\d+)\.w1\."), r"\1.gate_proj."),
    (re.compile(r"(\.experts\.\d+)\.w3\."), r"\1.up_proj."),
    (re.compile(r"(\.experts\.\d+)\.w2\."), r"\1.down_proj."),
)


def load_model(model_dir: str | Path, config: ModelConfig, dtype: torch.dtype, device: torch.device,
               max_model_len: int | None = None) -> CausalLM:
    checkpoint = _read_safetensors(Path(model_dir), dtype, device)
    with torch.device("meta"):
        model = CausalLM(config, device, max_model_len)
    state = _pack(checkpoint, config)
    expected, given = set(model.state_dict()), set(state)
    if expected != given:
        raise InvalidModelError(
            f"{model_dir}: checkpoint does not match {config.architecture}: "
            f"missing {sorted(expected - given)[:5]}, unexpected {sorted(given - expected)[:5]}")
    model.load_state_dict(state, strict=True, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.eval().requires_grad_(False)
    if packs(dtype, device):
        pack_linear_layers(model)
    return model


def _read_safetensors(model_dir: Path, dtype: torch.dtype, device: torch.device) -> dict[str, torch.Tensor]:
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise InvalidModelError(f"{model_dir}: no *.safetensors files")
    tensors = {}
    for path in files:
        with safe_open(path, framework="pt") as f:
            for name in f.keys():
                tensors[_renamed(name)] = f.get_tensor(name).to(device=device, dtype=dtype)
    return tensors


def _renamed(name: str) -> str:
    for pattern, replacement in _RENAMED:
        name = pattern.sub(replacement, name)
    return name


def _pack(checkpoint: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    state = dict(checkpoint)
    for i in range(config.num_layers):
        prefix = f"model.layers.{i}."
        for packed, parts in _PACKED.items():
            for suffix in ("weight", "bias"):
                names = [f"{prefix}{part}.{suffix}" for part in parts]
                if all(name in state for name in names):
                    state[f"{prefix}{packed}.{suffix}"] = torch.cat([state.pop(name) for name in names])
        if config.parts.moe is not None:
            _stack_experts(state, f"{prefix}mlp.experts.", config.parts.moe.num_experts)
    if config.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    return state


def _stack_experts(state: dict[str, torch.Tensor], prefix: str, num_experts: int) -> None:
    """Per-expert gate/up/down [intermediate, hidden] ([hidden, intermediate] for down) become
    `gate_up_proj [num_experts, 2 * intermediate, hidden]` and `down_proj [num_experts, hidden, intermediate]`."""
    names = {part: [f"{prefix}{e}.{part}.weight" for e in range(num_experts)]
             for part in ("gate_proj", "up_proj", "down_proj")}
    if not all(name in state for part_names in names.values() for name in part_names):
        return
    state[f"{prefix}gate_up_proj"] = torch.stack([
        torch.cat([state.pop(gate), state.pop(up)]) for gate, up in zip(names["gate_proj"], names["up_proj"])])
    state[f"{prefix}down_proj"] = torch.stack([state.pop(down) for down in names["down_proj"]])
