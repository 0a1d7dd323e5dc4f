"""Fixtures of tests/gateway: a byte-level tokenizer, and a real aiohttp server on a loopback port,
in a thread with its own event loop, in front of a fake frontend whose token stream is fully known.

The fake generates the words of VOCAB in order, one token each, honouring max_tokens,
stop strings, include_stop_str_in_output, logprobs and seed (a choice's first token is shifted
by its seed, so choices with different seeds differ). A few prompts change its behaviour:
SLOW streams forever (until closed), UNAVAILABLE, INVALID and BUSY (a replica at its bound) fail
before the first token, FAIL_MIDWAY and BUSY_MIDWAY after two tokens. With `script` set, every
generation streams those texts instead, one chunk each, and stops. It records every
GenerateInput it received, and every generation that was closed before it finished (what the
real frontend turns into an abort). `grpc_gateway` serves the gRPC Gateway over the same fake.
"""
import asyncio
import json
import re
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass

import grpc
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from pdserve.protocol.errors import InvalidRequestError
from pdserve.protocol.outputs import TokenLogprobs
from pdserve.gateway.front.frontend_types import GenerateInput, OverloadedError, StreamChunk, UnavailableError
from pdserve.gateway.front.admission import DEFAULT_MAX_PENDING_REQUESTS, Admission
from pdserve.gateway.front.api_keys import ApiKeys
from pdserve.gateway.front.grpc_service import GatewayService
from pdserve.gateway.front.http_api import create_app
from pdserve.gateway.front.metrics import GatewayMetrics
from pdserve.v1 import gateway_pb2

MODEL = "fake-model"
MAX_MODEL_LEN = 4096
VOCAB = {100: " Hello", 101: ",", 102: " wörld", 103: "!"}  # token id -> text
SAMPLED_LOGPROB = -0.25
RUNNER_UP_LOGPROB = -2.0
SLOW, UNAVAILABLE, INVALID, FAIL_MIDWAY = "slow", "unavailable", "invalid", "fail midway"
BUSY, BUSY_MIDWAY = "busy", "busy midway"
GENERATE = "/pdserve.v1.Gateway/Generate"
BUSY_MESSAGE = "d0: the replica's waiting queue holds 1 requests, its maximum (--max-waiting-requests)"
TOKEN_INTERVAL_S = 0.002
SLOW_TOKEN_INTERVAL_S = 0.02


def fake_token_id(position: int) -> int:
    return 100 + position % len(VOCAB)


def fake_text(num_tokens: int) -> str:
    return "".join(VOCAB[fake_token_id(i)] for i in range(num_tokens))


FAKE_VOCAB_SIZE = 200
BOS = 1  # opens each chat message in FakePrompts


class FakeTokenizer:
    def decode(self, token_ids: list[int]) -> str:
        return "".join(VOCAB.get(token_id, f"<{token_id}>") for token_id in token_ids)


class FakePrompts:
    """Tokenizes text made of VOCAB's pieces; a chat message is BOS then its content."""

    vocab_size = FAKE_VOCAB_SIZE
    _ids = {text: token_id for token_id, text in VOCAB.items()}
    _pieces = re.compile("|".join(re.escape(text) for text in VOCAB.values()))

    def __init__(self) -> None:
        self.inputs: list[GenerateInput] = []

    def prompt_ids(self, request: GenerateInput) -> list[int]:
        self.inputs.append(request)
        if request.messages is not None:
            return [token_id for message in request.messages for token_id in [BOS, *self._encode(message["content"])]]
        ids = self._encode(request.prompt)
        if not ids:
            raise InvalidRequestError("prompt is empty")
        return ids

    async def encode(self, request: GenerateInput) -> list[int]:
        return self.prompt_ids(request)

    def _encode(self, text: str) -> list[int]:
        return [self._ids[piece] for piece in self._pieces.findall(text)]


