"""Structured outputs' token masks, computed on a thread of their own while the forward runs.

Invariant: a grammar is read here only between `start` and the `result` of the same step, while
the engine thread runs the forward and samples nothing; the engine thread consumes the sampled
token into it only after `result`. So no grammar is touched by two threads at once, and a mask
follows every token its request has so far. llguidance computes a grammar's bitmask with the GIL
released (tens to hundreds of microseconds a row), and unpacking the bits is one numpy call, so
while the forward takes longer than the masks they add nothing to the step.
"""
from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np
import torch

from pdserve.engine.thread_name import name_this_thread

if TYPE_CHECKING:
    from llguidance import LLMatcher

THREAD_NAME = "token-masks"


class TokenMasks:
    def __init__(self, vocab_size: int, eos_token_id: int | None):
        self.vocab_size = vocab_size  # the logits' width; a bitmask covers it, rounded up to 32 bits
        self.eos_token_id = eos_token_id  # what a grammar in error allows, so its request ends
        self._thread = ThreadPoolExecutor(1, thread_name_prefix=THREAD_NAME,
                                          initializer=name_this_thread, initargs=(THREAD_NAME,))

    def start(self, grammars: Sequence[LLMatcher]) -> Future[torch.Tensor]:
        """What each grammar forbids next: [len(grammars), vocab_size] bool on the host."""
        return self._thread.submit(self._disallowed, list(grammars))

    def _disallowed(self, grammars: list[LLMatcher]) -> torch.Tensor:
        return disallowed_tokens([self._bitmask(grammar) for grammar in grammars], self.vocab_size)

    def _bitmask(self, grammar: LLMatcher) -> bytes:
        """A grammar in error (a limit of the parser reached) allows nothing: then EOS alone."""
        bitmask = grammar.compute_bitmask()
        if not grammar.is_error() or self.eos_token_id is None:
            return bitmask
        only_eos = bytearray(len(bitmask))
        only_eos[self.eos_token_id // 8] = 1 << self.eos_token_id % 8
        return bytes(only_eos)


def disallowed_tokens(bitmasks: Sequence[bytes], vocab_size: int) -> torch.Tensor:
    """llguidance bitmasks (little-endian int32 words, bit t set where token t is allowed), one a
    row, as the tokens each row forbids: [len(bitmasks), vocab_size] bool."""
    allowed_bits = np.frombuffer(b"".join(bitmasks), dtype=np.uint8)
    disallowed = np.unpackbits(~allowed_bits, bitorder="little").reshape(len(bitmasks), -1)
    return torch.from_numpy(disallowed[:, :vocab_size]).view(torch.bool)
