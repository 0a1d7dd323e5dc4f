"""The sampler driven from Python lists the way the runner drives it: packed, staged (on CPU)
and sampled, so the tests exercise the one code path there is."""
from collections.abc import Sequence

import torch

from pdserve.engine import sampler
from pdserve.engine.sampling_inputs import SamplingInputs, pack_sampling, with_disallowed_tokens
from pdserve.protocol.sampling_params import SamplingParams
from pdserve.engine.staging import stage
from pdserve.engine.token_masks import disallowed_tokens

CPU = torch.device("cpu")


def staged_inputs(params: Sequence[SamplingParams], seeds: Sequence[int], positions: Sequence[int], vocab_size: int,
                  prompt_token_ids: Sequence[Sequence[int]] | None = None,
                  output_token_ids: Sequence[Sequence[int]] | None = None,
                  eos_token_id: int | None = None, token_bitmasks: Sequence[bytes] = ()) -> SamplingInputs:
    """`token_bitmasks`: llguidance's bitmasks of the rows whose params have a structured output,
    in order."""
    packed = pack_sampling(list(params), list(seeds), list(positions), vocab_size, prompt_token_ids,
                           output_token_ids, eos_token_id)
    inputs = packed.unpack(stage(packed.int64_parts, torch.int64, CPU), stage(packed.int32_parts, torch.int32, CPU))
    if token_bitmasks:
        inputs = with_disallowed_tokens(inputs, disallowed_tokens(token_bitmasks, vocab_size))
    return inputs


def sample(logits: torch.Tensor, params: Sequence[SamplingParams], seeds: Sequence[int], positions: Sequence[int],
           *, prompt_token_ids: Sequence[Sequence[int]] | None = None,
           output_token_ids: Sequence[Sequence[int]] | None = None,
           eos_token_id: int | None = None,
           token_bitmasks: Sequence[bytes] = ()) -> sampler.SamplerOutput:
    """`engine.sampler.sample` of `logits` [num_rows, vocab_size] with row i's params, seed and
    position (and token history, where its params adjust the logits; allowed tokens, where a
    structured output constrains it)."""
    inputs = staged_inputs(params, seeds, positions, logits.shape[-1], prompt_token_ids, output_token_ids,
                           eos_token_id, token_bitmasks)
    return sampler.sample(logits, inputs)
