"""Token sampling as a pure function of (request seed, token position, logits row, tokens so far).

Invariant: the token drawn for a row depends only on that row's logits, its `SamplingParams`,
its effective seed, the absolute position of the token being sampled and its prompt and output
tokens so far (which only penalties and min_tokens read). No generator state is
carried between steps or shared between rows, so a request yields the same tokens whatever else
is in the batch, whether prefill sampled its first token and decode the rest, and after it was
preempted and recomputed or moved to another replica.

The logits are first processed per request as vLLM does (min_tokens, logit_bias, repetition,
frequency and presence penalties; `engine/logits_processors.py`). Greedy rows then take the argmax
(ties go to the lowest id). Random rows go on as in vLLM: temperature, then top-k, top-p and
min-p masking, then one draw by the exponential race: with E_i ~ Exp(1) independent,
argmax_i p_i / E_i is i with probability p_i. It is computed in log space, argmax_i (z_i - log E_i)
over the processed logits z (the softmax normaliser is a per-row constant and drops out), so
masked tokens (z = -inf) are never drawn.

The noise E_i comes from a counter-based hash, not a stateful generator: splitmix64's stream
keyed by (seed, position) and indexed by token id, evaluated with int64 tensor ops on the logits'
device. Integer hashing is exact on every device, so CPU and GPU replicas see the same noise bits;
only the final float32 `log` may differ by an ulp across devices, which matters solely for
near-exact ties between candidate scores.

Logprobs, when asked for, are of the raw model distribution (log_softmax of the unprocessed
logits, as vLLM reports by default), not of the penalised, biased, temperature-scaled or masked
one: a penalty changes which token is drawn, not the logprobs reported for the candidates.
"""
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.logits_processors import apply_logits_processors
from engine.outputs import TokenLogprobs
from engine.sampling_params import SamplingParams

_MASK64 = (1 << 64) - 1
_GOLDEN_GAMMA = 0x9E3779B97F4A7C15  # splitmix64's stream increment
_MIX_MUL_1 = 0xBF58476D1CE4E5B9
_MIX_MUL_2 = 0x94D049BB133111EB
_UNIFORM_BITS = 23  # (k + 0.5) / 2**23 for k < 2**23 is exact in float32 and lies in (0, 1)


@dataclass(frozen=True, slots=True)
class SamplerOutput:
    token_ids: list[int]  # [num_seqs]
    logprobs: list[TokenLogprobs | None]  # [num_seqs]; None where params.logprobs is None


