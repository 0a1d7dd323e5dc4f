"""Penalties, min_tokens and logit_bias: the batched sampler equals a plain per-request reference,
for every mix of parameters in one batch, rows with none among them, greedy and random alike."""
import dataclasses
import random

import pytest
import torch

from pdserve.engine.logits_processors import apply_logits_processors
from pdserve.protocol.sampling_params import SamplingParams
from tests.engine.sampling_on_cpu import sample, staged_inputs

VOCAB_SIZE = 48
EOS = 2


def reference_row(logits_row: torch.Tensor, params: SamplingParams, prompt: list[int], output: list[int],
                  eos_token_id: int | None) -> torch.Tensor:
    """vLLM's order, one token at a time, in float32 like the batched code."""
    z = logits_row.clone()  # [vocab_size] float32
    f32 = lambda value: torch.tensor(value, dtype=torch.float32)  # noqa: E731
    if len(output) < params.min_tokens:
        stops = set(params.stop_token_ids) | ({eos_token_id} if not params.ignore_eos else set())
        for token_id in stops:
            if token_id is not None and token_id < len(z):
                z[token_id] = float("-inf")
    for token_id, bias in params.logit_bias:
        z[token_id] = z[token_id] + f32(bias)
    if params.repetition_penalty != 1:
        penalty = f32(params.repetition_penalty)
        for token_id in set(prompt) | set(output):
            z[token_id] = z[token_id] / penalty if z[token_id] > 0 else z[token_id] * penalty
    for token_id in set(output):
        z[token_id] = z[token_id] - f32(params.frequency_penalty) * f32(output.count(token_id))
        z[token_id] = z[token_id] - f32(params.presence_penalty)
    return z


def adjustments(params: list[SamplingParams], prompts: list[list[int]], outputs: list[list[int]]):
    """What the logits processors read for these rows (seeds and positions only matter to the draw)."""
    return staged_inputs(params, [0] * len(params), [0] * len(params), VOCAB_SIZE, prompts, outputs, EOS)


def plain(params: SamplingParams) -> SamplingParams:
    """The same params without the logits adjustments, for sampling already-processed logits."""
    return dataclasses.replace(params, presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0,
                               min_tokens=0, logit_bias=())


def random_case(rng: random.Random, num_rows: int):
    params, prompts, outputs = [], [], []
    for _ in range(num_rows):
        uses = rng.random() < 0.75  # some rows use nothing
        max_tokens = rng.randint(1, 40)
        params.append(SamplingParams(
            max_tokens=max_tokens,
            temperature=rng.choice([0.0, 0.7, 1.3]),
            top_k=rng.choice([None, 5]),
            top_p=rng.choice([1.0, 0.9]),
            stop_token_ids=rng.sample(range(VOCAB_SIZE + 5), rng.randint(0, 2)),  # some out of vocab
            ignore_eos=rng.random() < 0.3,
            presence_penalty=rng.choice([0.0, -1.5, 0.5, 2.0]) if uses else 0.0,
            frequency_penalty=rng.choice([0.0, -0.3, 1.0, 2.0]) if uses else 0.0,
            repetition_penalty=rng.choice([1.0, 0.5, 1.3, 2.0]) if uses else 1.0,
            min_tokens=rng.randint(0, max_tokens) if uses else 0,
            logit_bias={t: rng.uniform(-100, 100) for t in rng.sample(range(VOCAB_SIZE), rng.randint(0, 3))}
            if uses else {},
        ))
        prompts.append([rng.randrange(VOCAB_SIZE) for _ in range(rng.randint(1, 30))])
        outputs.append([rng.randrange(8) for _ in range(rng.randint(0, 25))])  # few ids: many repeats
    return params, prompts, outputs


@pytest.mark.parametrize("case_seed", range(25))
def test_batched_processing_equals_the_per_request_reference(case_seed):
    rng = random.Random(case_seed)
    num_rows = rng.randint(1, 9)
    params, prompts, outputs = random_case(rng, num_rows)
    logits = torch.randn(num_rows, VOCAB_SIZE, generator=torch.Generator().manual_seed(case_seed)) * 3
    raw = logits.clone()

    processed = apply_logits_processors(logits, adjustments(params, prompts, outputs))

    expected = torch.stack([reference_row(logits[i], params[i], prompts[i], outputs[i], EOS)
                            for i in range(num_rows)])
    torch.testing.assert_close(processed, expected, rtol=0, atol=0)
    assert torch.equal(logits, raw)  # the raw logits stay for logprobs


