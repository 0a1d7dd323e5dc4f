"""SamplingParams cross the gRPC wire unchanged (in float32, the wire's type; a structured output as
the oneof of its constraint), and unset fields take the engine's defaults."""
import pytest

from pdserve.protocol.errors import InvalidRequestError
from pdserve.protocol.sampling_params import SamplingParams
from pdserve.protocol.structured_output import StructuredOutput
from pdserve.cluster.proto_convert import params_from_proto, params_to_proto
from pdserve.v1 import common_pb2


def test_every_field_survives_the_round_trip():
    params = SamplingParams(max_tokens=9, temperature=0.5, top_k=4, top_p=0.75, min_p=0.125, seed=3, stop=("x",),
                            stop_token_ids=(5,), ignore_eos=True, logprobs=2, include_stop_str_in_output=True,
                            presence_penalty=-1.5, frequency_penalty=0.25, repetition_penalty=1.25, min_tokens=2,
                            logit_bias={7: -100.0, 11: 2.5})
    assert params_from_proto(params_to_proto(params)) == params


def test_an_empty_message_is_the_default_params():
    assert params_from_proto(common_pb2.SamplingParams()) == SamplingParams()


def test_an_out_of_range_field_on_the_wire_is_refused_by_name():
    with pytest.raises(InvalidRequestError, match="frequency_penalty"):
        params_from_proto(common_pb2.SamplingParams(frequency_penalty=-3))
    with pytest.raises(InvalidRequestError, match="logit_bias"):
        params_from_proto(common_pb2.SamplingParams(logit_bias={-4: 1.0}))


@pytest.mark.parametrize("constraint", [
    StructuredOutput(json={"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}}}),
    StructuredOutput(json_object=True),
    StructuredOutput(regex=r"\d+"),
    StructuredOutput(choice=("yes", "no")),
    StructuredOutput(grammar='start: "x"+'),
], ids=lambda constraint: constraint.kind)
def test_every_structured_output_survives_the_round_trip(constraint):
    params = SamplingParams(max_tokens=9, structured_output=constraint)
    assert params_from_proto(params_to_proto(params)) == params


def test_an_empty_structured_output_on_the_wire_is_refused():
    with pytest.raises(InvalidRequestError, match="exactly one of"):
        params_from_proto(common_pb2.SamplingParams(structured_output=common_pb2.StructuredOutput()))
