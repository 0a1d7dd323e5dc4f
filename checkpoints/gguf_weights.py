"""A llama GGUF's tensors under their Hugging Face names, in float32, as transformers loads them.

    token_embd.weight             -> model.embed_tokens.weight
    output_norm.weight            -> model.norm.weight
    output.weight                 -> lm_head.weight (absent: tied to the embeddings)
    blk.N.attn_norm / ffn_norm    -> model.layers.N.input_layernorm / post_attention_layernorm
    blk.N.attn_q|k|v|output       -> model.layers.N.self_attn.q_proj|k_proj|v_proj|o_proj
    blk.N.ffn_gate|up|down        -> model.layers.N.mlp.gate_proj|up_proj|down_proj

llama.cpp's converter reorders the rows of q_proj and k_proj, per head, from HF's rotate-half RoPE
layout (first half of a head's dims, then the second half) to interleaved pairs; `unpermute_rows`
puts them back. Any other tensor name raises GGUFError: a file with parts this mapping does not
know is a model this converter would get wrong.
"""
from __future__ import annotations

import re
from collections.abc import Iterator

import numpy as np

from pdserve.checkpoints.errors import GGUFError
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
_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.(\w+)\.weight")


def hf_name(gguf_name: str) -> str | None:
    """The transformers parameter name of a llama GGUF tensor; None for one llama has not."""
    if gguf_name in TOP_LEVEL_NAMES:
        return TOP_LEVEL_NAMES[gguf_name]
    match = _LAYER_TENSOR.fullmatch(gguf_name)
    if match is None or match.group(2) not in LAYER_NAMES:
        return None
    return f"model.layers.{match.group(1)}.{LAYER_NAMES[match.group(2)]}.weight"


def unpermute_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undoes llama.cpp's per-head interleaving of q/k rows: [H * D/2 * 2, in] -> [H * 2 * D/2, in]."""
    head_dim = weight.shape[0] // num_heads
    per_head = weight.reshape(num_heads, head_dim // 2, 2, *weight.shape[1:])
    return np.ascontiguousarray(per_head.swapaxes(1, 2).reshape(weight.shape))


def hf_weights(gguf: GGUFFile, config: dict) -> Iterator[tuple[str, np.ndarray]]:
    """(transformers name, float32 array) for every tensor of the file, one at a time."""
    heads_of = {".attn_q.": config["num_attention_heads"], ".attn_k.": config["num_key_value_heads"]}
    for gguf_name in gguf.tensor_names:
        name = hf_name(gguf_name)
        if name is None:
            raise GGUFError(f"{gguf.path}: tensor {gguf_name!r} is not part of a llama model")
        values = gguf.read_tensor(gguf_name)
        for marker, num_heads in heads_of.items():
            if marker in gguf_name:
                values = unpermute_rows(values, num_heads)
        yield name, values


def check_complete(names: set[str], config: dict, path: str) -> None:
    """Every parameter a LlamaForCausalLM of `config` has is among `names`."""
    expected = {"model.embed_tokens.weight", "model.norm.weight"}
    if not config["tie_word_embeddings"]:
        expected.add("lm_head.weight")
    expected |= {f"model.layers.{layer}.{part}.weight"
                 for layer in range(config["num_hidden_layers"]) for part in LAYER_NAMES.values()}
    missing = sorted(expected - names)
    if missing:
        raise GGUFError(f"{path}: missing tensors for {', '.join(missing[:3])}"
                        f"{f' and {len(missing) - 3} more' if len(missing) > 3 else ''}")
