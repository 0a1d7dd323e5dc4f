"""Continuous-batching scheduler: pure policy over requests and the block allocator.

Every step spends a token budget (`max_num_batched_tokens`), of which prompt chunks may take at
most `max_prompt_tokens` when the caller gives one (engine.step_budget: chunks sized to a step
time):
1. Running requests, oldest first, each get the tokens they still need (one for a request that
   is generating, a chunk of the prompt for one still prefilling). If the pool cannot hold a
   request's new tokens, the newest running request is preempted (its blocks freed, to be
   recomputed later) until it can.
2. Then waiting requests, in arrival order (preempted ones first, and requests whose KV landed
   from elsewhere, which join the running batch at once when it has room), join while the budget,
   `max_num_seqs` and the pool allow. A request that joins with nothing computed starts with the
   cached blocks of its longest cached prefix (at most all but its last token, which it computes
   to sample), so only the rest is computed. A prompt longer than what is left of the budget is
   prefilled in chunks over several steps.
No step admits new requests after preempting one, so a preempted request is not starved by
newcomers. The caller feeds back sampled tokens through `update` and ends requests through
`finish` or `abort`; those free the request's blocks. Each output lists the running requests
that left the batch since the one before (finished, aborted, preempted), for the runner's
per-request state.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from pdserve.engine.block_allocator import BlockAllocator
from pdserve.engine.request import Request, RequestStatus


@dataclass(frozen=True, slots=True)
class ScheduledChunk:
    request: Request
    start: int  # first position computed this step (= num_computed_tokens when scheduled)
    num_new_tokens: int
    block_table: list[int]

    @property
    def samples(self) -> bool:
        """Whether this chunk reaches the end of the request's tokens, so a token is sampled."""
        return self.start + self.num_new_tokens == self.request.num_tokens


@dataclass(frozen=True, slots=True)
class SchedulerOutput:
    chunks: list[ScheduledChunk]  # single-token chunks first, then multi-token chunks
    departed_request_ids: list[str] = field(default_factory=list)  # left the running batch since the last output

    @property
    def num_decode_chunks(self) -> int:
        return sum(1 for chunk in self.chunks if chunk.num_new_tokens == 1)

    @property
    def num_prompt_tokens(self) -> int:
        return sum(chunk.num_new_tokens for chunk in self.chunks if chunk.num_new_tokens > 1)


