"""A decoder layer's elementwise ops on CPU, compiled: `csrc/cpu_layer_ops.c` (RMSNorm, alone or
after the residual add; the rotary embedding; SiLU-and-multiply), one pass over memory each where
torch takes two to six, and the copy of new tokens' K and V into a float pool. Built on first use
(kernels/cpu_build.py) once per dtype, float32 and bfloat16.

On one core of a 2-vCPU Xeon, SmolLM2's shapes: a 400-token RMSNorm takes ~0.6 ms in torch and
its rope ~1 ms in float32; across 30 layers that is a quarter of a prefill. In bfloat16, torch's
SiLU and multiply take ~0.45 ms a layer at 400 rows, its two residual adds ~0.1 ms. Each function here
returns None when it cannot serve its arguments (another device or dtype, a non-contiguous
tensor, no compiler, `PDSERVE_CPU_KERNELS=0`): the caller runs its torch code then. Results
equal torch's but for summation order and SiLU's last float32 bit (the C code rounds bfloat16
where torch's ops do).
"""
from __future__ import annotations

import ctypes
import functools

import torch

from pdserve.kernels.cpu_build import load_build_for

SOURCE_NAME = "cpu_layer_ops.c"
DTYPE_FLAGS = {torch.float32: (), torch.bfloat16: ("-DBFLOAT16",)}
_POINTER, _INT64 = ctypes.c_void_p, ctypes.c_int64


@functools.cache
def load(dtype: torch.dtype) -> ctypes.CDLL | None:
    library = load_build_for(SOURCE_NAME, DTYPE_FLAGS, dtype)
    if library is None:
        return None
    library.rms_norm.argtypes = [_POINTER] * 3 + [_INT64] * 2 + [ctypes.c_float, ctypes.c_int32]
    library.add_rms_norm.argtypes = [_POINTER] * 4 + [_INT64] * 2 + [ctypes.c_float, ctypes.c_int32]
    library.rotary.argtypes = [_POINTER] * 3 + [_INT64] * 5
    library.silu_and_mul.argtypes = [_POINTER] * 2 + [_INT64] * 2
    library.store_kv.argtypes = [_POINTER] * 5 + [_INT64] * 5
    for function in (library.rms_norm, library.add_rms_norm, library.rotary, library.silu_and_mul):
        function.restype = None
    library.store_kv.restype = _INT64
    return library


def _library(*tensors: torch.Tensor) -> ctypes.CDLL | None:
    first = tensors[0]
    if first.device.type != "cpu" or any(t.dtype != first.dtype or not t.is_contiguous() for t in tensors[1:]):
        return None
    return load(first.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, adds_one: bool) -> torch.Tensor | None:
    """x [..., hidden] normalised and scaled by weight [hidden] (Gemma: by 1 + weight)."""
    library = _library(x, weight)
    if library is None or not x.is_contiguous():
        return None
    out = torch.empty_like(x)
    hidden = x.shape[-1]
    library.rms_norm(out.data_ptr(), x.data_ptr(), weight.data_ptr(), x.numel() // hidden, hidden, eps, adds_one)
    return out


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                 adds_one: bool) -> torch.Tensor | None:
    """residual += x in place (x, residual [..., hidden]); returns rms_norm(residual)."""
    library = _library(x, residual, weight)
    if library is None or not x.is_contiguous() or x.shape != residual.shape:
        return None
    out = torch.empty_like(x)
    hidden = x.shape[-1]
    library.add_rms_norm(out.data_ptr(), residual.data_ptr(), x.data_ptr(), weight.data_ptr(), x.numel() // hidden,
                         hidden, eps, adds_one)
    return out


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor | None:
    """gate_up [..., 2 * width], gate then up: silu(gate) * up [..., width]."""
    library = _library(gate_up)
    if library is None or not gate_up.is_contiguous():
        return None
    width = gate_up.shape[-1] // 2
    out = gate_up.new_empty(*gate_up.shape[:-1], width)
    library.silu_and_mul(out.data_ptr(), gate_up.data_ptr(), gate_up.numel() // (2 * width), width)
    return out


def rotary_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor | None:
    """x [num_tokens, num_heads, head_dim], its heads contiguous within a token (a view into the
    fused qkv projection will do), rotated in place by cos, sin [num_tokens, 1, rotary_dim]."""
    library = _library(x, cos, sin)
    num_tokens, num_heads, head_dim = x.shape
    if library is None or x.stride(2) != 1 or x.stride(1) != head_dim:
        return None
    library.rotary(x.data_ptr(), cos.data_ptr(), sin.data_ptr(), num_tokens, x.stride(0), num_heads, head_dim,
                   cos.shape[-1])
    return x


def store_kv(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> bool:
    """`kernels.store_kv` into a float pool of the keys' dtype; False when it cannot serve them
    (nothing written), True once written."""
    library = _library(k_cache, v_cache)
    num_tokens, num_kv_heads, head_dim = key.shape
    if (library is None or not k_cache.is_contiguous() or key.device.type != "cpu"
            or any(x.dtype != k_cache.dtype or x.shape != key.shape or x.stride(2) != 1 or x.stride(1) != head_dim
                   for x in (key, value))
            or k_cache.shape[-2:] != key.shape[1:] or v_cache.shape != k_cache.shape):
        return False
    slot_mapping = slot_mapping.to(torch.int64).contiguous()
    num_slots = k_cache.numel() // (num_kv_heads * head_dim)
    _check_slots(library.store_kv(k_cache.data_ptr(), v_cache.data_ptr(), key.data_ptr(), value.data_ptr(),
                                  slot_mapping.data_ptr(), num_tokens, num_kv_heads * head_dim, key.stride(0),
                                  value.stride(0), num_slots), slot_mapping, num_slots)
    return True


def _check_slots(status: int, slot_mapping: torch.Tensor, num_slots: int) -> None:
    """Raises for store_kv's status naming a token whose slot is outside the pool."""
    if status:
        raise IndexError(f"store_kv: slot {int(slot_mapping[status - 1])} is outside the pool of {num_slots} slots")
