"""Builds a `CausalLM` from a Hugging Face folder's *.safetensors.

Each tensor's name is first given the model's spelling by the family's renames
(`config.checkpoint.renames`, engine/families.py); the model's own load hooks then fuse what the
checkpoint keeps apart (q/k/v, gate/up, a layer's experts: engine/model.py, engine/moe.py) and
tie the head to the embeddings. What is then left over or missing is refused: a checkpoint of
another family, not one to guess at.

A folder converted from a GGUF also holds its Q8_0/Q4_0/Q4_1/Q4_K/Q6_K matrices as stored, in a
safetensors file of format "gguf-blocks" (each tensor's block type in the metadata under its
name). With `quantized_weights` "as-stored", the Linear layers whose checkpoint
weights are all there multiply those blocks (engine/block_linear.py), and embeddings stored there
are looked up in them (engine/block_embedding.py): their float weights are never read (the model
holds meta tensors of their shapes until the blocks replace them), so loading peaks at the blocks
and the float weights that stay, not at the whole float checkpoint. "as-stored-int8-activations"
loads the same and packs the Q4 matrices for the CPU kernel that multiplies them with activations
quantized to int8.

With `quantization` "int8", "int4" or "w8a8", the Linear layers still in float are then quantized
from the checkpoint's tensors as stored, read a second time (engine/quantize_at_load.py): with
"as-stored", a GGUF's layers already in blocks keep them, and only the rest are quantized.
"w8a8" first runs the float model once on a calibration text for its smoothing factors
(engine/smoothing.py).

The model is built on the meta device and its parameters are the checkpoint's tensors, each
read, cast to the target dtype and moved to the target device one at a time: no parameter is
ever materialised in the default dtype. On CPU the Linear layers then trade their weights for
oneDNN-packed copies (engine/cpu_linear.py).
"""
from __future__ import annotations

import re
import textwrap
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from pdserve.engine.block_embedding import EMBEDDINGS, serve_embeddings_as_stored
from pdserve.engine.block_linear import one_block_type, serve_blocks_as_stored
from pdserve.engine.config import ModelConfig
from pdserve.engine.cpu_linear import pack_linear_layers, packs
from pdserve.engine.engine_config import INT8_ACTIVATIONS
from pdserve.engine.linear_layers import linear_layers
from pdserve.engine.model import CausalLM
from pdserve.engine.quantize_at_load import ROW_QUANTIZATIONS, quantize_linear_layers, weight_names_to_quantize
from pdserve.engine.smoothing import CALIBRATION_TEXT, smoothing_factors
from pdserve.protocol.errors import InvalidModelError
from pdserve.protocol.tokenizer import load_tokenizer

BLOCKS_FORMAT = "gguf-blocks"  # the "format" checkpoints.gguf_convert tags its blocks file with


def load_model(model_dir: str | Path, config: ModelConfig, dtype: torch.dtype, device: torch.device,
               max_model_len: int | None = None, quantized_weights: str = "dequantized",
               quantization: str | None = None) -> CausalLM:
    renames = tuple((re.compile(pattern), replacement) for pattern, replacement in config.checkpoint.renames)
    with torch.device("meta"):
        model = CausalLM(config, device, max_model_len)
    blocks = _read_blocks(Path(model_dir), renames) if quantized_weights != "dequantized" else {}
    served_as_stored = names_served_as_stored(model, {name: block_type for name, (block_type, _) in blocks.items()})
    checkpoint = _read_safetensors(Path(model_dir), renames, dtype, device, served_as_stored)
    try:
        model.load_state_dict(checkpoint, strict=True, assign=True)
    except RuntimeError as error:
        raise InvalidModelError(f"{model_dir}: checkpoint does not match {config.architecture}: "
                                f"{textwrap.shorten(str(error), 600)}") from None
    model.eval().requires_grad_(False)
    if blocks:
        serve_blocks_as_stored(model, blocks, device, int8_activations=quantized_weights in INT8_ACTIVATIONS,
                               int8_prefill=quantized_weights == "as-stored-int8-prefill")
        serve_embeddings_as_stored(model, blocks, device)
        unread = [name for name, tensor in (*model.named_parameters(), *model.named_buffers()) if tensor.is_meta]
        if unread:
            raise RuntimeError(f"{model_dir}: {unread} were neither read nor served as stored")
    if quantization is not None:
        smoothing = None
        if quantization in ROW_QUANTIZATIONS:
            smoothing = smoothing_factors(model, load_tokenizer(model_dir).encode(CALIBRATION_TEXT))
        stored = _stored_tensors(Path(model_dir), renames, weight_names_to_quantize(model))
        quantize_linear_layers(model, stored, quantization, device, smoothing)
    if packs(dtype, device):
        pack_linear_layers(model)
    return model