class Scheduler:
    def __init__(self, allocator: BlockAllocator, max_num_batched_tokens: int, max_num_seqs: int):
        if max_num_batched_tokens < 1 or max_num_seqs < 1:
            raise ValueError("max_num_batched_tokens and max_num_seqs must be >= 1")
        self.allocator = allocator
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._departed: list[str] = []  # ids of running requests that left since the last schedule
        self.num_preemptions = 0
        self.num_prefix_queried_tokens = 0  # tokens of joining requests looked up in the prefix cache
        self.num_prefix_hit_tokens = 0  # of those, tokens found cached

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def add_landed(self, request: Request) -> None:
        """A request whose KV is already in its blocks (computed elsewhere) joins the running batch
        at once, or heads the waiting queue when the batch is full: it holds blocks, and behind a
        prompt that waits for blocks it could hold the very blocks that prompt waits for."""
        if len(self.running) < self.max_num_seqs:
            request.transition(RequestStatus.RUNNING)
            self.running.append(request)
        else:
            self.waiting.appendleft(request)

    def schedule(self, max_prompt_tokens: int | None = None) -> SchedulerOutput:
        budget = self.max_num_batched_tokens
        prompt_budget = budget if max_prompt_tokens is None else max_prompt_tokens
        chunks: list[ScheduledChunk] = []
        preempted = False

        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            num_new = _chunk_size(request.num_tokens - request.num_computed_tokens, budget, prompt_budget)
            if num_new == 0:  # a prompt, and this step's prompt budget is spent
                index += 1
                continue
            end = request.num_computed_tokens + num_new
            while not self.allocator.can_allocate(request.request_id, end):
                victim = self.running.pop()
                self._preempt(victim)
                preempted = True
                if victim is request:
                    break
            else:
                chunks.append(self._take(request, num_new))
                budget -= num_new
                prompt_budget -= num_new if num_new > 1 else 0
                index += 1

        while (not preempted and self.waiting and budget > 0 and prompt_budget > 0
               and len(self.running) < self.max_num_seqs):
            request = self.waiting[0]
            prefix = self.cached_prefix(request)
            start = max(request.num_computed_tokens, len(prefix) * self.allocator.block_size)
            num_new = _chunk_size(request.num_tokens - start, budget, prompt_budget)
            if not self.allocator.can_allocate(request.request_id, start + num_new, prefix):
                break
            self.waiting.popleft()
            request.transition(RequestStatus.RUNNING)
            self.running.append(request)
            if request.num_computed_tokens == 0:
                self.count_prefix_lookup(request.num_tokens, start)
            request.num_computed_tokens = start
            chunks.append(self._take(request, num_new, prefix))
            budget -= num_new
            prompt_budget -= num_new

        chunks.sort(key=lambda chunk: chunk.num_new_tokens != 1)
        departed, self._departed = self._departed, []
        return SchedulerOutput(chunks=chunks, departed_request_ids=departed)

    def update(self, output: SchedulerOutput, sampled: dict[str, int]) -> None:
        """Advances computed counts and appends the tokens sampled for chunks that reached the end."""
        for chunk in output.chunks:
            request = chunk.request
            if request.status is not RequestStatus.RUNNING:
                continue
            request.num_computed_tokens = chunk.start + chunk.num_new_tokens
            if self.allocator.enable_caching:
                self.allocator.cache_blocks(request.request_id, request.full_block_hashes(
                    request.num_computed_tokens, self.allocator.block_size))
            if chunk.samples:
                request.output_token_ids.append(sampled[request.request_id])

    def finish(self, request: Request, status: RequestStatus, free_blocks: bool = True) -> None:
        """Ends a running request; with `free_blocks=False` its blocks stay allocated for the caller."""
        self.running.remove(request)
        self._departed.append(request.request_id)
        request.transition(status)
        if free_blocks:
            self.allocator.free(request.request_id)

    def abort(self, request_id: str) -> Request | None:
        for queue in (self.running, self.waiting):
            for request in queue:
                if request.request_id == request_id:
                    queue.remove(request)
                    if queue is self.running:
                        self._departed.append(request_id)
                    request.transition(RequestStatus.FINISHED_ABORTED)
                    self.allocator.free(request_id)
                    return request
        return None

    def count_prefix_lookup(self, num_queried_tokens: int, num_hit_tokens: int) -> None:
        self.num_prefix_queried_tokens += num_queried_tokens
        self.num_prefix_hit_tokens += num_hit_tokens

    def cached_prefix(self, request: Request) -> list[int]:
        """Cached blocks a request with nothing computed can start from (none for the others)."""
        if request.num_computed_tokens or not self.allocator.enable_caching:
            return []
        return self.allocator.lookup(request.full_block_hashes(request.num_tokens - 1, self.allocator.block_size))

    def _take(self, request: Request, num_new: int, prefix: Sequence[int] = ()) -> ScheduledChunk:
        start = request.num_computed_tokens
        table = self.allocator.allocate(request.request_id, start + num_new, prefix)
        return ScheduledChunk(request=request, start=start, num_new_tokens=num_new, block_table=table)

    def _preempt(self, request: Request) -> None:
        request.transition(RequestStatus.PREEMPTED)
        self._departed.append(request.request_id)
        self.allocator.free(request.request_id)
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)


def _chunk_size(num_left: int, budget: int, prompt_budget: int) -> int:
    """Tokens to compute this step for a request with `num_left` to go: one for a decode, a
    chunk of the prompt within both budgets for a prompt."""
    if num_left <= 1:
        return min(num_left, budget)
    return max(0, min(num_left, budget, prompt_budget))
