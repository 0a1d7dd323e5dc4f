"""Small .gguf files written the way llama.cpp's converter writes them, from a tiny HF llama or
qwen2 folder.

`write_gguf(model_dir, path, types)` stores each tensor of the folder under its GGUF name, a
llama's q_proj and k_proj rows permuted per head (llama.cpp's `LlamaModel.permute`), in the type
`types` gives it (gguf.quants quantizes F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0; it cannot quantize
the K types, so those get random but valid blocks), and the tokenizer as `tokenizer.ggml.*`.
`metadata` adds or overrides keys, `drop` leaves keys or tensors out: ways to make bad files.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q
from safetensors.numpy import load_file

K_TYPES_SCALE_OFFSETS = {Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}  # byte offsets of fp16 scales
K_TYPES_SCALE = {Q.Q4_K: 2e-4, Q.Q5_K: 1e-4, Q.Q6_K: 3e-5}
LAYER_PARTS = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}


def gguf_name(hf_name: str) -> str:
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    if hf_name in top:
        return top[hf_name]
    _, _, layer, *part, kind = hf_name.split(".")
    return f"blk.{layer}.{LAYER_PARTS['.'.join(part)]}.{kind}"


def permute(weights: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's: each head's rows from [first half, second half] to interleaved pairs."""
    return (weights.reshape(num_heads, 2, weights.shape[0] // num_heads // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def random_k_blocks(shape: tuple[int, int], kind: Q, rng: np.random.Generator) -> np.ndarray:
    """Random bytes as `shape` values of K-quant type `kind`, with small, finite fp16 scales."""
    block_size, type_size = gguf.GGML_QUANT_SIZES[kind]
    num_blocks = shape[0] * shape[1] // block_size
    blocks = rng.integers(0, 256, size=(num_blocks, type_size), dtype=np.uint8)
    for offset in K_TYPES_SCALE_OFFSETS[kind]:
        scales = rng.uniform(0.5, 1.5, num_blocks).astype(np.float16) * np.float16(K_TYPES_SCALE[kind])
        blocks[:, offset:offset + 2] = scales.view(np.uint8).reshape(num_blocks, 2)
    return blocks.reshape(shape[0], shape[1] // block_size * type_size)


def encode(values: np.ndarray, kind: Q, rng: np.random.Generator) -> np.ndarray:
    if kind == Q.F32:
        return values
    if kind in K_TYPES_SCALE_OFFSETS:
        return random_k_blocks(values.shape, kind, rng)
    return gguf.quants.quantize(values, kind)


def tokenizer_metadata(model_dir: Path) -> dict[str, object]:
    """tokenizer.ggml.* of the folder's byte-level BPE tokenizer, as llama.cpp writes them."""
    tokenizer = json.loads((model_dir / "tokenizer.json").read_text())
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.get)
    special = {added["content"] for added in tokenizer["added_tokens"] if added["special"]}
    merges = [merge if isinstance(merge, str) else " ".join(merge) for merge in tokenizer["model"]["merges"]]
    model_config = json.loads((model_dir / "config.json").read_text())
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt-2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [3 if token in special else 1 for token in tokens],
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": model_config["bos_token_id"],
        "tokenizer.ggml.eos_token_id": model_config["eos_token_id"],
        "tokenizer.ggml.padding_token_id": model_config["pad_token_id"],
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.chat_template": config["chat_template"],
    }


def model_metadata(config: dict, arch: str) -> dict[str, object]:
    return {
        f"{arch}.block_count": config["num_hidden_layers"],
        f"{arch}.context_length": config["max_position_embeddings"],
        f"{arch}.embedding_length": config["hidden_size"],
        f"{arch}.feed_forward_length": config["intermediate_size"],
        f"{arch}.attention.head_count": config["num_attention_heads"],
        f"{arch}.attention.head_count_kv": config["num_key_value_heads"],
        f"{arch}.rope.freq_base": float((config.get("rope_parameters") or {}).get("rope_theta", 10000.0)),
        f"{arch}.attention.layer_norm_rms_epsilon": float(config["rms_norm_eps"]),
        f"{arch}.rope.dimension_count": config["head_dim"],
        f"{arch}.vocab_size": config["vocab_size"],
    }


def write_gguf(model_dir: str | Path, path: Path, types: Mapping[str, Q] | None = None, *,
               default_type: Q = Q.F32, arch: str | None = None, metadata: Mapping[str, object] | None = None,
               drop: tuple[str, ...] = (), seed: int = 0) -> Path:
    """Writes `model_dir` as a GGUF at `path`; `types` maps GGUF tensor names to their type
    (matrices not named take `default_type`; norms and biases stay F32, as llama.cpp keeps 1-D
    tensors). `arch` overrides general.architecture (default: the folder's model_type)."""
    model_dir, rng = Path(model_dir), np.random.default_rng(seed)
    config = json.loads((model_dir / "config.json").read_text())
    arch = arch or config["model_type"]
    writer = gguf.GGUFWriter(path, arch)
    permuted = config["model_type"] == "llama"
    values = {**model_metadata(config, arch), **tokenizer_metadata(model_dir), **(metadata or {})}
    for key, value in values.items():
        if key not in drop:
            _add_value(writer, key, value)
    for hf_name, weights in sorted(load_file(model_dir / "model.safetensors").items()):
        name = gguf_name(hf_name)
        if name in drop:
            continue
        weights = weights.astype(np.float32)
        if permuted and name.endswith("attn_q.weight"):
            weights = permute(weights, config["num_attention_heads"])
        elif permuted and name.endswith("attn_k.weight"):
            weights = permute(weights, config["num_key_value_heads"])
        kind = Q.F32 if weights.ndim == 1 else (types or {}).get(name, default_type)
        writer.add_tensor(name, encode(weights, kind, rng), raw_dtype=None if kind == Q.F32 else kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _add_value(writer: gguf.GGUFWriter, key: str, value: object) -> None:
    if isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        writer.add_uint32(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    elif isinstance(value, str):
        writer.add_string(key, value)
    else:
        writer.add_array(key, value)
