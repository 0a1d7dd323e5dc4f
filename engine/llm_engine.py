"""The engine: one step is schedule → run → update.

    output = scheduler.schedule()          # which tokens of which requests run, where K/V go
    result = runner.run(output)            # forward pass over the flat batch, sample
    finished = self._update(output, result)  # append tokens, detokenize, check stops, free blocks

Requests join (`add_request`) and leave (finish, `abort_request`) between any two steps.
"""
from __future__ import annotations

import random
from pathlib import Path

import torch

from engine.block_allocator import BlockAllocator
from engine.config import ModelConfig
from engine.engine_config import EngineConfig
from engine.errors import InvalidConfigError, InvalidRequestError
from engine.kv_cache import KVCacheSpec
from engine.model_runner import ModelRunner, ModelRunnerOutput
from engine.output_processor import OutputProcessor
from engine.outputs import RequestOutput
from engine.request import Request, RequestStatus
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler, SchedulerOutput
from engine.tokenizer import load_tokenizer
from engine.weights import load_model

DEFAULT_CPU_KV_CACHE_BYTES = 512 * 2**20
CUDA_KV_CACHE_FRACTION = 0.8  # of the memory free once the weights are loaded


class LLMEngine:
    def __init__(self, config: EngineConfig):
        self.config = config
        self.device = torch.device(config.device)
        self.model_config = ModelConfig.from_dir(config.model)
        self.max_model_len = config.max_model_len or self.model_config.max_position_embeddings
        self.tokenizer = load_tokenizer(config.model)
        model = load_model(Path(config.model), self.model_config, config.torch_dtype, self.device)

        self.kv_spec = KVCacheSpec.for_model(self.model_config, config.block_size, config.torch_dtype)
        num_blocks = self._num_kv_blocks()
        self.allocator = BlockAllocator(num_blocks, config.block_size)
        self.scheduler = Scheduler(self.allocator, config.max_num_batched_tokens, config.max_num_seqs)
        kv_cache = self.kv_spec.allocate(num_blocks, self.device)
        self.runner = ModelRunner(model, kv_cache, config.block_size, self.device)
        self.output_processor = OutputProcessor(self.tokenizer, _eos_token_id(self.tokenizer, self.model_config))
        self._requests: dict[str, Request] = {}

    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams) -> None:
        if request_id in self._requests:
            raise InvalidRequestError(f"request id {request_id!r} is already running")
        prompt_ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        self._validate_prompt(prompt_ids, params)
        seed = params.seed if params.seed is not None else random.getrandbits(63)
        request = Request(request_id, prompt_ids, params, seed)
        self._requests[request_id] = request
        self.output_processor.add(request)
        self.scheduler.add(request)

    def abort_request(self, request_id: str) -> None:
        if self.scheduler.abort(request_id) is not None:
            self._forget(request_id)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished

    def step(self) -> list[RequestOutput]:
        output = self.scheduler.schedule()
        result = self.runner.run(output)
        return self._update(output, result)

    def _update(self, output: SchedulerOutput, result: ModelRunnerOutput) -> list[RequestOutput]:
        self.scheduler.update(output, result.sampled)
        step_outputs = []
        for request_id, token_id in result.sampled.items():
            step_output, decision = self.output_processor.process(
                request_id, token_id, result.logprobs[request_id])
            if decision is not None:
                status = (RequestStatus.FINISHED_LENGTH if decision.finish_reason == "length"
                          else RequestStatus.FINISHED_STOPPED)
                self.scheduler.finish(self._requests[request_id], status)
                self._forget(request_id)
            step_outputs.append(step_output)
        return step_outputs

    def _forget(self, request_id: str) -> None:
        del self._requests[request_id]
        self.output_processor.remove(request_id)

    def _validate_prompt(self, prompt_ids: list[int], params: SamplingParams) -> None:
        if not prompt_ids:
            raise InvalidRequestError("prompt is empty")
        vocab_size = self.model_config.vocab_size
        if any(not 0 <= token_id < vocab_size for token_id in prompt_ids):
            raise InvalidRequestError(f"prompt token ids must be in [0, {vocab_size})")
        total = len(prompt_ids) + params.max_tokens
        if total > self.max_model_len:
            raise InvalidRequestError(
                f"prompt ({len(prompt_ids)} tokens) + max_tokens ({params.max_tokens}) = {total} "
                f"exceeds the model's context length {self.max_model_len}")
        capacity = self.allocator.num_blocks * self.allocator.block_size
        if total > capacity:
            raise InvalidRequestError(f"request needs {total} KV slots, the whole pool holds {capacity}")

    def _num_kv_blocks(self) -> int:
        if self.config.num_gpu_blocks is not None:
            return self.config.num_gpu_blocks
        num_bytes = self.config.kv_cache_bytes
        if num_bytes is None:
            if self.device.type == "cuda":
                num_bytes = int(torch.cuda.mem_get_info(self.device)[0] * CUDA_KV_CACHE_FRACTION)
            else:
                num_bytes = DEFAULT_CPU_KV_CACHE_BYTES
        num_blocks = self.kv_spec.num_blocks_in(num_bytes)
        if num_blocks < 1:
            raise InvalidConfigError(
                f"kv_cache_bytes={num_bytes} holds no block of {self.kv_spec.bytes_per_block} bytes")
        return num_blocks


def _eos_token_id(tokenizer, config: ModelConfig) -> int | None:
    if tokenizer.eos_token_id is not None:
        return tokenizer.eos_token_id
    return config.eos_token_ids[0] if config.eos_token_ids else None