@pytest.mark.parametrize("case_seed", range(25))
def test_sampling_applies_the_adjustments_before_temperature_and_the_draw(case_seed):
    rng = random.Random(1000 + case_seed)
    num_rows = rng.randint(1, 9)
    params, prompts, outputs = random_case(rng, num_rows)
    logits = torch.randn(num_rows, VOCAB_SIZE, generator=torch.Generator().manual_seed(case_seed))
    seeds = [rng.randrange(2**32) for _ in range(num_rows)]
    positions = [len(p) + len(o) for p, o in zip(prompts, outputs)]

    batched = sample(logits, params, seeds, positions, prompt_token_ids=prompts, output_token_ids=outputs,
                     eos_token_id=EOS)

    for i in range(num_rows):
        z = reference_row(logits[i], params[i], prompts[i], outputs[i], EOS)[None]
        alone = sample(z, [plain(params[i])], [seeds[i]], [positions[i]])
        assert batched.token_ids[i] == alone.token_ids[0]


def test_min_tokens_keeps_eos_and_stop_tokens_from_being_drawn_until_reached():
    logits = torch.zeros(1, VOCAB_SIZE)
    logits[0, [EOS, 7]] = 50.0  # EOS and stop token 7 dominate
    params = SamplingParams(max_tokens=10, temperature=0.0, min_tokens=3, stop_token_ids=[7])
    drawn = [sample(logits, [params], [0], [5 + n], prompt_token_ids=[[1]], output_token_ids=[[4] * n],
                    eos_token_id=EOS).token_ids[0] for n in range(5)]
    assert drawn[:3] == [0, 0, 0]  # the best token left: ties go to the lowest id
    assert drawn[3:] == [EOS, EOS]


def test_logit_bias_can_force_or_ban_a_token():
    logits = torch.randn(4, VOCAB_SIZE, generator=torch.Generator().manual_seed(0))
    forced = SamplingParams(temperature=1.0, logit_bias={11: 100.0})
    banned_id = int(logits[0].argmax())
    banned = SamplingParams(temperature=0.0, logit_bias={banned_id: -100.0})
    history = {"prompt_token_ids": [[1]] * 4, "output_token_ids": [[]] * 4}
    assert sample(logits, [forced] * 4, [1, 2, 3, 4], [1] * 4, **history).token_ids == [11] * 4
    assert sample(logits[:1], [banned], [0], [1], prompt_token_ids=[[1]], output_token_ids=[[]]).token_ids[0] \
        != banned_id


def test_each_penalty_moves_greedy_off_the_tokens_it_covers():
    logits = torch.zeros(1, VOCAB_SIZE)
    logits[0, 3], logits[0, 4], logits[0, 5] = 3.0, 3.5, 2.0  # 3 is in the prompt, 4 twice in the output
    greedy = lambda **kw: sample(logits, [SamplingParams(temperature=0.0, **kw)], [0], [3],  # noqa: E731
                                 prompt_token_ids=[[3]], output_token_ids=[[4, 4]]).token_ids[0]
    assert greedy() == 4
    assert greedy(repetition_penalty=2.0) == 5  # prompt and output: 3 -> 1.5, 4 -> 1.75
    assert greedy(presence_penalty=0.6) == 3  # output only: 4 -> 2.9, 3 untouched
    assert greedy(presence_penalty=0.4) == 4  # 4 -> 3.1
    assert greedy(frequency_penalty=0.3) == 3  # per occurrence: 4 -> 3.5 - 2 * 0.3
    assert greedy(frequency_penalty=0.2) == 4  # 4 -> 3.1
    assert greedy(frequency_penalty=-2.0, repetition_penalty=2.0) == 4  # negative rewards repeats


def test_logprobs_stay_those_of_the_raw_logits():
    logits = torch.randn(1, VOCAB_SIZE, generator=torch.Generator().manual_seed(1))
    params = SamplingParams(temperature=0.0, logprobs=2, logit_bias={9: 100.0}, repetition_penalty=1.5)
    out = sample(logits, [params], [0], [2], prompt_token_ids=[[1, 2]], output_token_ids=[[]])
    raw = logits[0].log_softmax(dim=-1)
    assert out.token_ids == [9]
    assert out.logprobs[0].logprob == pytest.approx(raw[9].item(), abs=1e-5)
    assert list(out.logprobs[0].top_ids) == raw.topk(2).indices.tolist()


def test_a_batch_that_adjusts_nothing_is_returned_untouched():
    logits = torch.randn(3, VOCAB_SIZE)
    assert apply_logits_processors(logits, adjustments([SamplingParams()] * 3, [[1]] * 3, [[]] * 3)) is logits


def test_adjusting_params_without_the_token_history_is_an_error():
    with pytest.raises(ValueError, match="prompt_token_ids"):
        sample(torch.randn(1, VOCAB_SIZE), [SamplingParams(presence_penalty=1.0)], [0], [0])
