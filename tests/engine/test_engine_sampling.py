"""Sampling through the whole engine: a seeded request gives the same tokens whatever runs
beside it and however it is scheduled (chunked, preempted and recomputed), and stop conditions,
logprobs and bad input behave as specified."""
import pytest
import torch

from pdserve.engine import LLM, SamplingParams
from pdserve.protocol.errors import InvalidRequestError
from tests.helpers import ENGINE_OPTIONS


@pytest.fixture(scope="module")
def model_dir(tiny_model):
    return tiny_model()


def prompts(n: int, seed: int = 3) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(5, 4096, (int(length),), generator=generator).tolist()
            for length in torch.randint(1, 120, (n,), generator=generator)]


PENALISED = dict(presence_penalty=0.5, frequency_penalty=0.3, repetition_penalty=1.3, min_tokens=6,
                 logit_bias={7: 5.0, 100: -100.0})


@pytest.mark.parametrize("adjustments", [{}, PENALISED], ids=["plain", "penalised"])
def test_seeded_sampling_is_independent_of_batch_and_schedule(model_dir, adjustments):
    params = SamplingParams(max_tokens=24, temperature=0.9, top_p=0.95, top_k=200, seed=1234, ignore_eos=True,
                            **adjustments)
    target = prompts(1, seed=99)[0]
    alone = LLM(model_dir, num_gpu_blocks=256).generate([target], params, use_tqdm=False)[0]

    crowded = LLM(model_dir, num_gpu_blocks=30, block_size=16, max_num_batched_tokens=48)
    others = [SamplingParams(max_tokens=24, temperature=1.0, seed=i, ignore_eos=True,
                             **(dict(frequency_penalty=-0.5 * (i % 3), min_tokens=i) if i % 2 else {}))
              for i in range(12)]  # half of them with adjustments of their own
    outputs = crowded.generate(prompts(12) + [target], others + [params], use_tqdm=False)

    assert crowded.engine.scheduler.num_preemptions > 0
    assert outputs[-1].outputs[0].token_ids == alone.outputs[0].token_ids
    unseeded = SamplingParams(max_tokens=24, temperature=0.9, ignore_eos=True)
    again = LLM(model_dir, **ENGINE_OPTIONS).generate([target], unseeded, use_tqdm=False)[0]
    assert again.outputs[0].token_ids != alone.outputs[0].token_ids  # a seed is drawn per request when none is given


def test_stop_string_truncates_text_and_streamed_deltas_add_up(model_dir):
    llm = LLM(model_dir, **ENGINE_OPTIONS)
    greedy = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    full = llm.generate(["Stop strings:"], greedy, use_tqdm=False)[0].outputs[0].text
    stop = full[10:13]
    engine = llm.engine
    engine.add_request("s", "Stop strings:", SamplingParams(max_tokens=30, temperature=0, ignore_eos=True, stop=[stop]))
    streamed, last = "", None
    while engine.has_unfinished_requests():
        for output in engine.step():
            streamed += output.new_text
            last = output
    completion = last.outputs[0]
    assert completion.finish_reason == "stop" and completion.stop_reason == stop
    assert completion.text == full[:full.index(stop)] == streamed
    assert engine.allocator.num_free_blocks == engine.allocator.num_blocks


def test_stop_token_and_max_tokens_finish_reasons(model_dir):
    llm = LLM(model_dir, **ENGINE_OPTIONS)
    greedy = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    tokens = llm.generate(["abc"], greedy, use_tqdm=False)[0].outputs[0].token_ids
    stopped = llm.generate(["abc"], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True,
                                                    stop_token_ids=[tokens[4]]), use_tqdm=False)[0].outputs[0]
    assert stopped.token_ids == tokens[:tokens.index(tokens[4]) + 1]
    assert (stopped.finish_reason, stopped.stop_reason) == ("stop", tokens[4])
    assert llm.generate(["abc"], greedy, use_tqdm=False)[0].outputs[0].finish_reason == "length"


def test_penalties_change_the_greedy_output_and_min_tokens_holds_off_a_forced_eos(model_dir):
    llm = LLM(model_dir, **ENGINE_OPTIONS)
    greedy = dict(max_tokens=16, temperature=0, ignore_eos=True)
    plain = llm.generate(["repeat"], SamplingParams(**greedy), use_tqdm=False)[0].outputs[0].token_ids
    penalised = llm.generate(["repeat"], SamplingParams(**greedy, frequency_penalty=2.0, presence_penalty=2.0),
                             use_tqdm=False)[0].outputs[0].token_ids
    assert penalised != plain
    assert len(set(penalised)) >= len(set(plain))

    eos = llm.engine.eos_token_id
    forced = SamplingParams(max_tokens=10, temperature=0.8, min_tokens=3, logit_bias={eos: 100.0})
    out = llm.generate(["forced"], forced, use_tqdm=False)[0].outputs[0]
    assert eos not in out.token_ids[:3]
    assert (len(out.token_ids), out.token_ids[-1], out.finish_reason) == (4, eos, "stop")


def test_logprobs_are_the_models_log_softmax(model_dir):
    llm = LLM(model_dir, **ENGINE_OPTIONS)
    out = llm.generate(["logprobs"], SamplingParams(max_tokens=4, temperature=0, logprobs=3),
                       use_tqdm=False)[0].outputs[0]
    assert len(out.logprobs) == 4
    for token_id, entry in zip(out.token_ids, out.logprobs):
        assert entry.token_id == token_id and entry.top_ids[0] == token_id  # greedy: the best token
        assert list(entry.top_logprobs) == sorted(entry.top_logprobs, reverse=True)
        assert entry.logprob == pytest.approx(entry.top_logprobs[0]) and entry.logprob <= 0


def test_bad_requests_raise_typed_errors_and_leave_no_blocks(model_dir):
    llm = LLM(model_dir, num_gpu_blocks=64, block_size=16)
    engine = llm.engine
    with pytest.raises(InvalidRequestError, match="context length"):
        engine.add_request("long", [5] * 2040, SamplingParams(max_tokens=100))
    with pytest.raises(InvalidRequestError, match="pool"):
        engine.add_request("huge", [5] * 1000, SamplingParams(max_tokens=100))  # 64 blocks hold 1024
    with pytest.raises(InvalidRequestError, match=r"\[0, 4096\)"):
        engine.add_request("vocab", [4096], SamplingParams())
    with pytest.raises(InvalidRequestError, match="empty"):
        engine.add_request("empty", [], SamplingParams())
    with pytest.raises(InvalidRequestError, match="top_p"):
        SamplingParams(top_p=0)
    with pytest.raises(InvalidRequestError, match=r"logit_bias.*\[0, 4096\)"):
        engine.add_request("bias", [5], SamplingParams(logit_bias={4096: 1.0}))
    assert not engine.has_unfinished_requests()
    assert engine.allocator.num_free_blocks == engine.allocator.num_blocks


def test_abort_frees_blocks_of_running_and_waiting_requests(model_dir):
    llm = LLM(model_dir, num_gpu_blocks=64, block_size=16, max_num_seqs=2)
    engine = llm.engine
    for i, prompt in enumerate(prompts(4)):
        engine.add_request(str(i), prompt, SamplingParams(max_tokens=50, ignore_eos=True))
    engine.step()
    engine.step()
    assert engine.allocator.num_free_blocks < engine.allocator.num_blocks
    for i in range(4):
        assert engine.abort_request(str(i))
    assert not engine.has_unfinished_requests()
    assert engine.allocator.num_free_blocks == engine.allocator.num_blocks
