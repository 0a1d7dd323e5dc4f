"""Runs one scheduled step: builds the flat batch, runs the model, samples.

Mechanism only: the scheduler has already decided which tokens of which requests run and
where their K/V go (the block tables). The block tables live on the device between steps
(engine/block_table.py); a step sends only the blocks appended since the last. Logits are
computed only for the last token of chunks that reach the end of their request; those rows are
sampled.

Invariant: a step makes two host-to-device copies and, if it samples, one device-to-host
readback, whatever its batch and whatever its rows' sampling params. In: one staged copy per
dtype (engine/staging.py) holds the model's inputs, the block-table writes and everything the
sampler reads (engine/sampling_inputs.py). The one exception, structured outputs' token masks,
are computed while the forward runs (engine/token_masks.py) and copied after it: a third copy in
the steps that sample such a row. Out: the sampled token ids and any logprobs,
read back together (engine/sampler.py).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from pdserve import kernels
from pdserve.engine.attention_metadata import AttentionMetadata
from pdserve.engine.block_table import BlockTable
from pdserve.engine.cpu_decode_plan import DecodePlan
from pdserve.engine.model import CausalLM
from pdserve.protocol.outputs import TokenLogprobs
from pdserve.engine.sampler import sample
from pdserve.engine.sampling_inputs import SamplingInputs, pack_sampling, with_disallowed_tokens
from pdserve.engine.scheduler import ScheduledChunk, SchedulerOutput
from pdserve.engine.staging import stage
from pdserve.engine.token_masks import TokenMasks


@dataclass(frozen=True, slots=True)
class ModelRunnerOutput:
    sampled: dict[str, int]  # request id -> new token id
    logprobs: dict[str, TokenLogprobs | None]


class ModelRunner:
    def __init__(self, model: CausalLM, kv_cache: torch.Tensor, block_size: int, device: torch.device,
                 max_num_seqs: int, max_blocks_per_seq: int, eos_token_id: int | None = None,
                 decode_plan: bool = True):
        """`decode_plan`: on CPU, decode-only steps run as a bound plan (engine/cpu_decode_plan.py)
        where it serves the model."""
        self.model = model
        self.kv_cache = kv_cache  # [num_layers, 2, num_blocks, block_size, num_kv_heads, entry_size]
        self.block_size = block_size
        self.device = device
        self.block_table = BlockTable(max_num_seqs, max_blocks_per_seq, device)
        self.eos_token_id = eos_token_id  # masked by min_tokens
        self.token_masks = TokenMasks(model.config.vocab_size, eos_token_id)
        kernels.prepare(device, model.dtype, kv_cache.dtype)
        self.decode_plan = (DecodePlan(model, kv_cache, max_num_seqs, max_blocks_per_seq)
                            if decode_plan and DecodePlan.serves(model, kv_cache) else None)

    @torch.inference_mode()
    def run(self, output: SchedulerOutput, on_layer_done: Callable[[int], None] | None = None) -> ModelRunnerOutput:
        self.block_table.release(output.departed_request_ids)
        if not output.chunks:
            return ModelRunnerOutput({}, {})
        sampling = [chunk for chunk in output.chunks if chunk.samples]
        input_ids, positions, last_rows, attn, sampling_inputs = self._prepare(
            output.chunks, output.num_decode_chunks, sampling)
        grammars = [chunk.request.grammar for chunk in sampling if chunk.request.grammar is not None]
        disallowed = self.token_masks.start(grammars) if grammars else None  # beside the forward
        if self.decode_plan is not None and on_layer_done is None and attn.num_decode_tokens == len(input_ids):
            hidden = self.decode_plan.forward(input_ids, positions, attn)  # [num_tokens, hidden]
        else:
            hidden = self.model(input_ids, positions, self.kv_cache, attn, on_layer_done)
        if not sampling:
            return ModelRunnerOutput({}, {})
        logits = self.model.compute_logits(hidden[last_rows])  # [num_sampling, vocab_size]
        if disallowed is not None:
            sampling_inputs = with_disallowed_tokens(sampling_inputs, disallowed.result())
        result = sample(logits, sampling_inputs)
        ids = [chunk.request.request_id for chunk in sampling]
        return ModelRunnerOutput(dict(zip(ids, result.token_ids)), dict(zip(ids, result.logprobs)))

    def _prepare(self, chunks: list[ScheduledChunk], num_decodes: int, sampling: list[ScheduledChunk]
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, AttentionMetadata, SamplingInputs]:
        block_size = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        for chunk in chunks:
            end = chunk.start + chunk.num_new_tokens
            input_ids += chunk.request.token_ids(chunk.start, end)
            table = chunk.block_table
            for pos in range(chunk.start, end):
                positions.append(pos)
                slots.append(table[pos // block_size] * block_size + pos % block_size)

        decodes, prefills = chunks[:num_decodes], chunks[num_decodes:]
        query_start_loc = [0]
        for chunk in prefills:
            query_start_loc.append(query_start_loc[-1] + chunk.num_new_tokens)
        table_rows, table_indices, new_block_ids = self.block_table.diff(chunks)
        requests = [chunk.request for chunk in sampling]
        packed = pack_sampling(
            params=[request.params for request in requests],
            seeds=[request.seed for request in requests],
            positions=[request.num_tokens for request in requests],
            vocab_size=self.model.config.vocab_size,
            prompt_token_ids=[request.prompt_token_ids for request in requests],
            output_token_ids=[request.output_token_ids for request in requests],
            eos_token_id=self.eos_token_id,
        )
        # Two copies per step, whatever the batch and its sampling params: one per dtype.
        input_ids_t, positions_t, slots_t, last_rows, table_indices_t, *sampling_int64 = stage(
            [input_ids, positions, slots, _last_rows(chunks), table_indices, *packed.int64_parts],
            torch.int64, self.device)
        decode_lens, start_loc, prefill_lens, table_rows_t, new_block_ids_t, *sampling_int32 = stage(
            [[c.start + 1 for c in decodes], query_start_loc, [c.start + c.num_new_tokens for c in prefills],
             table_rows, new_block_ids, *packed.int32_parts], torch.int32, self.device)
        self.block_table.write(table_indices_t, new_block_ids_t)
        attn = AttentionMetadata(
            slot_mapping=slots_t,
            num_decode_tokens=num_decodes,
            decode_block_tables=self.block_table.gather(table_rows_t[:num_decodes], _width(decodes)),
            decode_context_lens=decode_lens,
            prefill_block_tables=self.block_table.gather(table_rows_t[num_decodes:], _width(prefills)),
            prefill_query_start_loc=start_loc,
            prefill_context_lens=prefill_lens,
        )
        return input_ids_t, positions_t, last_rows, attn, packed.unpack(sampling_int64, sampling_int32)


def _width(chunks: list[ScheduledChunk]) -> int:
    """Block-table width of a kernel launch: the chunks' longest table, in blocks. The Triton
    launchers derive their split sizes and compiled variants from it (kernels/launch_variants.py)."""
    return max((len(chunk.block_table) for chunk in chunks), default=0)


def _last_rows(chunks: list[ScheduledChunk]) -> list[int]:
    """Row in the flat batch of the last token of each chunk that samples."""
    rows, end = [], 0
    for chunk in chunks:
        end += chunk.num_new_tokens
        if chunk.samples:
            rows.append(end - 1)
    return rows
