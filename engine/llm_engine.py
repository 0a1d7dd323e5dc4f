"""The engine: one step is schedule → run → update.

    output = scheduler.schedule()          # which tokens of which requests run, where K/V go
    result = runner.run(output)            # forward pass over the flat batch, sample
    finished = self._update(output, result)  # append tokens, detokenize, check stops, free blocks

Requests join (`add_request`) and leave (finish, `abort_request`) between any two steps.

For disaggregation the same engine plays both sides:
- prefill: `add_request(..., hold_kv=True)` keeps a finished request's blocks (listed in its
  output's `held_block_ids`) until `release_kv`, so they can be pushed to a decode replica;
  a `kv_layer_listener(request_id, block_ids, layer)` hears as soon as each layer of such a
  request's KV is complete, during the step that computes its last prompt chunk;
- decode: `reserve` allocates blocks for a prompt whose KV another replica computes (starting
  from the cached blocks of its prefix, whose KV need not come), and
  `add_prefilled_request` joins it to the batch with that KV in place and its first token known.
  `release_kv` gives back a reservation that is never used.
Not thread-safe: one thread drives it (see `AsyncEngine`).

The KV pool holds `num_gpu_blocks` blocks or `kv_cache_memory_bytes`; with neither, on CUDA what a
profile step leaves of the replica's share of the GPU (memory_profile.py), on a CPU a share of
the host's available memory (cpu_kv_memory.py).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
import functools
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from pdserve.engine.block_allocator import BlockAllocator, OutOfBlocksError
from pdserve.engine.config import ModelConfig
from pdserve.engine.cpu_kv_memory import default_kv_memory_bytes
from pdserve.engine.device_guard import bind_thread, resolve_device
from pdserve.engine.engine_config import EngineConfig
from pdserve.engine.heap_trim import release_freed_memory
from pdserve.engine.kv_cache import KVCacheSpec
from pdserve.engine.memory_profile import profiled_kv_pool_bytes
from pdserve.engine.model import CausalLM
from pdserve.engine.model_runner import ModelRunner, ModelRunnerOutput
from pdserve.engine.output_processor import OutputProcessor
from pdserve.engine.process_memory import resident_bytes
from pdserve.engine.request import Request, RequestStatus
from pdserve.engine.scheduler import Scheduler, SchedulerOutput
from pdserve.engine.step_budget import StepBudget
from pdserve.engine.step_stats import StepStats
from pdserve.engine.warm_up import warm_up
from pdserve.engine.weights import load_model, weights_bytes
from pdserve.protocol.eos_token import eos_token_id
from pdserve.protocol.errors import InvalidConfigError, InvalidRequestError
from pdserve.protocol.kv_blocks import block_hashes, num_blocks_for
from pdserve.protocol.outputs import RequestOutput
from pdserve.protocol.request_checks import draw_seed, validate_prompt
from pdserve.protocol.sampling_params import SamplingParams
from pdserve.protocol.tokenizer import load_tokenizer

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

    from pdserve.protocol.grammar_compiler import GrammarCompiler

KVAllocator = Callable[[KVCacheSpec, int, torch.device], torch.Tensor]
KVLayerListener = Callable[[str, list[int], int], None]  # (request id, block ids, layer), engine thread


class LLMEngine:
    def __init__(self, config: EngineConfig, kv_allocator: KVAllocator | None = None,
                 kv_layer_listener: KVLayerListener | None = None, kv_pool_in_shared_memory: bool = False):
        """`kv_pool_in_shared_memory`: `kv_allocator` puts a CPU pool in /dev/shm, whose room bounds
        the pool's default size."""
        self.config = config
        self.device = resolve_device(config.device)
        bind_thread(self.device)  # the constructing thread loads the weights and allocates the pool
        self.model_config = ModelConfig.from_dir(config.model)
        self.max_model_len = config.max_model_len or self.model_config.max_position_embeddings
        self.eos_token_id = _eos_token_id(config.model, self.model_config)  # its passing allocations trimmed below
        self.dtype = config.torch_dtype(self.model_config.torch_dtype)
        model = load_model(Path(config.model), self.model_config, self.dtype, self.device, self.max_model_len,
                           config.quantized_weights, config.quantization)
        release_freed_memory()  # what the load freed, before the pool is sized from the memory available

        self.weights_bytes = weights_bytes(model)
        self.kv_spec = KVCacheSpec.for_model(self.model_config, config.block_size, config.kv_torch_dtype(self.dtype))
        num_blocks = self._num_kv_blocks(model, kv_pool_in_shared_memory)
        self.allocator = BlockAllocator(num_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(self.allocator, config.max_num_batched_tokens, config.max_num_seqs)
        self.step_budget = None  # prompt chunks bounded by tokens alone
        if config.max_step_ms is not None:
            self.step_budget = StepBudget(config.max_step_ms / 1e3, config.max_num_batched_tokens)
        self.step_stats = StepStats()
        allocate = kv_allocator or (lambda spec, n, device: spec.allocate(n, device))
        self.kv_cache = allocate(self.kv_spec, num_blocks, self.device)
        max_blocks_per_seq = num_blocks_for(self.max_model_len, config.block_size)
        self.runner = ModelRunner(model, self.kv_cache, config.block_size, self.device, config.max_num_seqs,
                                  max_blocks_per_seq, self.eos_token_id, decode_plan=not config.enforce_eager)
        if self.device.type == "cuda":
            from pdserve.kernels.launch_variants import warm_up_widths  # imports Triton: CUDA only

            windows = tuple({layer.self_attn.sliding_window for layer in model.model.layers})
            warm_up(model, self.kv_cache, config.block_size,
                    warm_up_widths(max_blocks_per_seq, config.block_size, windows), self.device)
        self.output_processor = OutputProcessor(self.tokenizer if config.detokenize else None, self.eos_token_id)
        self.kv_layer_listener = kv_layer_listener
        self._requests: dict[str, Request] = {}
        self._hold_kv: set[str] = set()  # requests whose blocks outlive them until release_kv
        self._kv_owners: set[str] = set()  # finished-but-held requests and unused reservations
        self._grammar_compiler: GrammarCompiler | None = None  # built by the first structured output

    @functools.cached_property
    def tokenizer(self) -> PreTrainedTokenizerFast:
        """Loaded when first used: an engine that leaves text to its caller and is given prompts as
        ids (a replica behind a gateway) loads it only for a structured output."""
        return load_tokenizer(self.config.model)

    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams,
                    seed: int | None = None, hold_kv: bool = False,
                    output_token_ids: Sequence[int] = ()) -> list[int]:
        """Queues a request; `seed` overrides the params' seed. Returns the prompt's token ids.

        `output_token_ids` resumes a request that generated them elsewhere: their KV is computed
        with the prompt's, and they count as output for max_tokens, min_tokens and penalties."""
        prompt_ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        request = self._new_request(request_id, prompt_ids, params, seed, output_token_ids)
        if hold_kv:
            self._hold_kv.add(request_id)
        self.scheduler.add(request)
        return prompt_ids

    def num_cached_tokens(self, request_id: str) -> int:
        """Tokens of a waiting request that the prefix cache holds now: what it would not compute
        if it joined the batch at once."""
        return len(self.scheduler.cached_prefix(self._requests[request_id])) * self.allocator.block_size

    def reserve(self, request_id: str, num_prompt_tokens: int, token_ids: Sequence[int] = ()) -> tuple[list[int], int]:
        """Allocates blocks for a prompt whose KV will be written from outside. Given the prompt's
        `token_ids`, the table starts with the cached blocks of their longest prefix (all but the
        last token at most, so that something lands). Returns the table and how many of its
        leading blocks were cached."""
        if request_id in self._requests or request_id in self._kv_owners:
            raise InvalidRequestError(f"request id {request_id!r} is already in use")
        if token_ids and len(token_ids) != num_prompt_tokens:
            raise InvalidRequestError(f"{len(token_ids)} token ids for a reservation of {num_prompt_tokens} tokens")
        if not 0 < num_prompt_tokens <= self.max_model_len:
            raise InvalidRequestError(f"a reservation of {num_prompt_tokens} tokens: the model's context length "
                                      f"is {self.max_model_len}")
        prefix = []
        if token_ids and self.allocator.enable_caching:
            prefix = self.allocator.lookup(block_hashes(token_ids[:-1], self.allocator.block_size))
            self.scheduler.count_prefix_lookup(num_prompt_tokens, len(prefix) * self.allocator.block_size)
        if not self.allocator.can_allocate(request_id, num_prompt_tokens, prefix):
            raise OutOfBlocksError(
                f"cannot reserve {num_prompt_tokens} tokens: {self.allocator.num_free_blocks} blocks free")
        self._kv_owners.add(request_id)
        return list(self.allocator.allocate(request_id, num_prompt_tokens, prefix)), len(prefix)

    def add_prefilled_request(self, request_id: str, prompt_ids: list[int], first_token_id: int,
                              params: SamplingParams, seed: int, output_token_ids: Sequence[int] = ()) -> None:
        """Joins a reserved request whose KV (prompt, then `output_token_ids` of a resumed request)
        has landed; it continues after `first_token_id`."""
        if request_id not in self._kv_owners:
            raise InvalidRequestError(f"request {request_id!r} has no reservation")
        num_landed = len(prompt_ids) + len(output_token_ids)
        num_reserved = len(self.allocator.block_table(request_id)) * self.allocator.block_size
        if num_landed > num_reserved:
            raise InvalidRequestError(
                f"request {request_id!r}: KV of {num_landed} tokens, reservation holds {num_reserved}")
        self._kv_owners.discard(request_id)
        try:
            request = self._new_request(request_id, prompt_ids, params, seed, [*output_token_ids, first_token_id])
        except InvalidRequestError:
            self._kv_owners.add(request_id)
            raise
        request.num_computed_tokens = num_landed
        self.output_processor.skip_sampled_tokens(request_id)
        self.scheduler.add_landed(request)

    def release_kv(self, request_id: str) -> bool:
        """Frees the blocks of a held finished request or an unused reservation."""
        if request_id not in self._kv_owners:
            return False
        self._kv_owners.discard(request_id)
        self.allocator.free(request_id)
        return True

    def abort_request(self, request_id: str) -> bool:
        """Ends a queued or running request (or drops a reservation); its blocks come back."""
        if self.release_kv(request_id):
            return True
        if self.scheduler.abort(request_id) is None:
            return False
        self._forget(request_id)
        return True

    def load(self) -> dict[str, int | float]:
        """Occupancy figures for the replica registry, and what its steps did (engine.step_stats);
        call on the engine's own thread.

        `used_slots` counts K/V entries that hold a token; allocated slots are
        `(total_blocks - free_blocks) * block_size`, so their difference is the paging waste."""
        running = self.scheduler.running
        held = sum(len(self.allocator.block_table(rid)) for rid in self._kv_owners) * self.allocator.block_size
        return {
            "free_blocks": self.allocator.num_free_blocks,
            "total_blocks": self.allocator.num_blocks,
            "block_size": self.allocator.block_size,
            "running_seqs": len(running),
            "waiting_seqs": len(self.scheduler.waiting),
            "used_slots": sum(request.num_computed_tokens for request in running) + held,
            "num_preemptions": self.scheduler.num_preemptions,
            "prefix_cache_queries": self.scheduler.num_prefix_queried_tokens,
            "prefix_cache_hits": self.scheduler.num_prefix_hit_tokens,
            "kv_pool_bytes": self.allocator.num_blocks * self.kv_spec.bytes_per_block,
            "weights_bytes": self.weights_bytes,
            "resident_bytes": resident_bytes(),
            **self.step_stats.figures(),
        }

    def cached_prefix_hashes(self, limit: int) -> list[bytes]:
        """Hashes of the prefix blocks this engine holds (engine.block_hash), newest first."""
        return self.allocator.cached_hashes(limit)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished

    def step(self) -> list[RequestOutput]:
        budget = self.step_budget
        output = self.scheduler.schedule(budget.prompt_tokens(len(self.scheduler.running)) if budget else None)
        started_s = time.perf_counter()
        result = self.runner.run(output, self._layer_hook(output))
        num_decodes, num_prompt_tokens, seconds = (output.num_decode_chunks, output.num_prompt_tokens,
                                                   time.perf_counter() - started_s)
        if budget is not None:
            budget.observe(num_decodes, num_prompt_tokens, seconds)
        self.step_stats.observe(num_decodes, num_prompt_tokens, seconds)
        return self._update(output, result)

    def _layer_hook(self, output: SchedulerOutput) -> Callable[[int], None] | None:
        """Tells the listener about held requests whose KV this step completes, layer by layer."""
        listener = self.kv_layer_listener
        if listener is None:
            return None
        completing = [(chunk.request.request_id, list(chunk.block_table)) for chunk in output.chunks
                      if chunk.samples and chunk.request.request_id in self._hold_kv]
        if not completing:
            return None

        def on_layer_done(layer: int) -> None:
            for request_id, block_ids in completing:
                listener(request_id, block_ids, layer)
        return on_layer_done

    def _update(self, output: SchedulerOutput, result: ModelRunnerOutput) -> list[RequestOutput]:
        self.scheduler.update(output, result.sampled)
        step_outputs = []
        for request_id, token_id in result.sampled.items():
            grammar = self._requests[request_id].grammar
            if grammar is not None:
                grammar.consume_token(token_id)  # allowed by its mask; an errored grammar allowed only EOS
            step_output, decision = self.output_processor.process(
                request_id, token_id, result.logprobs[request_id])
            if decision is not None:
                status = (RequestStatus.FINISHED_LENGTH if decision.finish_reason == "length"
                          else RequestStatus.FINISHED_STOPPED)
                hold = request_id in self._hold_kv
                self.scheduler.finish(self._requests[request_id], status, free_blocks=not hold)
                if hold:
                    self._kv_owners.add(request_id)
                    step_output.held_block_ids = list(self.allocator.block_table(request_id))
                self._forget(request_id)
            step_outputs.append(step_output)
        return step_outputs

    def _new_request(self, request_id: str, prompt_ids: list[int], params: SamplingParams,
                     seed: int | None, output_token_ids: Sequence[int] = ()) -> Request:
        if request_id in self._requests or request_id in self._kv_owners:
            raise InvalidRequestError(f"request id {request_id!r} is already running")
        validate_prompt(prompt_ids, params, self.model_config.vocab_size, self.max_model_len)
        total = len(prompt_ids) + params.max_tokens
        capacity = self.allocator.num_blocks * self.allocator.block_size
        if total > capacity:
            raise InvalidRequestError(f"request needs {total} KV slots, the whole pool holds {capacity}")
        if len(output_token_ids) > params.max_tokens:
            raise InvalidRequestError(f"request {request_id!r}: {len(output_token_ids)} output tokens already, "
                                      f"max_tokens is {params.max_tokens}")
        request = Request(request_id, prompt_ids, params, draw_seed(params.seed if seed is None else seed),
                          output_token_ids=list(output_token_ids), grammar=self._grammar(params, output_token_ids))
        self._requests[request_id] = request
        self.output_processor.add(request)
        return request

    def _grammar(self, params: SamplingParams, output_token_ids: Sequence[int]):
        """The request's structured-output state after the output tokens it arrived with (the
        first token, sampled by prefill; a migrated request's tokens so far), or None."""
        if params.structured_output is None:
            return None
        if self._grammar_compiler is None:
            from pdserve.protocol.grammar_compiler import GrammarCompiler  # imports transformers

            self._grammar_compiler = GrammarCompiler(self.tokenizer, self.model_config.vocab_size, self.eos_token_id)
        grammar = self._grammar_compiler.matcher(params.structured_output)
        if not grammar.consume_tokens(list(output_token_ids)):
            raise InvalidRequestError(f"the output so far does not match the structured output: "
                                      f"{grammar.get_error().strip()}")
        return grammar

    def _forget(self, request_id: str) -> None:
        del self._requests[request_id]
        self._hold_kv.discard(request_id)
        self.output_processor.remove(request_id)

    def _num_kv_blocks(self, model: CausalLM, in_shared_memory: bool) -> int:
        config = self.config
        if config.num_gpu_blocks is not None:
            return config.num_gpu_blocks
        num_bytes = config.kv_cache_memory_bytes
        if num_bytes is None:
            if self.device.type == "cuda":
                num_bytes = profiled_kv_pool_bytes(model, self.kv_spec, config.max_num_batched_tokens,
                                                   config.max_num_seqs, config.gpu_memory_utilization, self.device)
            else:
                num_bytes = default_kv_memory_bytes(in_shared_memory)  # with the weights loaded
        num_blocks = self.kv_spec.num_blocks_in(num_bytes)
        if num_blocks < 1:
            raise InvalidConfigError(
                f"a KV pool of {num_bytes} bytes holds no block of {self.kv_spec.bytes_per_block} bytes")
        return num_blocks


def _eos_token_id(model_dir: str, config: ModelConfig) -> int | None:
    token_id = eos_token_id(model_dir)
    if token_id is not None:
        return token_id
    return config.eos_token_ids[0] if config.eos_token_ids else None
