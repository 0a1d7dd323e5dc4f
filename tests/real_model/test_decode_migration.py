"""A decode migration on the real SmolLM2-135M-Instruct gives the tokens of an uninterrupted run.

tests/system/faults/test_decode_migration.py on the real model and real text: two decode replicas,
a prefill and a gateway as real processes; greedy and seeded sampled streams (penalties and
min_tokens included) and two that answer a chat turn under a JSON schema (greedy and sampled) run
once unharmed, then again while the decode replica serving one of the structured streams
mid-answer is killed with SIGKILL. Its requests re-prefill their prompt and streamed tokens on
the prefill and carry on on the survivor (a structured output's grammar replays the tokens so
far): no stream fails, every token equals the unharmed run's, logprobs agree to LOGPROB_TOL (the
resumed KV is computed in other batches), both structured answers validate against their schema,
and every KV block comes back.
"""
import asyncio
import json
import secrets

import jsonschema

import pytest

from pdserve.redis_process import start_redis
from pdserve.cluster.proto_convert import structured_output_to_proto
from pdserve.protocol.structured_output import StructuredOutput
from pdserve.protocol.tokenizer import load_tokenizer
from pdserve.v1 import common_pb2, gateway_pb2
from tests.system.conftest import Cluster
from tests.system.faults.conftest import StreamRun, migrations, request_info
from tests.system.faults.test_decode_migration import kill_mid_stream

pytestmark = pytest.mark.real_model

NUM_TOKENS = 64
KILL_AFTER_TOKENS = 8  # the kill strikes a structured stream with this many tokens
KILL_BEFORE_END = 8  # and at least this many still to come
LOGPROB_TOL = 1e-3  # float32; what differs is the batches the KV was computed in
PLANET = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 30},
        "moons": {"type": "integer", "minimum": 0, "maximum": 200},
        "rings": {"type": "boolean"},
        "atmosphere": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 4},
    },
    "required": ["name", "moons", "rings", "atmosphere"],
    "additionalProperties": False,
}
REPLICA_FLAGS = ("--dtype", "float32", "--num-gpu-blocks", "256")  # 4,096 tokens each, four streams of at most 250


@pytest.fixture(scope="module")
def cluster(smollm2_dir, tmp_path_factory):
    with start_redis(data_dir=tmp_path_factory.mktemp("redis")) as redis_server:
        cluster = Cluster(str(smollm2_dir), tmp_path_factory.mktemp("cluster"), redis_server.url, secrets.token_hex(32))
        try:
            for kind, name, flags in (("decode", "d0", REPLICA_FLAGS), ("decode", "d1", REPLICA_FLAGS),
                                      ("prefill", "p0", REPLICA_FLAGS), ("gateway", "gw", ())):
                cluster.start(kind, name, *flags)
            cluster.wait_ready()
            yield cluster
        finally:
            cluster.stop()
            for service in cluster.services:
                print(f"--- {service.name}\n{service.log_tail()}")


def stream_request(request_id: str, prompt_ids: list[int], sampled: bool) -> gateway_pb2.GenerateRequest:
    """Greedy, or seeded sampling with every logits processor that reads the tokens so far."""
    params = (common_pb2.SamplingParams(temperature=0.9, top_p=0.95, seed=1234, presence_penalty=0.8,
                                        frequency_penalty=0.4, repetition_penalty=1.3, min_tokens=32)
              if sampled else common_pb2.SamplingParams(temperature=0))
    params.max_tokens, params.ignore_eos, params.logprobs = NUM_TOKENS, True, 1
    return gateway_pb2.GenerateRequest(request_id=request_id, prompt_token_ids=gateway_pb2.TokenIds(ids=prompt_ids),
                                       params=params)


def structured_request(request_id: str, sampled: bool) -> gateway_pb2.GenerateRequest:
    """A chat turn answered as a PLANET, greedy or seeded sampling; it ends when the JSON does."""
    params = common_pb2.SamplingParams(max_tokens=200, temperature=0.8 if sampled else 0, seed=77, logprobs=1,
                                       structured_output=structured_output_to_proto(StructuredOutput(json=PLANET)))
    chat = gateway_pb2.ChatMessages(messages=[gateway_pb2.ChatMessage(role="user", content="Describe Saturn.")])
    return gateway_pb2.GenerateRequest(request_id=request_id, chat=chat, params=params)


def test_a_killed_decode_replicas_streams_carry_on_with_the_tokens_of_an_unharmed_run(cluster, corpus_ids,
                                                                                     smollm2_dir):
    prompts = [corpus_ids[start:start + n] for start, n in ((0, 40), (300, 120), (700, 185), (1200, 77))]
    requests = lambda prefix: [  # noqa: E731
        *(stream_request(f"{prefix}-{i}", prompt, sampled=i % 2 == 1) for i, prompt in enumerate(prompts)),
        structured_request(f"{prefix}-json", sampled=False), structured_request(f"{prefix}-json-sampled", sampled=True)]
    reference = asyncio.run(StreamRun(cluster.gateway.endpoint, requests("ref")).run())
    assert [outcome.error for outcome in reference] == [None] * (len(prompts) + 2)

    run = StreamRun(cluster.gateway.endpoint, requests("r"))
    structured = ["r-json", "r-json-sampled"]
    lengths = {request.request_id: len(want.token_ids) for request, want in zip(run.requests, reference)}
    outcomes = asyncio.run(run.run(kill_mid_stream(cluster, min_tokens=KILL_AFTER_TOKENS, min_left=KILL_BEFORE_END,
                                                   candidates=structured, lengths=lengths)))

    assert [outcome.error for outcome in outcomes] == [None] * (len(prompts) + 2)
    assert any(outcome.arrival_s[-1] > run.killed_s for outcome in outcomes)  # the kill was mid-stream
    assert migrations(cluster).get("decode_unavailable", 0) >= 1
    assert request_info(cluster, run.struck_request).decode_replica != run.victim  # a structured stream itself moved
    for i, (outcome, want) in enumerate(zip(outcomes, reference)):
        assert outcome.token_ids == want.token_ids, f"stream {i} differs from the unharmed run"
        assert outcome.logprobs == pytest.approx(want.logprobs, abs=LOGPROB_TOL)
    for outcome in outcomes[:len(prompts)]:
        assert outcome.last.finish_reason == common_pb2.FINISH_REASON_LENGTH
    tokenizer = load_tokenizer(smollm2_dir)
    for outcome in outcomes[len(prompts):]:
        assert outcome.last.finish_reason == common_pb2.FINISH_REASON_STOP
        jsonschema.validate(json.loads(tokenizer.decode(outcome.token_ids, skip_special_tokens=True)), PLANET)
    cluster.assert_all_kv_free()
