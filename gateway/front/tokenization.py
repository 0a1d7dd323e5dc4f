"""Client input → prompt token ids and final sampling parameters, checked against the model.

Tokenizing runs on one thread of its own (`encode`, `prepare`), never on the event loop: a
prompt of a megabyte takes the tokenizer about a second, which on the loop would stall every
other stream and health check. One thread, as vLLM's front does, because a Hugging Face fast
tokenizer is not safe to call from several threads at once.

A structured output is compiled here too, on the same thread (the first one builds the
vocabulary's index, about 0.3 s), so a constraint that does not compile is refused before any
replica sees the request.

A chat request's tools are rendered by the chat template, or, when it ignores them, by the
fallback system message of gateway.front.tool_prompt; on the same thread, as every rendering.

The model's end-of-turn tokens (generation_config.json's `eos_token_id` list beyond the
tokenizer's EOS) are added as stop tokens, as vLLM does, so chat replies end at the turn.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pdserve.gateway.front.frontend_types import GenerateInput
from pdserve.gateway.front.tool_prompt import ToolPrompt
from pdserve.protocol.errors import InvalidRequestError
from pdserve.protocol.grammar_compiler import GrammarCompiler
from pdserve.protocol.request_checks import validate_prompt
from pdserve.protocol.sampling_params import SamplingParams


class PromptBuilder:
    def __init__(self, tokenizer, model_dir: str, vocab_size: int, max_model_len: int):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.eos_token_id = tokenizer.eos_token_id
        self.extra_stop_token_ids = tuple(
            sorted(set(_generation_eos_ids(Path(model_dir))) - {self.eos_token_id}))
        self._tokenizer_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenizer")
        self._grammar_compiler: GrammarCompiler | None = None  # built by the first structured output

    async def prepare(self, request: GenerateInput, running_ids) -> tuple[str, list[int], SamplingParams]:
        """The request's id (assigned when the client gave none), prompt ids and final parameters."""
        request_id = request.request_id or uuid.uuid4().hex
        if request_id in running_ids:
            raise InvalidRequestError(f"request id {request_id!r} is already running")
        prompt_ids = await self.encode(request)
        params = self.params(request, prompt_ids)
        if params.structured_output is not None:
            await asyncio.get_running_loop().run_in_executor(self._tokenizer_thread, self._check_compiles, params)
        return request_id, prompt_ids, params

    async def encode(self, request: GenerateInput) -> list[int]:
        """`prompt_ids` on the tokenizer's thread."""
        return await asyncio.get_running_loop().run_in_executor(self._tokenizer_thread, self.prompt_ids, request)

    def prompt_ids(self, request: GenerateInput) -> list[int]:
        given = [x is not None for x in (request.prompt, request.prompt_token_ids, request.messages)]
        if sum(given) != 1:
            raise InvalidRequestError("give exactly one of prompt, prompt_token_ids or messages")
        if request.prompt is not None:
            return self.tokenizer.encode(request.prompt)
        if request.prompt_token_ids is not None:
            return list(request.prompt_token_ids)
        return self._render_chat(request.messages, request.tool_prompt)

    def params(self, request: GenerateInput, prompt_ids: list[int]) -> SamplingParams:
        """The request's parameters once its prompt is known; raises InvalidRequestError unless
        prompt and max_tokens fit the model."""
        params = request.params
        room = self.max_model_len - len(prompt_ids)
        if request.max_tokens_is_default and params.max_tokens > room > 0:
            params = dataclasses.replace(params, max_tokens=room)
        validate_prompt(prompt_ids, params, self.vocab_size, self.max_model_len)
        if self.extra_stop_token_ids and not params.ignore_eos:
            stop_ids = tuple(dict.fromkeys(params.stop_token_ids + self.extra_stop_token_ids))
            params = dataclasses.replace(params, stop_token_ids=stop_ids)
        return params

    def _check_compiles(self, params: SamplingParams) -> None:
        if self._grammar_compiler is None:
            self._grammar_compiler = GrammarCompiler(self.tokenizer, self.vocab_size, self.eos_token_id)
        self._grammar_compiler.check(params.structured_output)

    def _render_chat(self, messages: list[dict], tool_prompt: ToolPrompt | None) -> list[int]:
        """With tools, the template's own rendering of them, or the fallback (gateway.front.tool_prompt)
        when it renders none of them."""
        tools = None if tool_prompt is None else list(tool_prompt.specs)
        if tools is not None and tool_prompt.parser is not None:
            with_tools = self._apply_template(messages, tools, tokenize=False)
            if with_tools == self._apply_template(messages, None, tokenize=False):
                messages, tools = tool_prompt.fallback_messages(messages), None
        return list(self._apply_template(messages, tools, tokenize=True))

    def _apply_template(self, messages: list[dict], tools: list[dict] | None, tokenize: bool):
        try:
            return self.tokenizer.apply_chat_template(
                messages, tools=tools, add_generation_prompt=True, tokenize=tokenize, return_dict=False)
        except Exception as exc:  # the template itself rejects the conversation
            raise InvalidRequestError(f"chat template failed: {exc}") from exc


def _generation_eos_ids(model_dir: Path) -> list[int]:
    path = model_dir / "generation_config.json"
    if not path.is_file():
        return []
    eos = json.loads(path.read_text()).get("eos_token_id")
    return eos if isinstance(eos, list) else [] if eos is None else [eos]
