"""The contract between the gateway's public fronts (HTTP, gRPC) and the gateway core.

A front turns a client request into one `GenerateInput`, iterates `Frontend.generate` and shapes
each `StreamChunk` for its wire format (the values are `gateway.front.frontend_types`). The core owns
everything behind that: tokenization, routing, the request store, detokenization and the
engine-side metrics.

Stream invariant: `generate` yields chunks whose `text` deltas concatenate to the completion
text and whose `token_ids` concatenate to the completion tokens; exactly the last chunk has a
`finish_reason`. Closing the iterator before that chunk (`aclose`, or cancelling the task that
iterates it) aborts the request everywhere: that is how a front reports a client that left.
"""
from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from pdserve.gateway.front.frontend_types import GenerateInput, StreamChunk
from pdserve.gateway.front.tokenization import PromptBuilder


class Frontend(Protocol):
    model_name: str
    max_model_len: int
    tokenizer: object  # a transformers PreTrainedTokenizerFast; fronts only call decode()
    prompts: PromptBuilder  # how generate() turns input into prompt ids; fronts use it to /tokenize

    def generate(self, request: GenerateInput) -> AsyncIterator[StreamChunk]:
        """An async generator of the request's chunks.

        Raises InvalidRequestError for input the model cannot serve and UnavailableError when no
        replica can take it, at the latest when the first chunk is awaited.
        """
        ...

    async def abort(self, request_id: str, owner: str) -> bool:
        """Aborts a running request that `owner` created (GenerateInput.owner); False if it is
        unknown here, already finished, or another caller's. Answers from this process's own
        requests, whatever the request store holds."""
        ...

    def health(self) -> bool:
        """False when the request cannot be served now (no live replicas)."""
        ...
