"""Structured outputs in the engine: every kind of constraint holds on a random model, greedy and
sampled, and ends the output when it is complete (EOS, finish_reason "stop"); a constrained row
leaves the other rows of its batch alone; a constraint that does not compile, or an output so far
that breaks it, is refused on admission and holds no block. In the sampler, a row draws only
what its token bitmask allows."""
import json
import re

import jsonschema
import pytest
import torch

from pdserve.engine import SamplingParams
from pdserve.engine.engine_config import EngineConfig
from pdserve.engine.llm_engine import LLMEngine
from pdserve.protocol.errors import InvalidRequestError
from pdserve.protocol.structured_output import StructuredOutput
from tests.engine.sampling_on_cpu import sample

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
        "scores": {"type": "array", "items": {"type": "number", "minimum": -1, "maximum": 1}, "maxItems": 3},
        "address": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10}},
                    "required": ["city"], "additionalProperties": False},
    },
    "required": ["name", "age", "role", "scores", "address"],
    "additionalProperties": False,
}
DATE = r"\d{4}-(0[1-9]|1[0-2])-\d{2}"
LARK = 'start: "SELECT " COLUMN (", " COLUMN)* " FROM t"\nCOLUMN: /[a-z]{1,6}/'
GBNF = 'root ::= "(" digits ("+" digits)* ")"\ndigits ::= [0-9] [0-9]?'


def matches(constraint: StructuredOutput, text: str) -> bool:
    match constraint.kind:
        case "json":
            jsonschema.validate(json.loads(text), json.loads(constraint.json))
            return True
        case "json_object":
            return isinstance(json.loads(text), dict)
        case "regex":
            return re.fullmatch(constraint.regex, text) is not None
        case "choice":
            return text in constraint.choice
    grammar = {LARK: r"SELECT [a-z]{1,6}(, [a-z]{1,6})* FROM t", GBNF: r"\(\d\d?(\+\d\d?)*\)"}[constraint.grammar]
    return re.fullmatch(grammar, text) is not None


CONSTRAINTS = [
    StructuredOutput(json=PERSON),
    StructuredOutput(json_object=True),
    StructuredOutput(regex=DATE),
    StructuredOutput(choice=("positive", "negative", "neutral")),
    StructuredOutput(grammar=LARK),
    StructuredOutput(grammar=GBNF),
]


@pytest.fixture(scope="module")
def engine(tiny_model):
    return LLMEngine(EngineConfig(model=tiny_model(), num_gpu_blocks=256, block_size=16))


def run_all(engine: LLMEngine) -> dict:
    finished = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                finished[output.request_id] = output.outputs[0]
    return finished


def test_every_constraint_holds_greedy_and_sampled_and_leaves_the_other_rows_alone(engine):
    free = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    engine.add_request("alone", "a free prompt", free)
    alone = run_all(engine)["alone"].token_ids

    engine.add_request("free", "a free prompt", free)
    for i, constraint in enumerate(CONSTRAINTS):
        for temperature in (0.0, 1.0):
            params = SamplingParams(max_tokens=200, temperature=temperature, seed=i, structured_output=constraint)
            engine.add_request(f"{constraint.kind}-{i}-{temperature}", "tell me something", params)
    outputs = run_all(engine)

    assert outputs.pop("free").token_ids == alone
    for request_id, output in outputs.items():
        assert output.finish_reason == "stop", f"{request_id} did not end: {output.text!r}"
        assert output.token_ids[-1] == engine.eos_token_id
        constraint = CONSTRAINTS[int(request_id.split("-")[-2])]
        assert matches(constraint, output.text), f"{request_id}: {output.text!r}"
    assert engine.allocator.num_free_blocks == engine.allocator.num_blocks


@pytest.mark.parametrize(("constraint", "reason"), [
    (StructuredOutput(regex="[a-"), "unclosed character class"),
    (StructuredOutput(grammar="start: undefined_rule"), "undefined_rule"),
    (StructuredOutput(json={"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}), "nowhere"),
])
def test_a_constraint_that_does_not_compile_is_refused_on_admission(engine, constraint, reason):
    with pytest.raises(InvalidRequestError, match=re.escape(reason)):
        engine.add_request("bad", "hi", SamplingParams(structured_output=constraint))
    assert not engine.has_unfinished_requests()
    assert engine.allocator.num_free_blocks == engine.allocator.num_blocks


def test_an_output_so_far_that_breaks_the_constraint_is_refused_on_resumption(engine):
    params = SamplingParams(max_tokens=20, structured_output=StructuredOutput(choice=("yes", "no")))
    not_yes_or_no = engine.tokenizer.encode("maybe")
    with pytest.raises(InvalidRequestError, match="does not match the structured output"):
        engine.add_request("resumed", "hi", params, output_token_ids=not_yes_or_no)
    assert not engine.has_unfinished_requests()


@pytest.mark.parametrize("field", ["ignore_eos", "min_tokens"])
def test_what_would_keep_a_complete_output_from_ending_is_refused(field):
    with pytest.raises(InvalidRequestError, match=f"{field}=.*structured output"):
        SamplingParams(structured_output=StructuredOutput(regex="a"), **{field: {"ignore_eos": True}.get(field, 2)})


@pytest.mark.parametrize("vocab_size", [64, 100])
def test_a_row_draws_only_what_its_bitmask_allows_and_reports_the_raw_logprobs(vocab_size):
    """Bit t of the little-endian int32 words allows token t, bit 31 (int32's sign) and a partial
    last word included; the other rows are left alone."""
    logits = torch.arange(vocab_size, dtype=torch.float32).repeat(3, 1)  # the last id is every row's argmax
    for allowed in ([0], [31], [32, 63], [vocab_size - 1 - 31, 5], list(range(0, vocab_size, 7))):
        bitmask = bytearray(4 * -(-vocab_size // 32))
        for token_id in allowed:
            bitmask[token_id // 8] |= 1 << token_id % 8
        constrained = StructuredOutput(regex="any: the bitmask decides")
        params = [SamplingParams(temperature=0, logprobs=0, structured_output=constrained),
                  SamplingParams(temperature=1.0, structured_output=constrained), SamplingParams(temperature=0)]
        result = sample(logits, params, seeds=[1, 2, 3], positions=[5, 5, 5],
                        token_bitmasks=[bytes(bitmask), bytes(bitmask)])
        assert result.token_ids[0] == max(allowed)
        assert result.token_ids[1] in allowed
        assert result.token_ids[2] == vocab_size - 1
        assert result.logprobs[0].logprob == pytest.approx(logits[0].log_softmax(-1)[max(allowed)].item())
