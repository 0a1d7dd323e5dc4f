"""Offline API shaped like vLLM's: `LLM(model_dir, ...).generate(prompts, params)`."""
from __future__ import annotations

from collections.abc import Sequence

from tqdm import tqdm

from pdserve.engine.engine_config import EngineConfig
from pdserve.engine.llm_engine import LLMEngine
from pdserve.protocol.outputs import RequestOutput
from pdserve.protocol.sampling_params import SamplingParams

Prompt = str | list[int]


class LLM:
    def __init__(self, model: str, **engine_args):
        self.engine = LLMEngine(EngineConfig(model=str(model), **engine_args))
        self._next_id = 0

    def generate(self, prompts: Prompt | Sequence[Prompt], params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """Runs all prompts to completion with continuous batching; results in prompt order."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = params or SamplingParams()
        params_list = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        if len(params_list) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params_list)} sampling params")
        request_ids = []
        for prompt, request_params in zip(prompts, params_list):
            request_ids.append(str(self._next_id))
            self._next_id += 1
            self.engine.add_request(request_ids[-1], prompt, request_params)
        return self._run(request_ids, use_tqdm)

    def _run(self, request_ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        finished: dict[str, RequestOutput] = {}
        with tqdm(total=len(request_ids), desc="generate", unit="req", disable=not use_tqdm) as bar:
            while self.engine.has_unfinished_requests():
                for output in self.engine.step():
                    if output.finished:
                        finished[output.request_id] = output
                        bar.update(1)
        return [finished[request_id] for request_id in request_ids]
