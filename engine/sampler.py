"""Token sampling as a pure function of (request seed, token position, logits row, tokens so far).

Invariant: the token drawn for a row depends only on that row's logits, its `SamplingParams`,
its effective seed, the absolute position of the token being sampled and its prompt and output
tokens so far (which only penalties and min_tokens read). No generator state is
carried between steps or shared between rows, so a request yields the same tokens whatever else
is in the batch, whether prefill sampled its first token and decode the rest, and after it was
preempted and recomputed or moved to another replica.

Device traffic: `sample` reads only device tensors (the logits and `SamplingInputs`, which came
to the device inside the step's two staged copies, engine/sampling_inputs.py) and reads back
once: the token ids and any logprobs, packed into one float64 tensor (exact for both), whatever
the rows' sampling params.

The logits are first processed per request as vLLM does (min_tokens, logit_bias, repetition,
frequency and presence penalties; `engine/logits_processors.py`). Greedy rows then take the argmax
(ties go to the lowest id). Random rows go on as in vLLM: temperature, then top-k, top-p and
min-p masking, then one draw by the exponential race: with E_i ~ Exp(1) independent,
argmax_i p_i / E_i is i with probability p_i. It is computed in log space, argmax_i (z_i - log E_i)
over the processed logits z (the softmax normaliser is a per-row constant and drops out), so
masked tokens (z = -inf) are never drawn. The noise E_i is a counter-based hash of (seed,
position, token id) (`engine/noise.py`).

Logprobs, when asked for, are of the raw model distribution (log_softmax of the unprocessed
logits, as vLLM reports by default), not of the penalised, biased, temperature-scaled or masked
one: a penalty changes which token is drawn, not the logprobs reported for the candidates.
"""
from dataclasses import dataclass

import torch

from pdserve.engine.logits_processors import apply_logits_processors
from pdserve.engine.noise import exponential_noise
from pdserve.engine.sampling_inputs import SamplingInputs
from pdserve.protocol.outputs import TokenLogprobs


@dataclass(frozen=True, slots=True)
class SamplerOutput:
    token_ids: list[int]  # [num_rows]
    logprobs: list[TokenLogprobs | None]  # [num_rows]; None where params.logprobs is None


def sample(logits: torch.Tensor, inputs: SamplingInputs) -> SamplerOutput:
    """Sample one token per row of `logits` ([num_rows, vocab_size], any float dtype)."""
    if logits.dim() != 2 or logits.shape[0] != inputs.num_rows:
        raise ValueError(f"logits must be [{inputs.num_rows}, vocab_size], got shape {tuple(logits.shape)}")
    logits = logits.float()  # [num_rows, vocab_size], raw
    processed = apply_logits_processors(logits, inputs)  # [num_rows, vocab_size]
    token_ids = processed.argmax(dim=-1)  # [num_rows]
    if inputs.random_rows.numel():
        token_ids.index_copy_(0, inputs.random_rows, _sample_random(processed[inputs.random_rows], inputs))
    return _read_back(logits, token_ids, inputs)


def _sample_random(logits: torch.Tensor, inputs: SamplingInputs) -> torch.Tensor:
    """logits: [num_random, vocab_size] float32 -> token ids [num_random]."""
    z = logits / inputs.temperature[:, None]  # [num_random, vocab_size]
    z = _mask_top_k_top_p(z, inputs.top_k, inputs.top_p)
    z = _mask_min_p(z, inputs.min_p)
    noise = exponential_noise(inputs.row_keys, logits.shape[1])  # [num_random, vocab_size]
    return (z - noise.log()).argmax(dim=-1)


def _mask_top_k_top_p(z: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Set to -inf every logit outside the row's top-k, then outside its top-p nucleus.

    Top-k keeps ties with the k-th value. Top-p keeps the shortest most-likely-first prefix whose
    mass reaches p (a token is kept while the mass strictly before it is below p), computed on
    the distribution left after top-k; the most likely token always survives. An empty `top_k`
    or `top_p` ([0] instead of [num_random]) means no row uses it.
    """
    if not (top_k.numel() or top_p.numel()):
        return z
    sorted_z, order = z.sort(dim=-1, descending=True, stable=True)  # [num_random, vocab_size] each
    if top_k.numel():
        kth_value = sorted_z.gather(1, top_k[:, None] - 1)  # [num_random, 1]
        sorted_z = sorted_z.masked_fill(sorted_z < kth_value, float("-inf"))
    if top_p.numel():
        probs = sorted_z.softmax(dim=-1)  # [num_random, vocab_size]
        mass_before = probs.cumsum(dim=-1) - probs  # [num_random, vocab_size]
        sorted_z = sorted_z.masked_fill(mass_before >= top_p[:, None], float("-inf"))
    return torch.empty_like(z).scatter_(1, order, sorted_z)


def _mask_min_p(z: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Set to -inf every logit whose probability is below min_p times the row's top probability;
    an empty `min_p` means no row uses it."""
    if not min_p.numel():
        return z
    # p_i < min_p * p_max  <=>  z_i - z_max < log(min_p); log(0) = -inf keeps everything.
    threshold = z.amax(dim=-1, keepdim=True) + min_p.log()[:, None]  # [num_random, 1]
    return z.masked_fill(z < threshold, float("-inf"))


def _read_back(logits: torch.Tensor, token_ids: torch.Tensor, inputs: SamplingInputs) -> SamplerOutput:
    """The step's one device-to-host readback: token ids, then for the logprob rows the sampled
    token's logprob, the top ids and the top logprobs, in one float64 tensor.

    logits: [num_rows, vocab_size] float32 (raw); token_ids: [num_rows] sampled ids."""
    rows = [i for i, n in enumerate(inputs.num_logprobs) if n is not None]
    num_top = min(max((inputs.num_logprobs[i] for i in rows), default=0), logits.shape[1])
    parts = [token_ids]
    if rows:
        logprobs = logits[inputs.logprob_rows].log_softmax(dim=-1)  # [num_logprob_rows, vocab_size]
        sampled = logprobs.gather(1, token_ids[inputs.logprob_rows][:, None])  # [num_logprob_rows, 1]
        top_values, top_ids = logprobs.topk(num_top, dim=-1, sorted=True)  # [num_logprob_rows, num_top] each
        parts += [sampled.flatten(), top_ids.flatten(), top_values.flatten()]
    values = torch.cat([part.double() for part in parts]).tolist()
    num_rows, num_logprob_rows = inputs.num_rows, len(rows)
    sampled_values = values[num_rows:num_rows + num_logprob_rows]  # [num_logprob_rows]
    top = num_rows + num_logprob_rows
    top_id_values = values[top:top + num_logprob_rows * num_top]  # [num_logprob_rows * num_top]
    top_logprob_values = values[top + num_logprob_rows * num_top:]  # [num_logprob_rows * num_top]
    token_id_list = [int(value) for value in values[:num_rows]]
    logprobs_list: list[TokenLogprobs | None] = [None] * num_rows
    for j, i in enumerate(rows):
        start, n = j * num_top, min(inputs.num_logprobs[i], num_top)
        logprobs_list[i] = TokenLogprobs(
            token_id=token_id_list[i],
            logprob=sampled_values[j],
            top_ids=tuple(int(value) for value in top_id_values[start:start + n]),
            top_logprobs=tuple(top_logprob_values[start:start + n]),
        )
    return SamplerOutput(token_ids=token_id_list, logprobs=logprobs_list)
