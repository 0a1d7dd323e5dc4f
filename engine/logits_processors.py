"""The per-request changes to the raw logits that come before temperature, as in vLLM's sampler.

In order, for a row whose request has `output_token_ids` after `prompt_token_ids`:
1. min_tokens: while fewer than `min_tokens` output tokens exist, EOS (unless `ignore_eos`) and
   every `stop_token_ids` entry get -inf, so the output cannot end early;
2. logit_bias: each listed token's bias is added to its logit;
3. repetition_penalty p, over prompt and output tokens: a seen token's logit l becomes l / p if
   l > 0, else l * p;
4. frequency and presence penalties, over output tokens only: l -= frequency * count, then
   l -= presence * (count > 0);
5. structured output: every token its grammar does not allow now gets -inf (the row's token
   mask, engine/token_masks.py). Last, so no bias can bring back a token the grammar forbids.

Invariant: a row's result depends only on its own logits, params and tokens so far, never on the
other rows, so it is the same for a request alone, in any batch, recomputed after a preemption,
or with its first token sampled by prefill and the rest by decode.

Batched, on device tensors only (engine/sampling_inputs.py packs what each step reads): one
index op per adjustment over the adjusted rows, and for the penalised rows among them one
[num_penalised, vocab_size] count tensor (index_add over the output ids) and, when some row has
a repetition penalty, one prompt-presence mask. Rows that change nothing are left alone, and a
batch in which no request changes anything returns its logits untouched, so the plain path pays
nothing.
"""
import torch

from pdserve.engine.sampling_inputs import SamplingInputs


def apply_logits_processors(logits: torch.Tensor, inputs: SamplingInputs) -> torch.Tensor:
    """logits: [num_rows, vocab_size] float32 -> the processed logits, a new tensor when any row
    changes (the input is never modified, so its raw values stay available for logprobs)."""
    if inputs.adjusted_rows.numel():
        logits = _adjust(logits, inputs)
    if inputs.constrained_rows.numel():
        logits = _mask_disallowed(logits, inputs)
    return logits


def _adjust(logits: torch.Tensor, inputs: SamplingInputs) -> torch.Tensor:
    """Steps 1-4 on the adjusted rows; a new tensor."""
    z = logits[inputs.adjusted_rows]  # [num_adjusted, vocab_size], a copy
    slots = z.view(-1)  # [num_adjusted * vocab_size]
    if inputs.stop_slots.numel():
        slots.index_fill_(0, inputs.stop_slots, float("-inf"))
    if inputs.bias_slots.numel():
        slots.index_add_(0, inputs.bias_slots, inputs.biases)  # one bias per (row, token)
    if inputs.penalised_rows.numel():
        z.index_copy_(0, inputs.penalised_rows, _apply_penalties(z[inputs.penalised_rows], inputs))
    return logits.index_copy(0, inputs.adjusted_rows, z)


def _mask_disallowed(logits: torch.Tensor, inputs: SamplingInputs) -> torch.Tensor:
    """Step 5 on the constrained rows; a new tensor."""
    rows = inputs.constrained_rows
    masked = torch.where(inputs.disallowed_tokens, float("-inf"), logits[rows])  # [num_constrained, vocab_size]
    return logits.index_copy(0, rows, masked)


def _apply_penalties(z: torch.Tensor, inputs: SamplingInputs) -> torch.Tensor:
    """z: [num_penalised, vocab_size] float32 -> penalised logits, same shape."""
    counts = _token_counts(inputs.output_slots, z.shape)  # [num_penalised, vocab_size] float32
    seen_in_output = counts > 0  # [num_penalised, vocab_size]
    if inputs.repetition_penalty.numel():
        seen = seen_in_output | (_token_counts(inputs.prompt_slots, z.shape) > 0)  # [num_penalised, vocab_size]
        penalty = torch.where(seen, inputs.repetition_penalty[:, None], 1.0)  # [num_penalised, vocab_size]
        z = torch.where(z > 0, z / penalty, z * penalty)
    z = z - inputs.frequency_penalty[:, None] * counts
    return z - inputs.presence_penalty[:, None] * seen_in_output


def _token_counts(slots: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """slots: [num_ids] int64, row * vocab_size + token id -> how often each token occurs in each
    row, `shape` ([num_rows, vocab_size]) float32."""
    counts = torch.zeros(shape.numel(), device=slots.device)  # [num_rows * vocab_size]
    counts.index_add_(0, slots, torch.ones_like(slots, dtype=counts.dtype))
    return counts.view(shape)
