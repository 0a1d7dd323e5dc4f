"""A request inside the engine, and its lifecycle.

There is no prefill phase and no decode phase: a request has `num_tokens` (prompt + output so
far) and `num_computed_tokens` (those whose K/V sit in the pool), and each step computes some of
the difference. When they meet, the step samples one more token. Preemption sets
`num_computed_tokens` back to 0; recomputation then treats prompt + output as the prompt.

    WAITING ──▶ RUNNING ──▶ FINISHED_STOPPED | FINISHED_LENGTH
                 │   ▲
                 ▼   │
               PREEMPTED           any unfinished state ──▶ FINISHED_ABORTED
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pdserve.protocol.errors import IllegalTransitionError
from pdserve.protocol.kv_blocks import BlockHash, extend_block_hashes
from pdserve.protocol.sampling_params import SamplingParams

if TYPE_CHECKING:
    from llguidance import LLMatcher


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "finished_stopped"
    FINISHED_LENGTH = "finished_length"
    FINISHED_ABORTED = "finished_aborted"


_FINISHED = {RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH, RequestStatus.FINISHED_ABORTED}
_ALLOWED = {
    RequestStatus.WAITING: {RequestStatus.RUNNING, RequestStatus.FINISHED_ABORTED},
    RequestStatus.PREEMPTED: {RequestStatus.RUNNING, RequestStatus.FINISHED_ABORTED},
    RequestStatus.RUNNING: {RequestStatus.PREEMPTED} | _FINISHED,
}


@dataclass(eq=False, slots=True)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    seed: int  # effective sampling seed: params.seed, or one drawn when the request arrived
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_preemptions: int = 0
    status: RequestStatus = RequestStatus.WAITING
    block_hashes: list[BlockHash] = field(default_factory=list)  # of its full blocks, as far as known
    grammar: LLMatcher | None = None  # a structured output's state: has consumed output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    def token_ids(self, start: int, stop: int) -> list[int]:
        """Tokens [start, stop) of prompt + output, copying only that span."""
        num_prompt = len(self.prompt_token_ids)
        if stop <= num_prompt:
            return self.prompt_token_ids[start:stop]
        if start >= num_prompt:
            return self.output_token_ids[start - num_prompt:stop - num_prompt]
        return self.prompt_token_ids[start:] + self.output_token_ids[:stop - num_prompt]

    def full_block_hashes(self, num_tokens: int, block_size: int) -> list[BlockHash]:
        """Hashes of the full blocks among the request's first `num_tokens` tokens."""
        return extend_block_hashes(self.block_hashes, self.token_ids, num_tokens // block_size, block_size)

    def transition(self, to: RequestStatus) -> None:
        if to not in _ALLOWED.get(self.status, ()):
            raise IllegalTransitionError(f"request {self.request_id}: {self.status.name} -> {to.name}")
        self.status = to
