"""Engine configuration: everything the engine needs, passed in explicitly."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pdserve.protocol.errors import InvalidConfigError

if TYPE_CHECKING:  # the gateway parses service arguments and never loads torch
    import torch

DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass(frozen=True, slots=True)
class EngineConfig:
    model: str
    dtype: str = "auto"  # see resolve_dtype
    device: str = "cpu"
    block_size: int = 16
    num_gpu_blocks: int | None = None  # the pool size in blocks; or give kv_cache_bytes
    kv_cache_bytes: int | None = None
    # On CUDA with neither of the two above: the share of the GPU's memory this replica may take
    # (weights, activations, KV pool); see engine/memory_profile.py.
    gpu_memory_utilization: float = 0.9
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    max_model_len: int | None = None  # default: the model's max positions
    detokenize: bool = True  # False: emit token ids only; stop strings are the caller's job
    enable_prefix_caching: bool = True  # reuse the KV of full blocks of a prefix seen before
    max_step_ms: float | None = None  # prompt chunks sized so a step lasts this long (engine.step_budget)

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise InvalidConfigError(f"dtype {self.dtype!r} is not one of {', '.join(DTYPES)}")
        if self.num_gpu_blocks is not None and self.kv_cache_bytes is not None:
            raise InvalidConfigError("give num_gpu_blocks or kv_cache_bytes, not both")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise InvalidConfigError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.max_step_ms is not None and self.max_step_ms <= 0:
            raise InvalidConfigError(f"max_step_ms must be > 0, got {self.max_step_ms}")
        for name in ("block_size", "max_num_batched_tokens", "max_num_seqs"):
            if getattr(self, name) < 1:
                raise InvalidConfigError(f"{name} must be >= 1, got {getattr(self, name)}")

    def torch_dtype(self, checkpoint_dtype: str) -> torch.dtype:
        import torch
        return getattr(torch, resolve_dtype(self.dtype, checkpoint_dtype, self.device))


def resolve_dtype(dtype: str, checkpoint_dtype: str, device: str) -> str:
    """What `auto` means, as in vLLM: the checkpoint's own dtype, except that a float32 checkpoint
    runs in bfloat16 on a GPU (tensor cores). On CPU a float32 checkpoint stays float32."""
    if dtype != "auto":
        return dtype
    if checkpoint_dtype == "float32" and device.startswith("cuda"):
        return "bfloat16"
    return checkpoint_dtype if checkpoint_dtype in DTYPES else "float32"