def sample(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    seeds: Sequence[int],
    positions: Sequence[int],
    *,
    prompt_token_ids: Sequence[Sequence[int]] | None = None,
    output_token_ids: Sequence[Sequence[int]] | None = None,
    eos_token_id: int | None = None,
) -> SamplerOutput:
    """Sample one token per row of `logits` ([num_seqs, vocab_size], any float dtype).

    seeds[i] is row i's effective seed; positions[i] is the absolute index, in the row's full
    sequence (prompt then output), of the token being sampled. prompt_token_ids[i] and
    output_token_ids[i] are row i's tokens so far; they are required when some row's params
    adjust its logits (penalties, min_tokens, logit_bias), as is the EOS that min_tokens masks.
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be [num_seqs, vocab_size], got shape {tuple(logits.shape)}")
    num_seqs = logits.shape[0]
    if not len(params) == len(seeds) == len(positions) == num_seqs:
        raise ValueError(
            f"got {num_seqs} logits rows but {len(params)} params, {len(seeds)} seeds, "
            f"{len(positions)} positions"
        )
    logits = logits.float()  # [num_seqs, vocab_size], raw
    processed = logits
    if any(p.adjusts_logits for p in params):
        if prompt_token_ids is None or output_token_ids is None:
            raise ValueError("penalties, min_tokens and logit_bias need prompt_token_ids and output_token_ids")
        processed = apply_logits_processors(logits, params, prompt_token_ids, output_token_ids, eos_token_id)
    token_ids = processed.argmax(dim=-1)  # [num_seqs]
    random_rows = [i for i, p in enumerate(params) if not p.is_greedy]
    if random_rows:
        rows = torch.tensor(random_rows, device=logits.device)  # [num_random]
        token_ids[rows] = _sample_random(
            processed[rows],
            [params[i] for i in random_rows],
            [seeds[i] for i in random_rows],
            [positions[i] for i in random_rows],
        )
    return SamplerOutput(token_ids=token_ids.tolist(), logprobs=_logprobs(logits, params, token_ids))


def exponential_noise(
    seeds: Sequence[int], positions: Sequence[int], vocab_size: int, device: torch.device | str
) -> torch.Tensor:
    """Exp(1) noise, [len(seeds), vocab_size] float32, a pure function of (seed, position, token id)."""
    keys = [_signed64(_row_key(seed, position)) for seed, position in zip(seeds, positions)]
    key = torch.tensor(keys, dtype=torch.int64, device=device)  # [num_rows]
    token_ids = torch.arange(1, vocab_size + 1, dtype=torch.int64, device=device)  # [vocab_size]
    state = key[:, None] + token_ids[None, :] * _signed64(_GOLDEN_GAMMA)  # [num_rows, vocab_size]
    bits = _shift_right(_mix64_tensor(state), 64 - _UNIFORM_BITS)  # [num_rows, vocab_size]
    uniform = (bits.float() + 0.5) / (1 << _UNIFORM_BITS)  # (0, 1)
    return -torch.log(uniform)


def _sample_random(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    seeds: Sequence[int],
    positions: Sequence[int],
) -> torch.Tensor:
    """logits: [num_rows, vocab_size] float32 -> token ids [num_rows]."""
    vocab_size = logits.shape[1]
    device = logits.device
    temperature = torch.tensor([p.temperature for p in params], device=device)  # [num_rows]
    z = logits / temperature[:, None]  # [num_rows, vocab_size]
    z = _mask_top_k_top_p(z, params)
    z = _mask_min_p(z, params)
    noise = exponential_noise(seeds, positions, vocab_size, device)  # [num_rows, vocab_size]
    return (z - noise.log()).argmax(dim=-1)


def _mask_top_k_top_p(z: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """Set to -inf every logit outside the row's top-k, then outside its top-p nucleus.

    Top-k keeps ties with the k-th value. Top-p keeps the shortest most-likely-first prefix whose
    mass reaches p (a token is kept while the mass strictly before it is below p), computed on
    the distribution left after top-k; the most likely token always survives.
    """
    vocab_size = z.shape[1]
    use_top_k = any(p.top_k is not None for p in params)
    use_top_p = any(p.top_p < 1.0 for p in params)
    if not (use_top_k or use_top_p):
        return z
    sorted_z, order = z.sort(dim=-1, descending=True, stable=True)  # [num_rows, vocab_size] each
    if use_top_k:
        k = [vocab_size if p.top_k is None else min(p.top_k, vocab_size) for p in params]
        kth_index = torch.tensor(k, device=z.device)[:, None] - 1  # [num_rows, 1]
        kth_value = sorted_z.gather(1, kth_index)  # [num_rows, 1]
        sorted_z = sorted_z.masked_fill(sorted_z < kth_value, float("-inf"))
    if use_top_p:
        # Rows without top-p get a bound no cumulative mass reaches, even with rounding.
        top_p = torch.tensor([p.top_p if p.top_p < 1.0 else 2.0 for p in params], device=z.device)
        probs = sorted_z.softmax(dim=-1)  # [num_rows, vocab_size]
        mass_before = probs.cumsum(dim=-1) - probs  # [num_rows, vocab_size]
        sorted_z = sorted_z.masked_fill(mass_before >= top_p[:, None], float("-inf"))
    return torch.empty_like(z).scatter_(1, order, sorted_z)


def _mask_min_p(z: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """Set to -inf every logit whose probability is below min_p times the row's top probability."""
    if all(p.min_p == 0.0 for p in params):
        return z
    min_p = torch.tensor([p.min_p for p in params], device=z.device)  # [num_rows]
    # p_i < min_p * p_max  <=>  z_i - z_max < log(min_p); log(0) = -inf keeps everything.
    threshold = z.amax(dim=-1, keepdim=True) + min_p.log()[:, None]  # [num_rows, 1]
    return z.masked_fill(z < threshold, float("-inf"))


def _logprobs(
    logits: torch.Tensor, params: Sequence[SamplingParams], token_ids: torch.Tensor
) -> list[TokenLogprobs | None]:
    """logits: [num_seqs, vocab_size] float32 (raw); token_ids: [num_seqs] sampled ids."""
    result: list[TokenLogprobs | None] = [None] * len(params)
    rows = [i for i, p in enumerate(params) if p.logprobs is not None]
    if not rows:
        return result
    index = torch.tensor(rows, device=logits.device)  # [num_rows]
    logprobs = logits[index].log_softmax(dim=-1)  # [num_rows, vocab_size]
    sampled_ids = token_ids[index]  # [num_rows]
    sampled = logprobs.gather(1, sampled_ids[:, None]).squeeze(1)  # [num_rows]
    num_top = min(max(params[i].logprobs for i in rows), logprobs.shape[1])
    top_values, top_ids = logprobs.topk(num_top, dim=-1, sorted=True)  # [num_rows, num_top] each
    sampled_id_list, sampled_list = sampled_ids.tolist(), sampled.tolist()
    top_id_lists, top_value_lists = top_ids.tolist(), top_values.tolist()
    for j, i in enumerate(rows):
        n = params[i].logprobs
        result[i] = TokenLogprobs(
            token_id=sampled_id_list[j],
            logprob=sampled_list[j],
            top_ids=tuple(top_id_lists[j][:n]),
            top_logprobs=tuple(top_value_lists[j][:n]),
        )
    return result


def _row_key(seed: int, position: int) -> int:
    """Well-mixed 64-bit key of (seed, position); the seed is taken modulo 2**64."""
    return _mix64((_mix64(seed & _MASK64) + (position + 1) * _GOLDEN_GAMMA) & _MASK64)


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
