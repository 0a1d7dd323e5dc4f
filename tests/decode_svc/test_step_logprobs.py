"""A step's output keeps the logprobs of its own tokens after later steps: the engine thread goes
on stepping while an output waits on the event loop to be sent, so the decode replica's message
for a step (and the colocated gateway's chunk) must be built from that step's values alone: its
logprobs, and its count of output tokens."""
from pdserve.decode_svc.service import _request_output
from pdserve.engine.output_processor import OutputProcessor
from pdserve.protocol.outputs import TokenLogprobs
from pdserve.engine.request import Request
from pdserve.protocol.sampling_params import SamplingParams
from pdserve.gateway.colocated.frontend import stream_chunk


def step_outputs(token_ids: list[int]):
    """Every step's output of one request, taken as the engine hands them over, then read after
    the last step (as a slow event loop reads them)."""
    processor = OutputProcessor(tokenizer=None, eos_token_id=None)
    request = Request("r", [1, 2, 3], SamplingParams(max_tokens=len(token_ids), logprobs=1), seed=0)
    processor.add(request)
    outputs = []
    for step, token_id in enumerate(token_ids):
        request.output_token_ids.append(token_id)
        logprobs = TokenLogprobs(token_id, -float(step), (token_id,), (-float(step),))
        outputs.append(processor.process("r", token_id, logprobs)[0])
    return outputs


def test_each_decode_message_holds_its_own_steps_logprobs():
    messages = [_request_output(output) for output in step_outputs([7, 8, 9])]
    assert [[(lp.token_id, lp.logprob) for lp in message.logprobs] for message in messages] == \
        [[(7, 0.0)], [(8, -1.0)], [(9, -2.0)]]


def test_each_colocated_chunk_holds_its_own_steps_logprobs():
    chunks = [stream_chunk(output) for output in step_outputs([7, 8, 9])]
    assert [[(lp.token_id, lp.logprob) for lp in chunk.logprobs] for chunk in chunks] == \
        [[(7, 0.0)], [(8, -1.0)], [(9, -2.0)]]


def test_each_colocated_chunk_counts_the_tokens_up_to_its_own_step():
    chunks = [stream_chunk(output) for output in step_outputs([7, 8, 9])]
    assert [chunk.completion_tokens for chunk in chunks] == [1, 2, 3]
