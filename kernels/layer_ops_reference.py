"""Pure-torch layer ops: the specification the compiled CPU ops (kernels/cpu_layer_ops.py) are
tested against, and what runs wherever those do not serve (CUDA included, on torch's kernels).

Rounding follows Hugging Face: RMSNorm normalises in fp32 (one fused op), then Llama rounds back
and scales by w, Gemma scales by (1 + w) in fp32 and rounds last. Rope is rotate-half (Llama,
Qwen, Mistral, Phi-3, Gemma): with cos, sin [num_tokens, 1, rotary_dim] the first rotary_dim of
each head rotate and the rest pass through. Gated activations take gate_up [..., 2 * width],
gate then up, and return act(gate) * up [..., width].
"""
import torch
import torch.nn.functional as F


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float, adds_one: bool) -> torch.Tensor:
    normalized = F.rms_norm(x.float(), weight.shape, eps=eps)
    if adds_one:
        return (normalized * (1.0 + weight.float())).to(x.dtype)
    return weight * normalized.to(x.dtype)


def add_rms_norm_reference(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                           adds_one: bool) -> tuple[torch.Tensor, torch.Tensor]:
    summed = residual + x
    return rms_norm_reference(summed, weight, eps, adds_one), summed


def silu_and_mul_reference(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def gelu_tanh_and_mul_reference(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up


def rope_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [num_tokens, num_heads, head_dim]; cos, sin: [num_tokens, 1, rotary_dim]
    rotary_dim = cos.shape[-1]
    if rotary_dim == x.shape[-1]:
        return x * cos + _rotate_half(x) * sin
    rotated, passed = x[..., :rotary_dim], x[..., rotary_dim:]
    return torch.cat((rotated * cos + _rotate_half(rotated) * sin, passed), dim=-1)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
