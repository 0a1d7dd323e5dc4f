"""Fixtures of tests/checkpoints: tiny llama folders, .gguf files written from them the way
llama.cpp writes them, and transformers' own GGUF loading as the oracle."""
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as Q

from tests.checkpoints.gguf_files import write_gguf

# Every supported quantized type on some tensor, as a llama.cpp Q4_K_M-like mix would spread them.
MIXED_TYPES = {
    "token_embd.weight": Q.Q8_0, "output.weight": Q.Q6_K,
    "blk.0.attn_q.weight": Q.Q4_0, "blk.0.attn_k.weight": Q.Q4_1, "blk.0.attn_v.weight": Q.Q8_0,
    "blk.0.attn_output.weight": Q.F16, "blk.0.ffn_gate.weight": Q.Q4_K, "blk.0.ffn_up.weight": Q.Q5_K,
    "blk.0.ffn_down.weight": Q.Q6_K, "blk.1.attn_q.weight": Q.BF16, "blk.1.attn_k.weight": Q.Q4_K,
    "blk.2.attn_q.weight": Q.Q6_K, "blk.2.attn_k.weight": Q.Q5_K, "blk.3.attn_k.weight": Q.Q8_0,
}
# llama.cpp's Q4_K_M: Q4_K matrices, the head and the MLP's down projections in Q6_K.
Q4_K_M_TYPES = {"output.weight": Q.Q6_K, **{f"blk.{layer}.ffn_down.weight": Q.Q6_K for layer in range(4)}}
QWEN2 = {"arch": "qwen2", "num_heads": 4, "num_kv_heads": 1, "tie_word_embeddings": True}
# name -> (tiny model spec, per-tensor types, type of the other matrices, metadata written over)
GGUF_VARIANTS = {
    "mixed": ({}, MIXED_TYPES, Q.Q4_1, {}),
    "q4_k_m": ({}, Q4_K_M_TYPES, Q.Q4_K, {}),
    "tied-q8_0": ({"tie_word_embeddings": True}, {}, Q.Q8_0, {}),
    "f16": ({}, {}, Q.F16, {}),
    "bf16": ({}, {}, Q.BF16, {}),
    "f32": ({}, {}, Q.F32, {}),
    "qwen2": (QWEN2, {"blk.0.attn_q.weight": Q.Q4_K, "blk.1.ffn_down.weight": Q.Q6_K}, Q.Q8_0,
              {"tokenizer.ggml.pre": "qwen2"}),
}


@pytest.fixture(scope="session")
def gguf_file(tiny_model, tmp_path_factory):
    """`gguf_file(variant)`: the path of that GGUF_VARIANTS file, written once per session."""
    written = {}

    def make(variant: str) -> Path:
        if variant not in written:
            spec, types, default_type, metadata = GGUF_VARIANTS[variant]
            path = tmp_path_factory.mktemp("gguf") / f"tiny-{variant}.gguf"
            written[variant] = write_gguf(tiny_model(**spec), path, types, default_type=default_type,
                                          metadata=metadata)
        return written[variant]

    return make


@pytest.fixture(scope="session")
def converted(gguf_file, tmp_path_factory):
    """`converted(variant)`: the HF folder pdserve converts that GGUF into, once per session."""
    from pdserve.checkpoints.gguf_convert import convert_gguf

    folders = {}

    def make(variant: str) -> Path:
        if variant not in folders:
            folders[variant] = convert_gguf(gguf_file(variant), tmp_path_factory.mktemp(f"converted-{variant}"))
        return folders[variant]

    return make


@pytest.fixture(scope="session")
def transformers_gguf():
    """`transformers_gguf(path)`: (model, tokenizer) as transformers loads the .gguf at `path`."""
    def load(path: Path):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name)
        return model, AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)

    return load
