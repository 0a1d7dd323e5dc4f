"""`pdserve generate`: one streamed request to a running gateway's pdserve.v1.Gateway/Generate.

Each chunk is handed to a callback as it arrives (the command line prints its text at once);
the result is a `GenerateStats` measured on this side of the wire. The stream carries the
caller's deadline, so a stuck gateway ends in DEADLINE_EXCEEDED rather than a hang.
"""
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc

from pdserve.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc

_FINISH_REASON_PREFIX = "FINISH_REASON_"


@dataclass(frozen=True, slots=True)
class GenerateStats:
    num_tokens: int
    ttft_s: float | None  # request sent → first token received; None when no token came
    elapsed_s: float  # request sent → stream ended
    finish_reason: str  # "stop", "length", "abort", or "unspecified" if the stream just ended

    @property
    def tokens_per_s(self) -> float:
        return self.num_tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def summary(self) -> str:
        ttft = "n/a" if self.ttft_s is None else f"{self.ttft_s:.3f} s"
        return (f"{self.num_tokens} tokens, finish {self.finish_reason}, TTFT {ttft}, "
                f"total {self.elapsed_s:.3f} s, {self.tokens_per_s:.1f} tokens/s")


def build_request(
    prompt: str,
    *,
    chat: bool,
    max_tokens: int,
    temperature: float,
    top_p: float | None,
    top_k: int | None,
    seed: int | None,
    stop: Sequence[str],
) -> gateway_pb2.GenerateRequest:
    """A GenerateRequest; unset optional sampling fields keep the gateway's defaults."""
    params = common_pb2.SamplingParams(max_tokens=max_tokens, temperature=temperature, stop=stop)
    if top_p is not None:
        params.top_p = top_p
    if top_k is not None:
        params.top_k = top_k
    if seed is not None:
        params.seed = seed
    if chat:
        messages = gateway_pb2.ChatMessages(
            messages=[gateway_pb2.ChatMessage(role="user", content=prompt)])
        return gateway_pb2.GenerateRequest(chat=messages, params=params)
    return gateway_pb2.GenerateRequest(prompt=prompt, params=params)


def stream_generate(
    target: str,
    request: gateway_pb2.GenerateRequest,
    timeout_s: float,
    on_chunk: Callable[[gateway_pb2.GenerateChunk], None],
) -> GenerateStats:
    """Streams `request` from the gateway at `target` ("host:port"); raises grpc.RpcError.

    On KeyboardInterrupt the stream is cancelled (the gateway then aborts the request) before
    the interrupt propagates.
    """
    num_tokens = 0
    ttft_s = None
    finish_reason = common_pb2.FINISH_REASON_UNSPECIFIED
    with grpc.insecure_channel(target) as channel:
        started_s = time.perf_counter()
        call = gateway_pb2_grpc.GatewayStub(channel).Generate(request, timeout=timeout_s)
        try:
            for chunk in call:
                if chunk.token_ids and ttft_s is None:
                    ttft_s = time.perf_counter() - started_s
                num_tokens += len(chunk.token_ids)
                if chunk.finish_reason != common_pb2.FINISH_REASON_UNSPECIFIED:
                    finish_reason = chunk.finish_reason
                on_chunk(chunk)
        except KeyboardInterrupt:
            call.cancel()
            raise
        elapsed_s = time.perf_counter() - started_s
    reason_name = common_pb2.FinishReason.Name(finish_reason).removeprefix(_FINISH_REASON_PREFIX)
    return GenerateStats(num_tokens, ttft_s, elapsed_s, reason_name.lower())
