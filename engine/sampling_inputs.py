"""What the sampler reads in a step, packed to travel in the step's two host-to-device copies.

Invariant: sampling copies nothing to the device of its own. `pack_sampling` turns the sampling
rows' params, noise keys, token history and logit_bias into int64 and int32 lists that the runner
appends to the lists of its two `stage` calls (engine/staging.py), floats as their float32 bit
patterns in the int32 list; `PackedSampling.unpack` views the staged tensors back as
`SamplingInputs`, device tensors only. What a batch needs is decided here, on the host, from
params alone: a per-row list that would hold only its no-op value (top_p 1, min_p 0, ...) is sent
empty, so the sampler skips that step by the tensor's shape, which it knows without a sync.

A structured output's rows are packed here like the rest; their token masks are computed while
the forward runs (engine/token_masks.py) and join the inputs after it (`with_disallowed_tokens`):
the one copy of a step that is not staged, made only when some row is constrained.

Positions in the logits ("slots") are flat, `row * vocab_size + token_id`, over the rows of the
sub-batch they index (the adjusted rows, the penalised rows), so each adjustment is one index op.
"""
from __future__ import annotations

import dataclasses
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from pdserve.engine.noise import row_key
from pdserve.protocol.sampling_params import SamplingParams

_INT64_FIELDS = ("random_rows", "row_keys", "top_k", "adjusted_rows", "stop_slots", "bias_slots",
                 "penalised_rows", "output_slots", "prompt_slots", "logprob_rows", "constrained_rows")
_FLOAT32_FIELDS = ("temperature", "top_p", "min_p", "biases", "frequency_penalty", "presence_penalty",
                   "repetition_penalty")
_TOP_P_OFF = 2.0  # a bound no cumulative mass reaches, even with rounding


@dataclass(frozen=True, slots=True)
class SamplingInputs:
    num_logprobs: tuple[int | None, ...]  # [num_rows], host: top logprobs asked for; None: no logprobs
    # Rows drawn at random; the others take the argmax.
    random_rows: torch.Tensor  # [num_random] int64, rows of the batch
    row_keys: torch.Tensor  # [num_random] int64, noise keys of (seed, position) (engine/noise.py)
    temperature: torch.Tensor  # [num_random] float32
    top_k: torch.Tensor  # [num_random] int64 in [1, vocab_size]; empty when no row uses top-k
    top_p: torch.Tensor  # [num_random] float32, _TOP_P_OFF where off; empty when no row uses top-p
    min_p: torch.Tensor  # [num_random] float32; empty when no row uses min-p
    # Logits processors (engine/logits_processors.py), on the sub-batch of the rows they change.
    adjusted_rows: torch.Tensor  # [num_adjusted] int64, rows of the batch
    stop_slots: torch.Tensor  # [num_stops] int64 into [num_adjusted, vocab_size]: min_tokens' -inf
    bias_slots: torch.Tensor  # [num_biases] int64 into [num_adjusted, vocab_size]
    biases: torch.Tensor  # [num_biases] float32
    penalised_rows: torch.Tensor  # [num_penalised] int64, rows of the adjusted sub-batch
    output_slots: torch.Tensor  # [num_output_ids] int64 into [num_penalised, vocab_size], repeats kept
    prompt_slots: torch.Tensor  # [num_prompt_ids] int64 into [num_penalised, vocab_size]; empty as below
    frequency_penalty: torch.Tensor  # [num_penalised] float32
    presence_penalty: torch.Tensor  # [num_penalised] float32
    repetition_penalty: torch.Tensor  # [num_penalised] float32; empty when no row uses one
    logprob_rows: torch.Tensor  # [num_logprob_rows] int64, rows of the batch
    # Structured outputs: the rows with a grammar and, per row, the tokens it forbids now.
    constrained_rows: torch.Tensor  # [num_constrained] int64, rows of the batch
    disallowed_tokens: torch.Tensor  # [num_constrained, vocab_size] bool; empty until with_disallowed_tokens

    @property
    def num_rows(self) -> int:
        return len(self.num_logprobs)


@dataclass(frozen=True, slots=True)
class PackedSampling:
    int64_parts: list[list[int]]  # in _INT64_FIELDS order
    int32_parts: list[list[int]]  # float32 bit patterns, in _FLOAT32_FIELDS order
    num_logprobs: tuple[int | None, ...]  # [num_rows]

    def unpack(self, int64_views: Sequence[torch.Tensor], int32_views: Sequence[torch.Tensor]) -> SamplingInputs:
        """The staged `int64_parts` and `int32_parts`, in their order, as device tensors."""
        return SamplingInputs(
            num_logprobs=self.num_logprobs,
            **dict(zip(_INT64_FIELDS, int64_views, strict=True)),
            **{name: view.view(torch.float32) for name, view in zip(_FLOAT32_FIELDS, int32_views, strict=True)},
            disallowed_tokens=torch.empty(0, 0, dtype=torch.bool, device=int64_views[0].device),
        )


