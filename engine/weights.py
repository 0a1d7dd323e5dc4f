"""Builds a `CausalLM` from a Hugging Face folder's *.safetensors.

Hugging Face keeps q/k/v and gate/up as separate tensors; the model fuses them, so they are
concatenated here in the order the model splits them (q, k, v and gate, up).

The model is built on the meta device and its parameters are the checkpoint's tensors, each
read, cast to the target dtype and moved to the target device one at a time: no parameter is
ever materialised in the default dtype, so loading needs the weights' memory and no more.
"""
from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open

from pdserve.engine.config import ModelConfig
from pdserve.engine.errors import InvalidModelError
from pdserve.engine.model import CausalLM

_PACKED = {
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
}


def load_model(model_dir: str | Path, config: ModelConfig, dtype: torch.dtype, device: torch.device) -> CausalLM:
    checkpoint = _read_safetensors(Path(model_dir), dtype, device)
    with torch.device("meta"):
        model = CausalLM(config, device)
    state = _pack(checkpoint, config)
    expected, given = set(model.state_dict()), set(state)
    if expected != given:
        raise InvalidModelError(
            f"{model_dir}: checkpoint does not match {config.architecture}: "
            f"missing {sorted(expected - given)[:5]}, unexpected {sorted(given - expected)[:5]}")
    model.load_state_dict(state, strict=True, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model.eval().requires_grad_(False)


def _read_safetensors(model_dir: Path, dtype: torch.dtype, device: torch.device) -> dict[str, torch.Tensor]:
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise InvalidModelError(f"{model_dir}: no *.safetensors files")
    tensors = {}
    for path in files:
        with safe_open(path, framework="pt") as f:
            for name in f.keys():
                tensors[name] = f.get_tensor(name).to(device=device, dtype=dtype)
    return tensors


def _pack(checkpoint: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    state = dict(checkpoint)
    for i in range(config.num_layers):
        prefix = f"model.layers.{i}."
        for packed, parts in _PACKED.items():
            for suffix in ("weight", "bias"):
                names = [f"{prefix}{part}.{suffix}" for part in parts]
                if all(name in state for name in names):
                    state[f"{prefix}{packed}.{suffix}"] = torch.cat([state.pop(name) for name in names])
    if config.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    return state
