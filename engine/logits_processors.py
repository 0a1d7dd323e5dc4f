"""The per-request changes to the raw logits that come before temperature, as in vLLM's sampler.

In order, for a row whose request has `output_token_ids` after `prompt_token_ids`:
1. min_tokens: while fewer than `min_tokens` output tokens exist, EOS (unless `ignore_eos`) and
   every `stop_token_ids` entry get -inf, so the output cannot end early;
2. logit_bias: each listed token's bias is added to its logit;
3. repetition_penalty p, over prompt and output tokens: a seen token's logit l becomes l / p if
   l > 0, else l * p;
4. frequency and presence penalties, over output tokens only: l -= frequency * count, then
   l -= presence * (count > 0).

Invariant: a row's result depends only on its own logits, params and tokens so far, never on the
other rows, so it is the same for a request alone, in any batch, recomputed after a preemption,
or with its first token sampled by prefill and the rest by decode.

Batched: each step builds one [num_rows, vocab_size] count tensor (scatter_add over the padded
output ids) and one prompt-presence mask, for the rows that use penalties only, and only the
tensors some row needs. Rows that change nothing are left alone, and a batch in which no request
changes anything returns its logits untouched, so the plain path pays nothing.
"""
from collections.abc import Sequence

import torch

from engine.sampling_params import SamplingParams


def apply_logits_processors(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    prompt_token_ids: Sequence[Sequence[int]],
    output_token_ids: Sequence[Sequence[int]],
    eos_token_id: int | None,
) -> torch.Tensor:
    """logits: [num_seqs, vocab_size] float32 -> the processed logits, a new tensor when any row
    changes (the input is never modified, so its raw values stay available for logprobs)."""
    rows = [i for i, p in enumerate(params) if p.adjusts_logits]
    if not rows:
        return logits
    index = torch.tensor(rows, device=logits.device)  # [num_rows]
    row_params = [params[i] for i in rows]
    outputs = [output_token_ids[i] for i in rows]
    z = logits[index]  # [num_rows, vocab_size], a copy
    _mask_stops_before_min_tokens(z, row_params, outputs, eos_token_id)
    _add_logit_bias(z, row_params)
    penalised = [j for j, p in enumerate(row_params) if p.uses_penalties]
    if penalised:
        sub = torch.tensor(penalised, device=logits.device)  # [num_penalised]
        z[sub] = _apply_penalties(
            z[sub],
            [row_params[j] for j in penalised],
            [prompt_token_ids[rows[j]] for j in penalised],
            [outputs[j] for j in penalised],
        )
    return logits.index_copy(0, index, z)


def _mask_stops_before_min_tokens(
    z: torch.Tensor, params: Sequence[SamplingParams], outputs: Sequence[Sequence[int]],
    eos_token_id: int | None,
) -> None:
    """In place on z [num_rows, vocab_size]."""
    vocab_size = z.shape[1]
    row_ids: list[int] = []
    token_ids: list[int] = []
    for row, (p, output) in enumerate(zip(params, outputs)):
        if len(output) >= p.min_tokens:
            continue
        stops = set(p.stop_token_ids)
        if eos_token_id is not None and not p.ignore_eos:
            stops.add(eos_token_id)
        stops = sorted(token_id for token_id in stops if token_id < vocab_size)  # others never drawn
        row_ids += [row] * len(stops)
        token_ids += stops
    if token_ids:
        z[torch.tensor(row_ids, device=z.device), torch.tensor(token_ids, device=z.device)] = float("-inf")


def _add_logit_bias(z: torch.Tensor, params: Sequence[SamplingParams]) -> None:
    """In place on z [num_rows, vocab_size]; ids were checked against the vocabulary on admission."""
    row_ids = [row for row, p in enumerate(params) for _ in p.logit_bias]
    if not row_ids:
        return
    token_ids = [token_id for p in params for token_id, _ in p.logit_bias]
    biases = [bias for p in params for _, bias in p.logit_bias]
    device = z.device
    z.index_put_((torch.tensor(row_ids, device=device), torch.tensor(token_ids, device=device)),
                 torch.tensor(biases, dtype=z.dtype, device=device), accumulate=True)


def _apply_penalties(
    z: torch.Tensor, params: Sequence[SamplingParams], prompts: Sequence[Sequence[int]],
    outputs: Sequence[Sequence[int]],
) -> torch.Tensor:
    """z: [num_rows, vocab_size] float32 -> penalised logits, same shape."""
    num_rows, vocab_size = z.shape
    device = z.device
    counts = _token_counts(outputs, vocab_size, device)  # [num_rows, vocab_size] float32
    seen_in_output = counts > 0  # [num_rows, vocab_size]
    if any(p.repetition_penalty != 1 for p in params):
        repetition = torch.tensor([p.repetition_penalty for p in params], device=device)  # [num_rows]
        seen = seen_in_output | (_token_counts(prompts, vocab_size, device) > 0)  # [num_rows, vocab_size]
        penalty = torch.where(seen, repetition[:, None], 1.0)  # [num_rows, vocab_size]
        z = torch.where(z > 0, z / penalty, z * penalty)
    frequency = torch.tensor([p.frequency_penalty for p in params], device=device)  # [num_rows]
    presence = torch.tensor([p.presence_penalty for p in params], device=device)  # [num_rows]
    z = z - frequency[:, None] * counts
    return z - presence[:, None] * seen_in_output


def _token_counts(token_ids: Sequence[Sequence[int]], vocab_size: int, device: torch.device) -> torch.Tensor:
    """How often each token occurs in each row's ids: [len(token_ids), vocab_size] float32.

    Rows are padded with the out-of-range id vocab_size, counted in an extra column then dropped.
    """
    width = max(len(ids) for ids in token_ids)
    padded = [list(ids) + [vocab_size] * (width - len(ids)) for ids in token_ids]
    index = torch.tensor(padded, dtype=torch.int64, device=device).view(len(token_ids), width)
    counts = torch.zeros(len(token_ids), vocab_size + 1, device=device)
    counts.scatter_add_(1, index, torch.ones_like(index, dtype=counts.dtype))
    return counts[:, :vocab_size]