def with_disallowed_tokens(inputs: SamplingInputs, disallowed: torch.Tensor) -> SamplingInputs:
    """`inputs` with the constrained rows' masks ([num_constrained, vocab_size] bool, on the host)."""
    return dataclasses.replace(inputs, disallowed_tokens=disallowed.to(inputs.constrained_rows.device))


def pack_sampling(
    params: Sequence[SamplingParams],
    seeds: Sequence[int],
    positions: Sequence[int],
    vocab_size: int,
    prompt_token_ids: Sequence[Sequence[int]] | None = None,
    output_token_ids: Sequence[Sequence[int]] | None = None,
    eos_token_id: int | None = None,
) -> PackedSampling:
    """Row i samples with params[i], effective seed seeds[i], at absolute position positions[i]
    (prompt then output). prompt_token_ids[i] and output_token_ids[i] are its tokens so far; they
    are required when some row's params adjust its logits (penalties, min_tokens, logit_bias), as
    is the EOS that min_tokens masks."""
    if not len(params) == len(seeds) == len(positions):
        raise ValueError(f"got {len(params)} params, {len(seeds)} seeds, {len(positions)} positions")
    ints: dict[str, list[int]] = {}
    floats: dict[str, list[float]] = {}
    _pack_random_rows(ints, floats, params, seeds, positions, vocab_size)
    if any(p.adjusts_logits for p in params) and (prompt_token_ids is None or output_token_ids is None):
        raise ValueError("penalties, min_tokens and logit_bias need prompt_token_ids and output_token_ids")
    _pack_adjustments(ints, floats, params, prompt_token_ids, output_token_ids, eos_token_id, vocab_size)
    ints["logprob_rows"] = [i for i, p in enumerate(params) if p.logprobs is not None]
    ints["constrained_rows"] = [i for i, p in enumerate(params) if p.structured_output is not None]
    return PackedSampling(
        int64_parts=[ints[name] for name in _INT64_FIELDS],
        int32_parts=[_float32_bits(floats[name]) for name in _FLOAT32_FIELDS],
        num_logprobs=tuple(p.logprobs for p in params),
    )


def _pack_random_rows(ints: dict[str, list[int]], floats: dict[str, list[float]], params: Sequence[SamplingParams],
                      seeds: Sequence[int], positions: Sequence[int], vocab_size: int) -> None:
    rows = [i for i, p in enumerate(params) if not p.is_greedy]
    chosen = [params[i] for i in rows]
    ints["random_rows"] = rows
    ints["row_keys"] = [row_key(seeds[i], positions[i]) for i in rows]
    ints["top_k"] = _unless_all([min(p.top_k or vocab_size, vocab_size) for p in chosen], vocab_size)
    floats["temperature"] = [p.temperature for p in chosen]
    floats["top_p"] = _unless_all([p.top_p if p.top_p < 1.0 else _TOP_P_OFF for p in chosen], _TOP_P_OFF)
    floats["min_p"] = _unless_all([p.min_p for p in chosen], 0.0)


def _pack_adjustments(ints: dict[str, list[int]], floats: dict[str, list[float]],
                      params: Sequence[SamplingParams], prompts: Sequence[Sequence[int]] | None,
                      outputs: Sequence[Sequence[int]] | None, eos_token_id: int | None, vocab_size: int) -> None:
    rows = [i for i, p in enumerate(params) if p.adjusts_logits]
    stop_slots, bias_slots, biases = [], [], []
    for j, i in enumerate(rows):
        p, base = params[i], j * vocab_size
        if len(outputs[i]) < p.min_tokens:
            stops = set(p.stop_token_ids)
            if eos_token_id is not None and not p.ignore_eos:
                stops.add(eos_token_id)
            stop_slots += [base + token_id for token_id in sorted(stops) if token_id < vocab_size]  # others never drawn
        bias_slots += [base + token_id for token_id, _ in p.logit_bias]  # ids checked on admission
        biases += [bias for _, bias in p.logit_bias]
    penalised = [j for j, i in enumerate(rows) if params[i].uses_penalties]
    repetition = _unless_all([params[rows[j]].repetition_penalty for j in penalised], 1.0)
    output_slots, prompt_slots = [], []
    for k, j in enumerate(penalised):
        base = k * vocab_size
        output_slots += [base + token_id for token_id in outputs[rows[j]]]
        if repetition:
            prompt_slots += [base + token_id for token_id in prompts[rows[j]]]
    ints.update(adjusted_rows=rows, stop_slots=stop_slots, bias_slots=bias_slots, penalised_rows=penalised,
                output_slots=output_slots, prompt_slots=prompt_slots)
    floats.update(biases=biases, repetition_penalty=repetition,
                  frequency_penalty=[params[rows[j]].frequency_penalty for j in penalised],
                  presence_penalty=[params[rows[j]].presence_penalty for j in penalised])


def _unless_all(values: list, no_op: object) -> list:
    """`values`, or [] when every one is the no-op value: no row needs that step."""
    return values if any(value != no_op for value in values) else []


def _float32_bits(values: list[float]) -> list[int]:
    """Each value rounded to float32, as the int32 with its bits."""
    return array("i", array("f", values).tobytes()).tolist()
