"""What the engine returns for a request, shaped like vLLM's `RequestOutput`.

Plain data only: the gateway, which never loads torch, reads these types too.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class TokenLogprobs:
    token_id: int  # the sampled token
    logprob: float  # its log-probability under the raw model distribution
    top_ids: tuple[int, ...]  # [params.logprobs], most likely first
    top_logprobs: tuple[float, ...]  # [params.logprobs], descending


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
    # Their logprobs, when asked for. Read these, not outputs[0].logprobs: the engine thread keeps
    # appending to that list while an earlier step's output waits to be sent.
    new_logprobs: list[TokenLogprobs] = field(default_factory=list)
    new_text: str = ""  # text added by this step
    num_output_tokens: int = 0  # output tokens up to this step (outputs[0].token_ids keeps growing)
    num_preemptions: int = 0
    held_block_ids: list[int] | None = None  # finished with hold_kv: blocks kept until release_kv
