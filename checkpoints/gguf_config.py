"""A GGUF's llama or qwen2 metadata as the config.json and generation_config.json transformers writes.

Invariant: the config equals, field for field that the engine reads, the one transformers builds
when it loads the same file (`from_pretrained(dir, gguf_file=name)`). What this converter cannot
reproduce faithfully is refused with GGUFError, never approximated: another architecture,
rotary embeddings on part of a head, or RoPE scaling.

Weights are written as float32, which every supported GGUF type widens to exactly, and `dtype`
says float32: transformers loads these GGUFs in float32 whatever their tensor types, and `auto`
then means float32 on a CPU and bfloat16 on a GPU, as for any float32 checkpoint.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from pdserve.checkpoints.errors import GGUFError
from pdserve.checkpoints.gguf_file import GGUFFile


@dataclass(frozen=True, slots=True)
class GGUFFamily:
    """All that sets one general.architecture apart from the layout the families share
    (gguf_weights.py): its transformers class, what its config adds, and its tensors' quirks."""
    class_name: str
    config_fields: dict = field(default_factory=dict)
    biased_parts: tuple[str, ...] = ()  # the layers' parts that carry a bias
    permuted_qk: bool = False  # llama.cpp's converter interleaved the rows of q_proj and k_proj per head


ARCHITECTURES = {
    "llama": GGUFFamily("LlamaForCausalLM", {"attention_bias": False, "mlp_bias": False}, permuted_qk=True),
    "qwen2": GGUFFamily("Qwen2ForCausalLM", {"use_sliding_window": False}, biased_parts=("attn_q", "attn_k", "attn_v")),
}
DEFAULT_ROPE_THETA = 10000.0
DEFAULT_RMS_NORM_EPS = 1e-5
# Chat templates end a turn with one of these; llama.cpp stops on them too (end-of-generation).
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>")


def architecture(gguf: GGUFFile) -> str:
    arch = gguf.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise GGUFError(f"{gguf.path}: general.architecture is {arch!r}; "
                        f"supported for .gguf files: {', '.join(ARCHITECTURES)}")
    return arch


def build_config(gguf: GGUFFile, tied_embeddings: bool) -> dict:
    """config.json of the file's family; `tied_embeddings`: the file has no output.weight."""
    arch = architecture(gguf)
    family = ARCHITECTURES[arch]
    _refuse_rope_scaling(gguf, arch)
    num_heads = gguf.get(f"{arch}.attention.head_count")
    hidden_size = gguf.get(f"{arch}.embedding_length")
    head_dim = gguf.get(f"{arch}.attention.key_length", hidden_size // num_heads)
    rotary_dim = gguf.get(f"{arch}.rope.dimension_count", head_dim)
    if rotary_dim != head_dim:
        raise GGUFError(f"{gguf.path}: rotary embeddings on {rotary_dim} of {head_dim} head dims are not supported")
    vocab_size, embedding_width = gguf.tensor_shape("token_embd.weight")
    if embedding_width != hidden_size:
        raise GGUFError(f"{gguf.path}: token_embd.weight is {embedding_width} wide, "
                        f"{arch}.embedding_length says {hidden_size}")
    return {
        "architectures": [family.class_name],
        "model_type": arch,
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": gguf.get(f"{arch}.feed_forward_length"),
        "num_hidden_layers": gguf.get(f"{arch}.block_count"),
        "num_attention_heads": num_heads,
        "num_key_value_heads": gguf.get(f"{arch}.attention.head_count_kv", num_heads),
        "head_dim": head_dim,
        "max_position_embeddings": gguf.get(f"{arch}.context_length"),
        "rms_norm_eps": gguf.get(f"{arch}.attention.layer_norm_rms_epsilon", DEFAULT_RMS_NORM_EPS),
        "rope_parameters": {"rope_type": "default",
                            "rope_theta": gguf.get(f"{arch}.rope.freq_base", DEFAULT_ROPE_THETA)},
        "hidden_act": "silu",
        "tie_word_embeddings": tied_embeddings,
        "bos_token_id": gguf.get("tokenizer.ggml.bos_token_id", None),
        "eos_token_id": gguf.get("tokenizer.ggml.eos_token_id", None),
        "pad_token_id": gguf.get("tokenizer.ggml.padding_token_id", None),
        "dtype": "float32",
        **family.config_fields,
    }


def build_generation_config(gguf: GGUFFile, tokens: list[str]) -> dict:
    """generation_config.json: generation ends at the end of text and at the end of a chat turn."""
    end_ids = [gguf.get(f"tokenizer.ggml.{key}", None) for key in ("eos_token_id", "eot_token_id", "eom_token_id")]
    template = gguf.get("tokenizer.chat_template", "")
    end_ids += [tokens.index(token) for token in END_OF_TURN_TOKENS if token in tokens and token in template]
    eos_ids = list(dict.fromkeys(token_id for token_id in end_ids if token_id is not None))
    return {
        "bos_token_id": gguf.get("tokenizer.ggml.bos_token_id", None),
        "eos_token_id": eos_ids[0] if len(eos_ids) == 1 else eos_ids,
        "pad_token_id": gguf.get("tokenizer.ggml.padding_token_id", None),
    }


def _refuse_rope_scaling(gguf: GGUFFile, arch: str) -> None:
    scaling = gguf.get(f"{arch}.rope.scaling.type", "none")
    if scaling != "none" or "rope_freqs.weight" in gguf.tensor_names:
        raise GGUFError(f"{gguf.path}: RoPE scaling ({scaling if scaling != 'none' else 'rope_freqs'}) "
                        "is not supported for .gguf files")
