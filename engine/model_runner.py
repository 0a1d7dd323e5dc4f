"""Runs one scheduled step: builds the flat batch, runs the model, samples.

Mechanism only: the scheduler has already decided which tokens of which requests run and
where their K/V go (the block tables). Logits are computed only for the last token of chunks
that reach the end of their request; those rows are sampled.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

import kernels
from engine.attention_metadata import AttentionMetadata
from engine.model import CausalLM
from engine.outputs import TokenLogprobs
from engine.sampler import sample
from engine.scheduler import ScheduledChunk, SchedulerOutput
from engine.staging import stage


@dataclass(frozen=True, slots=True)
class ModelRunnerOutput:
    sampled: dict[str, int]  # request id -> new token id
    logprobs: dict[str, TokenLogprobs | None]


class ModelRunner:
    def __init__(self, model: CausalLM, kv_cache: torch.Tensor, block_size: int, device: torch.device,
                 eos_token_id: int | None = None):
        self.model = model
        self.kv_cache = kv_cache  # [num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]
        self.block_size = block_size
        self.device = device
        self.eos_token_id = eos_token_id  # masked by min_tokens
        kernels.prepare(device, kv_cache.dtype)

    @torch.inference_mode()
    def run(self, output: SchedulerOutput, on_layer_done: Callable[[int], None] | None = None) -> ModelRunnerOutput:
        if not output.chunks:
            return ModelRunnerOutput({}, {})
        input_ids, positions, last_rows, attn = self._prepare(output.chunks, output.num_decode_chunks)
        hidden = self.model(input_ids, positions, self.kv_cache, attn, on_layer_done)  # [num_tokens, hidden]

        sampling = [chunk for chunk in output.chunks if chunk.samples]
        if not sampling:
            return ModelRunnerOutput({}, {})
        logits = self.model.compute_logits(hidden[last_rows])  # [num_sampling, vocab_size]
        result = sample(
            logits,
            params=[chunk.request.params for chunk in sampling],
            seeds=[chunk.request.seed for chunk in sampling],
            positions=[chunk.request.num_tokens for chunk in sampling],
            prompt_token_ids=[chunk.request.prompt_token_ids for chunk in sampling],
            output_token_ids=[chunk.request.output_token_ids for chunk in sampling],
            eos_token_id=self.eos_token_id,
        )
        ids = [chunk.request.request_id for chunk in sampling]
        return ModelRunnerOutput(dict(zip(ids, result.token_ids)), dict(zip(ids, result.logprobs)))

    def _prepare(self, chunks: list[ScheduledChunk], num_decodes: int):
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
        decode_width, decode_rows = _padded_rows(decodes)
        prefill_width, prefill_rows = _padded_rows(prefills)
        # Two copies per step, whatever the batch: one per dtype (engine/staging.py).
        input_ids_t, positions_t, slots_t, last_rows = stage(
            [input_ids, positions, slots, _last_rows(chunks)], torch.int64, self.device)
        decode_lens, start_loc, prefill_lens, decode_tables, prefill_tables = stage(
            [[c.start + 1 for c in decodes], query_start_loc, [c.start + c.num_new_tokens for c in prefills],
             decode_rows, prefill_rows], torch.int32, self.device)
        attn = AttentionMetadata(
            slot_mapping=slots_t,
            num_decode_tokens=num_decodes,
            decode_block_tables=decode_tables.view(len(decodes), decode_width),
            decode_context_lens=decode_lens,
            prefill_block_tables=prefill_tables.view(len(prefills), prefill_width),
            prefill_query_start_loc=start_loc,
            prefill_context_lens=prefill_lens,
        )
        return input_ids_t, positions_t, last_rows, attn


def _padded_rows(chunks: list[ScheduledChunk]) -> tuple[int, list[int]]:
    """(width, the chunks' block tables padded to it, row after row). Rows are padded with block
    0; the kernels never read past a row's context length."""
    width = max((len(chunk.block_table) for chunk in chunks), default=0)
    return width, [block for chunk in chunks for block in chunk.block_table + [0] * (width - len(chunk.block_table))]


def _last_rows(chunks: list[ScheduledChunk]) -> list[int]:
    """Row in the flat batch of the last token of each chunk that samples."""
    rows, end = [], 0
    for chunk in chunks:
        end += chunk.num_new_tokens
        if chunk.samples:
            rows.append(end - 1)
    return rows