class FakeFrontend:
    model_name = MODEL
    max_model_len = MAX_MODEL_LEN

    def __init__(self) -> None:
        self.tokenizer = FakeTokenizer()
        self.prompts = FakePrompts()
        self.healthy = True
        self.inputs: list[GenerateInput] = []
        self.closed_early: list[str] = []
        self.generation_started = threading.Event()
        self.closed_early_seen = threading.Event()
        self.script: list[str] | None = None  # texts every generation streams, one chunk each
        self._num_requests = 0

    def health(self) -> bool:
        return self.healthy

    async def abort(self, request_id: str, owner: str) -> bool:
        return False

    async def generate(self, request: GenerateInput):
        self.inputs.append(request)
        self._num_requests += 1
        request_id = request.request_id or f"fake-{self._num_requests}"
        prompt = request.prompt or ""
        if prompt == UNAVAILABLE:
            raise UnavailableError("no live decode replica")
        if prompt == INVALID:
            raise InvalidRequestError("prompt is too long: 5000 tokens, max_model_len 4096")
        if prompt == BUSY:
            raise OverloadedError(BUSY_MESSAGE)
        params = request.params
        prompt_tokens = len(request.prompt_token_ids or request.messages or prompt.split())
        if self.script is not None:
            for position, text in enumerate(self.script, start=1):
                await asyncio.sleep(TOKEN_INTERVAL_S)
                last = position == len(self.script)
                yield StreamChunk(request_id=request_id, token_ids=[fake_token_id(position)], text=text, logprobs=[],
                                  finish_reason="stop" if last else None, stop_reason=None,
                                  prompt_tokens=prompt_tokens, completion_tokens=position)
            return
        text, emitted = "", 0
        finished = False
        position = 0
        self.generation_started.set()
        try:
            while not finished:
                await asyncio.sleep(SLOW_TOKEN_INTERVAL_S if prompt == SLOW else TOKEN_INTERVAL_S)
                if prompt == FAIL_MIDWAY and position == 2:
                    raise UnavailableError("the decode replica went away")
                if prompt == BUSY_MIDWAY and position == 2:
                    raise OverloadedError(BUSY_MESSAGE)
                token_id = fake_token_id(position + (params.seed or 0))
                position += 1
                text += VOCAB[token_id]
                finish_reason, stop_reason, visible = None, None, text
                for stop in params.stop:
                    if stop in text:
                        cut = text.index(stop) + (len(stop) if params.include_stop_str_in_output else 0)
                        finish_reason, stop_reason, visible = "stop", stop, text[:cut]
                        break
                if finish_reason is None and position >= params.max_tokens and prompt != SLOW:
                    finish_reason = "length"
                logprobs = []
                if params.logprobs is not None:
                    top = ((token_id, SAMPLED_LOGPROB), (fake_token_id(position + (params.seed or 0)), RUNNER_UP_LOGPROB))
                    top = top[: params.logprobs]
                    top_ids, top_logprobs = tuple(i for i, _ in top), tuple(lp for _, lp in top)
                    logprobs = [TokenLogprobs(token_id, SAMPLED_LOGPROB, top_ids, top_logprobs)]
                finished = finish_reason is not None
                yield StreamChunk(
                    request_id=request_id,
                    token_ids=[token_id],
                    text=visible[emitted:],
                    logprobs=logprobs,
                    finish_reason=finish_reason,
                    stop_reason=stop_reason,
                    prompt_tokens=prompt_tokens,
                    completion_tokens=position,
                )
                emitted = len(visible)
        finally:
            if not finished:
                self.closed_early.append(request_id)
                self.closed_early_seen.set()


@dataclass(frozen=True)
class HttpResult:
    status: int
    content_type: str
    text: str
    headers: dict[str, str]

    def json(self):
        return json.loads(self.text)


@dataclass
class Server:
    base_url: str  # http://127.0.0.1:<port>
    frontend: FakeFrontend
    metrics: GatewayMetrics

    def request(
        self, method: str, path: str, *, json_body: object = None, raw_body: bytes | None = None,
        content_type: str = "application/json",
    ) -> HttpResult:
        """One plain HTTP request (stdlib client); error statuses are returned, not raised."""
        data = raw_body if raw_body is not None else None if json_body is None else json.dumps(json_body).encode()
        request = urllib.request.Request(
            self.base_url + path, data=data, method=method, headers={"Content-Type": content_type}
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return HttpResult(response.status, response.headers["Content-Type"], response.read().decode(),
                                  dict(response.headers))
        except urllib.error.HTTPError as error:
            with error:
                return HttpResult(error.code, error.headers["Content-Type"], error.read().decode(), dict(error.headers))


@pytest.fixture
def server(request):
    """Indirect parametrisation picks aiohttp's handler_cancellation (default off, as in aiohttp)."""
    handler_cancellation = getattr(request, "param", False)
    frontend = FakeFrontend()
    metrics = GatewayMetrics(MODEL)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def start() -> web.AppRunner:
        runner = web.AppRunner(create_app(frontend, metrics), handler_cancellation=handler_cancellation)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return runner

    runner = asyncio.run_coroutine_threadsafe(start(), loop).result(timeout=10)
    host, port = runner.addresses[0][:2]
    try:
        yield Server(f"http://{host}:{port}", frontend, metrics)
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


@pytest.fixture
def client(server):
    """The official openai client pointed at the server; no retries, so errors surface at once."""
    import openai

    with openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=10) as client:
        yield client


@pytest.fixture(scope="session")
def byte_tokenizer() -> PreTrainedTokenizerFast:
    """One token per byte, plus `<eos>` (id 0): the text of a token sequence is easy to predict."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=len(alphabet) + 1, initial_alphabet=alphabet,
                                  special_tokens=["<eos>"], show_progress=False)
    tokenizer.train_from_iterator(["a"], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<eos>", clean_up_tokenization_spaces=False)


class NoRecords:
    async def get(self, request_id: str) -> None:
        return None


@pytest.fixture
def grpc_gateway():
    """The Gateway service on a loopback port, over the same fake frontend as the HTTP tests;
    yields a callable that sends raw request bytes to Generate and returns the chunks, and the
    frontend it drives."""
    frontend = FakeFrontend()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def start() -> tuple[grpc.aio.Server, int]:
        server = grpc.aio.server()
        GatewayService(frontend, NoRecords(), ApiKeys(()),
                       Admission(DEFAULT_MAX_PENDING_REQUESTS, CollectorRegistry(), MODEL)).add_to_server(server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        return server, port

    server, port = asyncio.run_coroutine_threadsafe(start(), loop).result(timeout=10)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    generate = channel.unary_stream(GENERATE, response_deserializer=gateway_pb2.GenerateChunk.FromString)
    try:
        yield (lambda request_bytes: list(generate(request_bytes, timeout=10))), frontend
    finally:
        channel.close()
        asyncio.run_coroutine_threadsafe(server.stop(None), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()
