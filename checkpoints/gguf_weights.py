"""A llama or qwen2 GGUF's tensors under their Hugging Face names, in float32, as transformers
loads them, and its Q8_0/Q4_0/Q4_1/Q4_K/Q6_K matrices again as stored (their blocks).

    token_embd.weight             -> model.embed_tokens.weight
    output_norm.weight            -> model.norm.weight
    output.weight                 -> lm_head.weight (absent: tied to the embeddings)
    blk.N.attn_norm / ffn_norm    -> model.layers.N.input_layernorm / post_attention_layernorm
    blk.N.attn_q|k|v|output       -> model.layers.N.self_attn.q_proj|k_proj|v_proj|o_proj
    blk.N.ffn_gate|up|down        -> model.layers.N.mlp.gate_proj|up_proj|down_proj
    blk.N.attn_q|k|v.bias         -> model.layers.N.self_attn.q_proj|k_proj|v_proj.bias (qwen2 only)

What a family adds to this shared layout is its row in gguf_config.ARCHITECTURES: the parts with
a bias, and whether q/k rows are permuted. For llama, llama.cpp's converter reorders the rows of
q_proj and k_proj, per head, from HF's rotate-half RoPE layout (first half of a head's dims, then
the second half) to interleaved pairs; `unpermute_rows` puts them back (qwen2 files are not
permuted). It moves whole rows, so it serves a matrix's blocks as well as its floats: a row is a
whole number of blocks (GGUF's rule: in_features is a multiple of the block's weights, 32 or 256),
so no block straddles two rows. The file's tensors must be exactly the ones the family's model has: a missing or an
unknown one raises GGUFError, since a file with parts this mapping does not know is a model this
converter would get wrong.
"""
from __future__ import annotations

import re
from collections.abc import Iterator

import numpy as np

from pdserve.checkpoints.errors import GGUFError
from pdserve.checkpoints.gguf_config import ARCHITECTURES
from pdserve.checkpoints.gguf_file import GGUFFile

TOP_LEVEL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def hf_name(gguf_name: str) -> str | None:
    """The transformers parameter name of a GGUF tensor; None for a name neither family has."""
    if gguf_name in TOP_LEVEL_NAMES:
        return TOP_LEVEL_NAMES[gguf_name]
    match = _LAYER_TENSOR.fullmatch(gguf_name)
    if match is None or match.group(2) not in LAYER_NAMES:
        return None
    layer, part, kind = match.groups()
    return f"model.layers.{layer}.{LAYER_NAMES[part]}.{kind}"


def unpermute_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undoes llama.cpp's per-head interleaving of q/k rows: [H * D/2 * 2, in] -> [H * 2 * D/2, in]."""
    head_dim = weight.shape[0] // num_heads
    per_head = weight.reshape(num_heads, head_dim // 2, 2, *weight.shape[1:])
    return np.ascontiguousarray(per_head.swapaxes(1, 2).reshape(weight.shape))


def hf_weights(gguf: GGUFFile, config: dict) -> Iterator[tuple[str, np.ndarray]]:
    """(transformers name, float32 array) for every tensor of the file, one at a time; first
    checks that the file holds exactly the tensors of the model `config` describes."""
    names = {gguf_name: hf_name(gguf_name) for gguf_name in gguf.tensor_names}
    _check_names(names, config, str(gguf.path))
    heads_of = _permuted_heads(config)
    for gguf_name, name in names.items():
        values = gguf.read_tensor(gguf_name)
        for marker, num_heads in heads_of.items():
            if marker in gguf_name:
                values = unpermute_rows(values, num_heads)
        yield name, values


def hf_blocks(gguf: GGUFFile, config: dict) -> Iterator[tuple[str, tuple[str, np.ndarray]]]:
    """(transformers name, (block type, uint8 blocks [out_features, row bytes])) for every matrix
    stored in a block format pdserve serves as stored (GGUFFile.block_type), rows in the order
    `hf_weights` gives them."""
    heads_of = _permuted_heads(config)
    for gguf_name in gguf.tensor_names:
        block_type = gguf.block_type(gguf_name)
        if block_type is None:
            continue
        blocks = gguf.read_blocks(gguf_name)
        for marker, num_heads in heads_of.items():
            if marker in gguf_name:
                blocks = unpermute_rows(blocks, num_heads)
        yield hf_name(gguf_name), (block_type, blocks)


def _permuted_heads(config: dict) -> dict[str, int]:
    if not ARCHITECTURES[config["model_type"]].permuted_qk:
        return {}
    return {".attn_q.": config["num_attention_heads"], ".attn_k.": config["num_key_value_heads"]}


def expected_names(config: dict) -> set[str]:
    """Every parameter name of the model `config` describes."""
    names = {"model.embed_tokens.weight", "model.norm.weight"}
    if not config["tie_word_embeddings"]:
        names.add("lm_head.weight")
    biased = ARCHITECTURES[config["model_type"]].biased_parts
    for layer in range(config["num_hidden_layers"]):
        names |= {f"model.layers.{layer}.{part}.weight" for part in LAYER_NAMES.values()}
        names |= {f"model.layers.{layer}.{LAYER_NAMES[part]}.bias" for part in biased}
    return names


def _check_names(names: dict[str, str | None], config: dict, path: str) -> None:
    unknown = sorted(gguf_name for gguf_name, name in names.items() if name is None)
    if unknown:
        raise GGUFError(f"{path}: tensor {unknown[0]!r} is not part of a {config['model_type']} model")
    expected = expected_names(config)
    for what, found in (("missing", expected - set(names.values())), ("unexpected", set(names.values()) - expected)):
        if found:
            listed = sorted(found)
            raise GGUFError(f"{path}: {what} tensors for {', '.join(listed[:3])}"
                            f"{f' and {len(listed) - 3} more' if len(listed) > 3 else ''}")
