"""SamplingParams: every bad field is rejected by name, good values are normalised."""
import dataclasses
import math

import pytest

from pdserve.protocol.errors import InvalidRequestError, PdserveError
from pdserve.protocol.sampling_params import MAX_FLOAT32, MAX_LOGPROBS, MAX_TOKEN_ID, MAX_UINT32, MAX_UINT64, SamplingParams

BAD_FIELDS = [
    ("max_tokens", 0),
    ("max_tokens", -3),
    ("max_tokens", 2.0),
    ("max_tokens", True),
    ("max_tokens", MAX_UINT32 + 1),
    ("temperature", -0.1),
    ("temperature", math.nan),
    ("temperature", math.inf),
    ("temperature", "1.0"),
    ("temperature", 1e300),  # finite as a double, inf as the float32 it travels in
    ("temperature", 10**400),
    ("top_k", -2),
    ("top_k", MAX_TOKEN_ID + 1),
    ("top_k", 3.5),
    ("top_k", False),
    ("top_p", 0.0),
    ("top_p", 1.01),
    ("top_p", math.nan),
    ("min_p", -0.01),
    ("min_p", 1.5),
    ("min_p", math.nan),
    ("seed", 1.5),
    ("seed", "42"),
    ("seed", -1),
    ("seed", MAX_UINT64 + 1),
    ("stop", ["ok", ""]),
    ("stop", [7]),
    ("stop", 7),
    ("stop_token_ids", [-1]),
    ("stop_token_ids", ["2"]),
    ("stop_token_ids", [MAX_TOKEN_ID + 1]),
    ("ignore_eos", 1),
    ("logprobs", -1),
    ("logprobs", MAX_LOGPROBS + 1),
    ("logprobs", 1.0),
    ("include_stop_str_in_output", "yes"),
    ("presence_penalty", 2.01),
    ("presence_penalty", -2.5),
    ("presence_penalty", math.nan),
    ("presence_penalty", "1"),
    ("frequency_penalty", 3.0),
    ("frequency_penalty", -math.inf),
    ("repetition_penalty", 2 * MAX_FLOAT32),
    ("repetition_penalty", 0.0),
    ("repetition_penalty", -1.0),
    ("repetition_penalty", math.inf),
    ("repetition_penalty", math.nan),
    ("min_tokens", -1),
    ("min_tokens", 17),  # above the default max_tokens of 16
    ("min_tokens", 2.0),
    ("logit_bias", {5: 100.5}),
    ("logit_bias", {5: -101}),
    ("logit_bias", {5: math.nan}),
    ("logit_bias", {-1: 1.0}),
    ("logit_bias", {2**31: 1.0}),
    ("logit_bias", {"5": 1.0}),
    ("logit_bias", {5: "1"}),
    ("logit_bias", [(5, 1.0), (5, 2.0)]),
    ("logit_bias", 7),
]


@pytest.mark.parametrize(("field", "value"), BAD_FIELDS)
def test_bad_field_is_rejected_with_its_name_and_value(field, value):
    with pytest.raises(InvalidRequestError) as raised:
        SamplingParams(**{field: value})
    message = str(raised.value)
    assert field in message
    assert repr(value) in message or repr(tuple(value)) in message or repr(dict(value)) in message


def test_invalid_request_error_is_a_domain_error_and_a_value_error():
    with pytest.raises(PdserveError):
        SamplingParams(max_tokens=0)
    with pytest.raises(ValueError):
        SamplingParams(max_tokens=0)


def test_defaults_and_boundary_values_are_accepted():
    SamplingParams()
    SamplingParams(max_tokens=1, temperature=0, top_k=1, top_p=1e-9, min_p=1.0, logprobs=0)
    SamplingParams(top_p=1.0, min_p=0.0, logprobs=MAX_LOGPROBS, seed=0, stop_token_ids=[0])
    SamplingParams(max_tokens=MAX_UINT32, top_k=MAX_TOKEN_ID, seed=MAX_UINT64, stop_token_ids=[MAX_TOKEN_ID],
                   temperature=MAX_FLOAT32, repetition_penalty=MAX_FLOAT32)


@pytest.mark.parametrize("top_k", [0, -1, None])
def test_vllm_spellings_of_top_k_off_all_mean_off(top_k):
    assert SamplingParams(top_k=top_k).top_k is None


def test_stop_accepts_a_string_or_a_list_and_becomes_a_tuple():
    assert SamplingParams(stop="###").stop == ("###",)
    assert SamplingParams(stop=["a", "b"]).stop == ("a", "b")
    assert SamplingParams(stop=None).stop == ()
    assert SamplingParams(stop_token_ids=[3, 4]).stop_token_ids == (3, 4)


def test_params_are_frozen_and_hashable():
    params = SamplingParams(stop=["x"], stop_token_ids=[1])
    assert hash(params) == hash(SamplingParams(stop=("x",), stop_token_ids=(1,)))
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.temperature = 0.5


def test_zero_temperature_is_greedy():
    assert SamplingParams(temperature=0.0).is_greedy
    assert SamplingParams(temperature=0).is_greedy
    assert not SamplingParams(temperature=0.7).is_greedy
    assert not SamplingParams().is_greedy


def test_penalty_boundaries_are_accepted_and_defaults_adjust_nothing():
    assert not SamplingParams().adjusts_logits
    params = SamplingParams(max_tokens=4, presence_penalty=-2.0, frequency_penalty=2.0,
                            repetition_penalty=1e-3, min_tokens=4, logit_bias={3: -100, 1: 100.0})
    assert params.uses_penalties and params.adjusts_logits
    assert SamplingParams(min_tokens=1).adjusts_logits and not SamplingParams(min_tokens=1).uses_penalties
    assert SamplingParams(logit_bias={0: 0.5}).adjusts_logits


def test_logit_bias_becomes_sorted_pairs_of_int_and_float():
    params = SamplingParams(logit_bias={9: 1, 2: -0.5})
    assert params.logit_bias == ((2, -0.5), (9, 1.0))
    assert params == SamplingParams(logit_bias=[(9, 1.0), (2, -0.5)])
    assert hash(params) == hash(SamplingParams(logit_bias={2: -0.5, 9: 1.0}))
    assert SamplingParams(logit_bias=None).logit_bias == ()
