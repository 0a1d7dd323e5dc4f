"""Clients of both gateway fronts for the record and outage tests: one greedy stream through
gRPC Gateway.Generate or the OpenAI HTTP API (server-sent events), optionally cut by the client
after a number of tokens, plus what the gateway leaves behind: its request records in Redis and
its in-flight gauges."""
from __future__ import annotations

import json
import re
import urllib.request
from dataclasses import dataclass, field

import aiohttp
import grpc
import redis

from pdserve.v1 import common_pb2, gateway_pb2_grpc
from tests.system.faults.conftest import greedy_request

STREAM_TIMEOUT_S = 120.0
LIVE_STATES = ("QUEUED", "PREFILLING", "TRANSFERRING", "DECODING")
# Gauges of requests in flight: the gateway's, and the load the replicas last reported.
IN_FLIGHT_GAUGES = ("pdserve:num_requests_running", "pdserve:num_requests_waiting",
                    "pdserve:replica_num_requests_running", "pdserve:replica_num_requests_waiting",
                    "pdserve:replica_queued_prompt_tokens")


@dataclass
class FrontOutcome:
    request_id: str
    front: str  # "grpc" | "http"
    token_ids: list[int] = field(default_factory=list)  # gRPC only: HTTP streams text
    text: str = ""
    finish_reason: str | None = None  # as the front names it ("length", "FINISH_REASON_LENGTH")
    status: str | None = None  # how a refused request was refused: a gRPC code name or an HTTP status
    message: str = ""
    cut: bool = False  # the client left before the end


async def grpc_stream(stub: gateway_pb2_grpc.GatewayStub, request_id: str, prompt_ids: list[int], max_tokens: int,
                      cut_after: int | None = None) -> FrontOutcome:
    """One Generate stream; with `cut_after`, the client cancels it once that many tokens came."""
    outcome = FrontOutcome(request_id, "grpc")
    call = stub.Generate(greedy_request(request_id, prompt_ids, max_tokens), timeout=STREAM_TIMEOUT_S)
    try:
        if cut_after == 0:
            outcome.cut = call.cancel()
            return outcome
        async for chunk in call:
            outcome.token_ids += chunk.token_ids
            outcome.text += chunk.text
            if chunk.finish_reason:
                outcome.finish_reason = common_pb2.FinishReason.Name(chunk.finish_reason)
            if cut_after is not None and len(outcome.token_ids) >= cut_after and outcome.finish_reason is None:
                outcome.cut = call.cancel()
                break
    except grpc.aio.AioRpcError as exc:
        if exc.code() != grpc.StatusCode.CANCELLED or not outcome.cut:
            outcome.status, outcome.message = exc.code().name, exc.details() or ""
    return outcome


async def sse_stream(session: aiohttp.ClientSession, base_url: str, model: str, request_id: str,
                     prompt_ids: list[int], max_tokens: int, cut_after: int | None = None) -> FrontOutcome:
    """One streamed /v1/completions; with `cut_after`, the client closes the connection once that
    many content events came (0: as soon as the response starts)."""
    outcome = FrontOutcome(request_id, "http")
    body = {"model": model, "prompt": prompt_ids, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True}
    timeout = aiohttp.ClientTimeout(total=STREAM_TIMEOUT_S)
    async with session.post(f"{base_url}/v1/completions", json=body, headers={"X-Request-Id": request_id},
                            timeout=timeout) as response:
        if response.status != 200:
            outcome.status = str(response.status)
            outcome.message = (await response.json())["error"]["message"]
            return outcome
        num_events = 0
        async for line in response.content:
            if cut_after is not None and num_events >= cut_after and outcome.finish_reason is None:
                outcome.cut = True
                response.close()  # drops the connection, as a client that goes away does
                return outcome
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            event = json.loads(line[len(b"data: "):])
            if "error" in event:
                outcome.status, outcome.message = "error event", event["error"]["message"]
                return outcome
            for choice in event.get("choices", ()):
                num_events += 1
                outcome.text += choice["text"]
                outcome.finish_reason = choice.get("finish_reason") or outcome.finish_reason
    return outcome


def request_records(redis_url: str) -> dict[str, tuple[str, int, int]]:
    """Every request record in Redis: request id -> (state, record TTL ms, history TTL ms)."""
    client = redis.Redis.from_url(redis_url, decode_responses=True, socket_timeout=5)
    try:
        records = {}
        for key in client.scan_iter("req:*", count=1000):
            if key.endswith(":history"):
                continue
            records[key[len("req:"):]] = (client.hget(key, "state"), client.pttl(key), client.pttl(key + ":history"))
        return records
    finally:
        client.close()


def in_flight_gauges(http_port: int) -> dict[str, float]:
    """The sum of each in-flight gauge's samples on the gateway's /metrics (0 when it has none)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {name: sum(float(value) for value in re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text,
                                                             re.MULTILINE))
            for name in IN_FLIGHT_GAUGES}
