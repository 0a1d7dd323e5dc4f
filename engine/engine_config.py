"""Engine configuration: everything the engine needs, passed in explicitly."""
from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pdserve.engine.cpu_features import cpu_has_hardware_bf16
from pdserve.protocol.errors import InvalidConfigError

if TYPE_CHECKING:  # the gateway parses service arguments and never loads torch
    import torch

DTYPES = ("auto", "float32", "bfloat16", "float16")
QUANTIZED_WEIGHTS = ("as-stored", "as-stored-int8-activations", "as-stored-int8-prefill", "dequantized")
INT8_ACTIVATIONS = ("as-stored-int8-activations", "as-stored-int8-prefill")
QUANTIZATIONS = ("int8", "int4", "w8a8")  # engine/quantize_at_load.py
KV_CACHE_DTYPES = ("auto", "int8")  # int8: kernels/kv_quant.py
MEMORY_UNITS = {"": 1, "B": 1, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_MEMORY_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([A-Za-z]*)")


@dataclass(frozen=True, slots=True)
class EngineConfig:
    model: str
    dtype: str = "auto"  # see resolve_dtype
    device: str = "cpu"
    block_size: int = 16
    num_gpu_blocks: int | None = None  # the pool size in blocks; or give kv_cache_memory_bytes
    kv_cache_memory_bytes: int | None = None
    # On CUDA with neither of the two above: the share of the GPU's memory this replica may take
    # (weights, activations, KV pool); see engine/memory_profile.py.
    gpu_memory_utilization: float = 0.9
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    max_model_len: int | None = None  # default: the model's max positions
    detokenize: bool = True  # False: emit token ids only; stop strings are the caller's job
    enable_prefix_caching: bool = True  # reuse the KV of full blocks of a prefix seen before
    max_step_ms: float | None = None  # prompt chunks sized so a step lasts this long (engine.step_budget)
    # "dequantized": every weight is widened to the dtype at load; "as-stored": on CPU and CUDA, a
    # GGUF's Q8_0/Q4_0/Q4_1 matrices are multiplied as stored (engine/weights.py);
    # "as-stored-int8-activations": the same, but on CPU a decode step's rows are quantized to int8
    # per block of 32 for the Q4 matrices, as llama.cpp does (kernels/cpu_packed_q4_linear.py);
    # "as-stored-int8-prefill": and a prefill's rows too, where faster (engine/block_linear.py).
    quantized_weights: str = "dequantized"
    # None: Linear weights as the checkpoint has them; "int8" or "int4": quantized at load, weight-only,
    # in groups of 32; "w8a8": q/k/v and gate/up as int8 weights per output row times int8 activations
    # per token, smoothed (engine/quantize_at_load.py). With "as-stored", layers already in blocks keep them.
    quantization: str | None = None
    kv_cache_dtype: str = "auto"  # "auto": the dtype's; "int8": levels and a scale per token and head
    # True: every step through the model's modules; False: on CPU, decode steps run as a bound plan
    # (engine/cpu_decode_plan.py), as vLLM replays CUDA graphs unless told to enforce eager mode.
    enforce_eager: bool = False

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise InvalidConfigError(f"dtype {self.dtype!r} is not one of {', '.join(DTYPES)}")
        if self.quantized_weights not in QUANTIZED_WEIGHTS:
            raise InvalidConfigError(f"quantized_weights {self.quantized_weights!r} is not one of "
                                     f"{', '.join(QUANTIZED_WEIGHTS)}")
        if self.quantization is not None and self.quantization not in QUANTIZATIONS:
            raise InvalidConfigError(f"quantization {self.quantization!r} is not one of "
                                     f"{', '.join(QUANTIZATIONS)} (None: not quantized)")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise InvalidConfigError(f"kv_cache_dtype {self.kv_cache_dtype!r} is not one of {', '.join(KV_CACHE_DTYPES)}")
        if self.num_gpu_blocks is not None and self.kv_cache_memory_bytes is not None:
            raise InvalidConfigError("give num_gpu_blocks or kv_cache_memory_bytes, not both")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise InvalidConfigError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.max_step_ms is not None and self.max_step_ms <= 0:
            raise InvalidConfigError(f"max_step_ms must be > 0, got {self.max_step_ms}")
        for name in ("block_size", "max_num_batched_tokens", "max_num_seqs"):
            if getattr(self, name) < 1:
                raise InvalidConfigError(f"{name} must be >= 1, got {getattr(self, name)}")

    def torch_dtype(self, checkpoint_dtype: str) -> torch.dtype:
        import torch
        return getattr(torch, resolve_dtype(self.dtype, checkpoint_dtype, self.device, cpu_has_hardware_bf16()))

    def kv_torch_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The KV pool's dtype for activations of `dtype`."""
        import torch
        return dtype if self.kv_cache_dtype == "auto" else getattr(torch, self.kv_cache_dtype)


def resolve_dtype(dtype: str, checkpoint_dtype: str, device: str, cpu_bf16: bool) -> str:
    """What `auto` means. On a GPU, as in vLLM: the checkpoint's own dtype, except that a float32
    checkpoint runs in bfloat16 (tensor cores). On a CPU, as in vLLM's CPU backend: bfloat16 where
    the CPU computes it in hardware (`cpu_bf16`, see engine/cpu_features.py), whatever the
    checkpoint's dtype; float32 elsewhere, where bfloat16 and float16 are emulated."""
    if dtype != "auto":
        return dtype
    if not device.startswith("cuda"):
        return "bfloat16" if cpu_bf16 else "float32"
    if checkpoint_dtype == "float32":
        return "bfloat16"
    return checkpoint_dtype if checkpoint_dtype in DTYPES else "float32"


def parse_memory_size(text: str) -> int:
    """Bytes in a size such as "4GiB", "1.5 GiB", "512MiB" or "1073741824" (units are powers of 1024)."""
    match = _MEMORY_SIZE.fullmatch(text.strip())
    number, unit = (match.group(1), MEMORY_UNITS.get(match.group(2).upper())) if match else ("", None)
    if unit is None or (unit == 1 and not number.isdigit()):
        raise InvalidConfigError(f"{text!r} is not a memory size such as 4GiB, 512MiB or a number of bytes")
    return int(number) if unit == 1 else int(float(number) * unit)


def memory_size_arg(text: str) -> int:
    """`parse_memory_size` as an argparse type: a size it cannot read is a usage error naming the forms."""
    try:
        return parse_memory_size(text)
    except InvalidConfigError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
