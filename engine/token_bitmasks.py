"""Structured outputs' token bitmasks, computed on a thread of their own while the forward runs.

Invariant: a grammar is read here only between `start` and the `result` of the same step, while
the engine thread runs the forward and samples nothing; the engine thread consumes the sampled
token into it only after `result`. So no grammar is touched by two threads at once, and the
mask is that of every token the request has so far. llguidance computes a mask with the GIL
released, so while the forward takes longer than the masks (tens to hundreds of microseconds a
row) they add nothing to the step.

A mask is the bytes of ceil(vocab_size / 32) little-endian int32 words, bit t allowing token t.
"""
from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

import torch

from pdserve.engine.thread_name import name_this_thread

if TYPE_CHECKING:
    from llguidance import LLMatcher

THREAD_NAME = "token-masks"


class TokenBitmasks:
    def __init__(self, eos_token_id: int | None):
        self.eos_token_id = eos_token_id  # what a grammar in error allows, so its request ends
        self._thread = ThreadPoolExecutor(1, thread_name_prefix=THREAD_NAME,
                                          initializer=name_this_thread, initargs=(THREAD_NAME,))

    def start(self, grammars: Sequence[LLMatcher]) -> Future[torch.Tensor]:
        """The grammars' masks, one after another: [len(grammars) * words] int32 on the host."""
        return self._thread.submit(self._compute, list(grammars))

    def _compute(self, grammars: list[LLMatcher]) -> torch.Tensor:
        bitmask = bytearray(b"".join(map(self._allowed, grammars)))
        return torch.frombuffer(bitmask, dtype=torch.int32)

    def _allowed(self, grammar: LLMatcher) -> bytes:
        """A grammar in error (a limit of the parser reached) allows nothing: then EOS alone."""
        bitmask = grammar.compute_bitmask()
        if any(bitmask) or self.eos_token_id is None:
            return bitmask
        only_eos = bytearray(len(bitmask))
        only_eos[self.eos_token_id // 8] = 1 << self.eos_token_id % 8
        return bytes(only_eos)
