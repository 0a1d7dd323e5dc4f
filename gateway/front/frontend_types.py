"""The values that cross between the gateway's public fronts and its core (`gateway.front.frontend`):
a front builds one `GenerateInput` per client request and shapes the `StreamChunk`s it gets back;
`UnavailableError` tells it to answer "retry later" (HTTP 503 / gRPC UNAVAILABLE), and
`OverloadedError` "retry after this many seconds" (HTTP 429 with Retry-After / gRPC
RESOURCE_EXHAUSTED with a `retry-after` trailer).
"""
from dataclasses import dataclass

from pdserve.gateway.front.tool_prompt import ToolPrompt
from pdserve.protocol import errors
from pdserve.protocol.outputs import TokenLogprobs
from pdserve.protocol.sampling_params import SamplingParams


class UnavailableError(errors.UnavailableError):
    """The request cannot be served now (no live replica, a backend is down): retry later.

    Fronts report it as HTTP 503 / gRPC UNAVAILABLE. More specific gateway errors (such as the
    router finding no replica) subclass it.
    """


RETRY_AFTER_S = 1
"""What a refused client is told to wait before retrying (whole seconds, as HTTP's header)."""


class OverloadedError(errors.ResourceExhaustedError):
    """The gateway, or the replica a request needs, holds as much as it may: retry after
    `retry_after_s`."""

    def __init__(self, message: str, retry_after_s: int = RETRY_AFTER_S):
        super().__init__(message)
        self.retry_after_s = retry_after_s


@dataclass(frozen=True, slots=True)
class GenerateInput:
    """One generation request. Exactly one of prompt / prompt_token_ids / messages is set.

    `messages`, when set, is a non-empty list whose every message has a non-empty string role and
    a string content, whichever front built it; otherwise construction raises
    InvalidRequestError naming the message.
    """

    request_id: str | None  # None: the frontend assigns one
    prompt: str | None = None
    prompt_token_ids: list[int] | None = None
    messages: list[dict] | None = None  # [{"role": str, "content": str}], rendered with the chat template
    tool_prompt: ToolPrompt | None = None  # with messages: the tools the chat template is given
    params: SamplingParams = SamplingParams()
    # True when the client gave no max_tokens: the frontend then lowers params.max_tokens to the
    # room left in the context (max_model_len - prompt tokens) instead of rejecting the request.
    max_tokens_is_default: bool = False
    owner: str = ""  # the fingerprint of the caller's API key (gateway.front.api_keys); "" on an open API

    def __post_init__(self) -> None:
        if self.messages is not None and not self.messages:
            raise errors.InvalidRequestError("messages=[]: must not be empty")
        for index, message in enumerate(self.messages or ()):
            role, content = message.get("role"), message.get("content")
            if not isinstance(role, str) or not role:
                raise errors.InvalidRequestError(f"messages[{index}].role={role!r}: must be a non-empty string")
            if not isinstance(content, str):
                raise errors.InvalidRequestError(f"messages[{index}].content={content!r}: must be a string")


@dataclass(frozen=True, slots=True)
class StreamChunk:
    request_id: str
    token_ids: list[int]  # tokens new in this chunk
    text: str  # text new in this chunk; never half a UTF-8 character
    logprobs: list[TokenLogprobs]  # one per new token when params.logprobs is set, else empty
    finish_reason: str | None  # None until the last chunk: "stop" | "length" | "abort"
    stop_reason: int | str | None  # the stop token id or stop string that ended the request
    prompt_tokens: int
    completion_tokens: int  # generated so far, this chunk included