def weights_bytes(model: nn.Module) -> int:
    """The bytes `model`'s weights take: parameters, buffers and oneDNN's packed copies (opaque
    tensors, counted by their shape), each tensor once."""
    tensors = {}
    for module in model.modules():
        for tensor in (*module.parameters(recurse=False), *module.buffers(recurse=False),
                       getattr(module, "packed_weight", None)):
            if tensor is not None:
                key = id(tensor) if tensor.is_mkldnn else tensor.data_ptr()
                tensors[key] = tensor.numel() * tensor.element_size()
    return sum(tensors.values())


def names_served_as_stored(model: nn.Module, block_types: dict[str, str]) -> set[str]:
    """The checkpoint names whose float weights `model` will not need once the blocks of
    `block_types` (name -> block type) serve it: the parts of every Linear layer that
    serve_blocks_as_stored replaces, and the embeddings that serve_embeddings_as_stored does."""
    served = {EMBEDDINGS} & block_types.keys()
    for _, _, _, names in linear_layers(model):
        if one_block_type(names, block_types) is not None:
            served.update(names)
    return served


def _read_safetensors(model_dir: Path, renames: tuple[tuple[re.Pattern, str], ...], dtype: torch.dtype,
                      device: torch.device, unread: set[str]) -> dict[str, torch.Tensor]:
    """The folder's float tensors in `dtype` on `device`, but a meta tensor of its shape for each
    name in `unread`."""
    checkpoint = {}
    for name, stored in _stored_tensors(model_dir, renames, unread=unread):
        checkpoint[name] = (torch.empty(stored.get_shape(), dtype=dtype, device="meta") if name in unread
                            else stored.to(device=device, dtype=dtype))
    return checkpoint


def _stored_tensors(model_dir: Path, renames: tuple[tuple[re.Pattern, str], ...], names: set[str] | None = None,
                    unread: set[str] = frozenset()) -> Iterator[tuple[str, torch.Tensor]]:
    """(name after the renames, tensor as stored, on the CPU) of the folder's float tensors, one
    at a time; only those in `names` when given. For a name in `unread`, its slice (shape and
    dtype, nothing read) instead of the tensor."""
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise InvalidModelError(f"{model_dir}: no *.safetensors files")
    for path in files:
        with safe_open(path, framework="pt") as f:
            if (f.metadata() or {}).get("format") == BLOCKS_FORMAT:
                continue
            for name in f.keys():
                renamed = _renamed(name, renames)
                if names is None or renamed in names:
                    yield renamed, f.get_slice(name) if renamed in unread else f.get_tensor(name)


def _read_blocks(model_dir: Path, renames: tuple[tuple[re.Pattern, str], ...]) -> dict[str, tuple[str, torch.Tensor]]:
    """name -> (block type, uint8 blocks) of the folder's files of format BLOCKS_FORMAT."""
    blocks = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        with safe_open(path, framework="pt") as f:
            metadata = f.metadata() or {}
            if metadata.get("format") == BLOCKS_FORMAT:
                blocks |= {_renamed(name, renames): (metadata[name], f.get_tensor(name)) for name in f.keys()}
    return blocks


def _renamed(name: str, renames: tuple[tuple[re.Pattern, str], ...]) -> str:
    for pattern, replacement in renames:
        name = pattern.sub(replacement, name)
    return name
