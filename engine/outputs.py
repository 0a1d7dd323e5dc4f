"""What the engine returns for a request, shaped like vLLM's `RequestOutput`."""
from __future__ import annotations

from dataclasses import dataclass, field

from engine.sampler import TokenLogprobs


@dataclass(slots=True)
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it
    logprobs: list[TokenLogprobs] | None = None


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = False
    new_token_ids: list[int] = field(default_factory=list)  # tokens added by this step
    new_text: str = ""  # text added by this step
    num_preemptions: int = 0
    held_block_ids: list[int] | None = None  # finished with hold_kv: blocks kept until release_kv
