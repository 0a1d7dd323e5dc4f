"""Exp(1) noise for the sampler's exponential race, a pure function of (seed, position, token id).

The noise comes from a counter-based hash, not a stateful generator: splitmix64's stream keyed by
(seed, position) and indexed by token id. The key is mixed on the host (`row_key`, Python ints)
and travels with the step's other inputs; the stream is evaluated with int64 tensor ops on the
logits' device. Integer hashing is exact on every device, so CPU and GPU replicas see the same
noise bits; only the final float32 `log` may differ by an ulp across devices, which matters
solely for near-exact ties between candidate scores.
"""
import torch

_MASK64 = (1 << 64) - 1
_GOLDEN_GAMMA = 0x9E3779B97F4A7C15  # splitmix64's stream increment
_MIX_MUL_1 = 0xBF58476D1CE4E5B9
_MIX_MUL_2 = 0x94D049BB133111EB
_UNIFORM_BITS = 23  # (k + 0.5) / 2**23 for k < 2**23 is exact in float32 and lies in (0, 1)


def row_key(seed: int, position: int) -> int:
    """Well-mixed 64-bit key of (seed, position), as the int64 with its bits; the seed is taken
    modulo 2**64."""
    return _signed64(_mix64((_mix64(seed & _MASK64) + (position + 1) * _GOLDEN_GAMMA) & _MASK64))


def exponential_noise(row_keys: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """row_keys: [num_rows] int64 (`row_key`s) -> Exp(1) noise [num_rows, vocab_size] float32,
    on the keys' device."""
    token_ids = torch.arange(1, vocab_size + 1, dtype=torch.int64, device=row_keys.device)  # [vocab_size]
    state = row_keys[:, None] + token_ids[None, :] * _signed64(_GOLDEN_GAMMA)  # [num_rows, vocab_size]
    bits = _shift_right(_mix64_tensor(state), 64 - _UNIFORM_BITS)  # [num_rows, vocab_size]
    uniform = (bits.float() + 0.5) / (1 << _UNIFORM_BITS)  # (0, 1)
    return -torch.log(uniform)


def _mix64(z: int) -> int:
    """splitmix64's output function on a 64-bit unsigned Python int."""
    z = ((z ^ (z >> 30)) * _MIX_MUL_1) & _MASK64
    z = ((z ^ (z >> 27)) * _MIX_MUL_2) & _MASK64
    return z ^ (z >> 31)


def _mix64_tensor(z: torch.Tensor) -> torch.Tensor:
    """`_mix64` on int64 tensors, whose multiplication wraps modulo 2**64 like uint64's."""
    z = (z ^ _shift_right(z, 30)) * _signed64(_MIX_MUL_1)
    z = (z ^ _shift_right(z, 27)) * _signed64(_MIX_MUL_2)
    return z ^ _shift_right(z, 31)


def _shift_right(z: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 bit patterns (torch's >> is arithmetic on signed ints)."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def _signed64(z: int) -> int:
    """The int64 with the same bit pattern as the uint64 z."""
    return z - (1 << 64) if z >= 1 << 63 else z
