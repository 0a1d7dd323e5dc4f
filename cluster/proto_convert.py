"""Conversions between protobuf messages and engine types, shared by all services.

Unset optional proto fields take the engine's (vLLM's) defaults, so a client that sends an empty
`SamplingParams` gets what a vLLM user expects.
"""
from __future__ import annotations

from pdserve.protocol.outputs import TokenLogprobs
from pdserve.protocol.sampling_params import SamplingParams
from pdserve.protocol.structured_output import StructuredOutput
from pdserve.v1 import common_pb2

_DEFAULTS = SamplingParams()
FINISH_REASONS = {
    None: common_pb2.FINISH_REASON_UNSPECIFIED,
    "stop": common_pb2.FINISH_REASON_STOP,
    "length": common_pb2.FINISH_REASON_LENGTH,
    "abort": common_pb2.FINISH_REASON_ABORT,
}
FINISH_REASON_NAMES = {number: name for name, number in FINISH_REASONS.items()}


def params_from_proto(msg: common_pb2.SamplingParams) -> SamplingParams:
    """Raises InvalidRequestError (from SamplingParams) for out-of-range values."""
    def get(field: str):
        return getattr(msg, field) if msg.HasField(field) else getattr(_DEFAULTS, field)

    return SamplingParams(
        max_tokens=get("max_tokens"),
        temperature=get("temperature"),
        top_k=msg.top_k if msg.HasField("top_k") else None,
        top_p=get("top_p"),
        min_p=get("min_p"),
        seed=msg.seed if msg.HasField("seed") else None,
        stop=tuple(msg.stop),
        stop_token_ids=tuple(msg.stop_token_ids),
        ignore_eos=msg.ignore_eos,
        logprobs=msg.logprobs if msg.HasField("logprobs") else None,
        include_stop_str_in_output=msg.include_stop_str_in_output,
        presence_penalty=get("presence_penalty"),
        frequency_penalty=get("frequency_penalty"),
        repetition_penalty=get("repetition_penalty"),
        min_tokens=get("min_tokens"),
        logit_bias=dict(msg.logit_bias),
        structured_output=structured_output_from_proto(msg.structured_output)
        if msg.HasField("structured_output") else None,
    )


def params_to_proto(params: SamplingParams) -> common_pb2.SamplingParams:
    msg = common_pb2.SamplingParams(
        max_tokens=params.max_tokens, temperature=params.temperature, top_p=params.top_p,
        min_p=params.min_p, stop=list(params.stop), stop_token_ids=list(params.stop_token_ids),
        ignore_eos=params.ignore_eos, include_stop_str_in_output=params.include_stop_str_in_output,
        presence_penalty=params.presence_penalty, frequency_penalty=params.frequency_penalty,
        repetition_penalty=params.repetition_penalty, min_tokens=params.min_tokens,
        logit_bias=dict(params.logit_bias))
    if params.top_k is not None:
        msg.top_k = params.top_k
    if params.seed is not None:
        msg.seed = params.seed
    if params.logprobs is not None:
        msg.logprobs = params.logprobs
    if params.structured_output is not None:
        msg.structured_output.CopyFrom(structured_output_to_proto(params.structured_output))
    return msg


def structured_output_from_proto(msg: common_pb2.StructuredOutput) -> StructuredOutput:
    """Raises InvalidRequestError (from StructuredOutput) for an empty or malformed constraint."""
    match msg.WhichOneof("constraint"):
        case "json_schema":
            return StructuredOutput(json=msg.json_schema)
        case "choice":
            return StructuredOutput(choice=tuple(msg.choice.choices))
        case None:
            return StructuredOutput()  # refused: names the fields to give
        case name:
            return StructuredOutput(**{name: getattr(msg, name)})


def structured_output_to_proto(constraint: StructuredOutput) -> common_pb2.StructuredOutput:
    match constraint.kind:
        case "json":
            return common_pb2.StructuredOutput(json_schema=constraint.json)
        case "choice":
            return common_pb2.StructuredOutput(choice=common_pb2.Choices(choices=list(constraint.choice)))
        case name:
            return common_pb2.StructuredOutput(**{name: getattr(constraint, name)})


def logprobs_to_proto(logprobs: TokenLogprobs) -> common_pb2.TokenLogprob:
    return common_pb2.TokenLogprob(
        token_id=logprobs.token_id, logprob=logprobs.logprob,
        top_token_ids=list(logprobs.top_ids), top_logprobs=list(logprobs.top_logprobs))


def logprobs_from_proto(msg: common_pb2.TokenLogprob) -> TokenLogprobs:
    return TokenLogprobs(token_id=msg.token_id, logprob=msg.logprob,
                         top_ids=tuple(msg.top_token_ids), top_logprobs=tuple(msg.top_logprobs))
