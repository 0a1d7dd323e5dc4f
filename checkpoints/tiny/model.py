"""Writes a small, randomly initialised Hugging Face causal LM folder, with no model hub.

Folder layout (what `AutoModelForCausalLM` / `AutoTokenizer.from_pretrained` read):

    config.json            LlamaConfig / Qwen2Config / MistralConfig, special ids from the tokenizer
    model.safetensors      every parameter, in `dtype`; no lm_head when embeddings are tied
    tokenizer.json         byte-level BPE with exactly `vocab_size` ids (see tokenizer.py)
    tokenizer_config.json  special tokens and the ChatML chat template

Invariant: the same spec gives a byte-identical model.safetensors. Parameters are drawn on the
CPU from one explicitly seeded generator, in sorted-name order, in float32, then cast.

Every matrix and bias is drawn from normal(0, init_range). The default 0.2 is ten times the
usual 0.02 on purpose: at 0.02 a random model's greedy output repeats a few tokens, which makes
engine-versus-transformers equality checks weak. Norm weights are 1 + normal(0, init_range)
rather than plain ones, so an engine that drops or swaps a norm weight disagrees with
transformers instead of passing by accident.
"""
import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from tqdm import tqdm
from transformers import (
    GenerationConfig,
    AutoModelForCausalLM,
    LlamaConfig,
    MistralConfig,
    PretrainedConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
)

from pdserve.checkpoints.tiny.tokenizer import IM_END_TOKEN, MIN_VOCAB_SIZE, write_tiny_tokenizer

logger = logging.getLogger(__name__)

CONFIG_CLASSES = {"llama": LlamaConfig, "qwen2": Qwen2Config, "mistral": MistralConfig}
ARCHITECTURE_NAMES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "mistral": "MistralForCausalLM",
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
ROPE_SCALINGS = ("llama3",)

WEIGHTS_FILE_NAME = "model.safetensors"


@dataclass(frozen=True, slots=True)
class TinyModelSpec:
    """Everything that decides the written folder; `head_dim=None` means hidden / heads."""

    arch: str = "llama"
    hidden_size: int = 256
    num_layers: int = 4
    num_heads: int = 8
    num_kv_heads: int = 4
    head_dim: int | None = None
    intermediate_size: int = 512
    vocab_size: int = 4096
    max_position_embeddings: int = 2048
    seed: int = 0
    init_range: float = 0.2
    dtype: str = "float32"
    tie_word_embeddings: bool = False
    rope_scaling: str | None = None

    def __post_init__(self) -> None:
        if self.arch not in CONFIG_CLASSES:
            raise ValueError(f"arch must be one of {sorted(CONFIG_CLASSES)}, got {self.arch!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if self.rope_scaling is not None and self.rope_scaling not in ROPE_SCALINGS:
            raise ValueError(f"rope_scaling must be None or one of {ROPE_SCALINGS}, "
                             f"got {self.rope_scaling!r}")
        if self.hidden_size % self.num_heads != 0:
            raise ValueError(f"hidden_size {self.hidden_size} is not a multiple of "
                             f"num_heads {self.num_heads}")
        if self.num_heads % self.num_kv_heads != 0:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of "
                             f"num_kv_heads {self.num_kv_heads}")
        if self.resolved_head_dim % 2 != 0:
            raise ValueError(f"head_dim must be even for rotary embeddings, got {self.resolved_head_dim}")
        if self.vocab_size < MIN_VOCAB_SIZE:
            raise ValueError(f"vocab_size must be at least {MIN_VOCAB_SIZE} (bytes and special tokens), "
                             f"got {self.vocab_size}")
        if not 0.0 < self.init_range <= 1.0:
            raise ValueError(f"init_range must be in (0, 1], got {self.init_range}")

    @property
    def resolved_head_dim(self) -> int:
        return self.head_dim if self.head_dim is not None else self.hidden_size // self.num_heads


def rope_parameters(spec: TinyModelSpec) -> dict | None:
    """The llama3 frequency rescaling when asked for; None keeps the architecture's plain RoPE."""
    if spec.rope_scaling is None:
        return None
    return {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": spec.max_position_embeddings // 4,
    }


def generation_config(tokenizer: PreTrainedTokenizerFast) -> GenerationConfig:
    """Both the end of text and the end of a chat turn end generation, as in instruct models."""
    end_ids = [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(IM_END_TOKEN)]
    return GenerationConfig(bos_token_id=tokenizer.bos_token_id, eos_token_id=end_ids,
                            pad_token_id=tokenizer.pad_token_id)


def build_config(spec: TinyModelSpec, tokenizer: PreTrainedTokenizerFast) -> PretrainedConfig:
    """The transformers config for `spec`, with full attention in every layer."""
    no_sliding_window = {
        "llama": {},
        "qwen2": {"use_sliding_window": False, "sliding_window": None},
        "mistral": {"sliding_window": None},
    }[spec.arch]
    return CONFIG_CLASSES[spec.arch](
        architectures=[ARCHITECTURE_NAMES[spec.arch]],
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.resolved_head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        initializer_range=spec.init_range,
        tie_word_embeddings=spec.tie_word_embeddings,
        rope_parameters=rope_parameters(spec),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype=spec.dtype,
        **no_sliding_window,
    )


def parameter_shapes(config: PretrainedConfig) -> dict[str, torch.Size]:
    """Checkpoint names and shapes of the model `config` describes; a tied lm_head is absent."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return {name: param.shape for name, param in model.named_parameters()}


def random_weights(config: PretrainedConfig, spec: TinyModelSpec) -> dict[str, torch.Tensor]:
    """Every parameter drawn from the seeded generator, in sorted-name order."""
    generator = torch.Generator(device="cpu").manual_seed(spec.seed)
    shapes = parameter_shapes(config)
    weights = {}
    for name in tqdm(sorted(shapes), desc="weights", unit="tensor", disable=None):
        values = torch.empty(shapes[name], dtype=torch.float32)
        values.normal_(0.0, spec.init_range, generator=generator)
        if name.endswith("norm.weight"):
            values += 1.0
        weights[name] = values.to(DTYPES[spec.dtype])
    return weights


def write_tiny_model_spec(out_dir: str | Path, spec: TinyModelSpec) -> Path:
    """Writes the folder for `spec` into `out_dir` (created if missing) and returns its path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = write_tiny_tokenizer(out_dir, spec.vocab_size)
    config = build_config(spec, tokenizer)
    config.save_pretrained(out_dir)
    generation_config(tokenizer).save_pretrained(out_dir)
    weights = random_weights(config, spec)
    num_params = sum(tensor.numel() for tensor in weights.values())
    logger.info("writing %d parameters as %s to %s", num_params, spec.dtype, out_dir / WEIGHTS_FILE_NAME)
    save_file(weights, out_dir / WEIGHTS_FILE_NAME, metadata={"format": "pt"})
    return out_dir


def write_tiny_model(out_dir: str | Path, **spec_fields) -> Path:
    """`write_tiny_model_spec` with `TinyModelSpec` fields as keywords, e.g. `arch="qwen2"`."""
    return write_tiny_model_spec(out_dir, TinyModelSpec(**spec_fields))
