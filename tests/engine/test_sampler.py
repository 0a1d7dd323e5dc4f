"""sample(): greedy is argmax, random draws are a pure function of (seed, position, logits)."""
import pytest
import torch

from pdserve.engine.noise import exponential_noise, row_key
from pdserve.protocol.sampling_params import SamplingParams
from tests.engine.sampling_on_cpu import sample

VOCAB_SIZE = 64


def random_logits(num_rows: int, seed: int = 0, scale: float = 2.0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(num_rows, VOCAB_SIZE, generator=generator) * scale  # [num_rows, VOCAB_SIZE]


def draw_many(logits_row: torch.Tensor, params: SamplingParams, seed: int, num_draws: int) -> list[int]:
    """One token per position 0..num_draws-1, all from the same logits row, in one batch."""
    logits = logits_row.expand(num_draws, -1)
    return sample(logits, [params] * num_draws, [seed] * num_draws, list(range(num_draws))).token_ids


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_greedy_rows_take_the_argmax(dtype):
    logits = random_logits(8).to(dtype)
    out = sample(logits, [SamplingParams(temperature=0.0)] * 8, range(8), range(8))
    assert out.token_ids == logits.float().argmax(dim=-1).tolist()
    assert out.logprobs == [None] * 8


def test_greedy_ties_go_to_the_lowest_id():
    logits = torch.zeros(1, VOCAB_SIZE)
    logits[0, [7, 3, 40]] = 5.0
    assert sample(logits, [SamplingParams(temperature=0.0)], [1], [0]).token_ids == [3]


def test_a_row_draws_the_same_token_whatever_else_is_in_the_batch():
    logits = random_logits(6, scale=0.5)  # flat enough that draws vary
    params = [
        SamplingParams(temperature=0.8, top_k=20, top_p=0.9, min_p=0.01),
        SamplingParams(temperature=1.3),
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.0, top_p=0.5),
        SamplingParams(temperature=0.6, top_k=5),
        SamplingParams(temperature=1.0, min_p=0.2),
    ]
    seeds = [11, 22, 33, 44, 55, 66]
    for position in range(0, 200, 7):
        positions = [position + 3 * i for i in range(6)]
        batched = sample(logits, params, seeds, positions).token_ids
        alone = [
            sample(logits[i : i + 1], [params[i]], [seeds[i]], [positions[i]]).token_ids[0]
            for i in range(6)
        ]
        reversed_order = sample(logits.flip(0), params[::-1], seeds[::-1], positions[::-1]).token_ids
        assert batched == alone == reversed_order[::-1]


def test_same_seed_and_positions_repeat_the_same_draws():
    logits = random_logits(1, scale=0.5)
    params = SamplingParams(temperature=1.0)
    assert draw_many(logits[0], params, 5, 100) == draw_many(logits[0].clone(), params, 5, 100)


def test_different_seeds_or_positions_draw_differently():
    logits = random_logits(1, scale=0.3)[0]
    params = SamplingParams(temperature=1.0)
    draws = draw_many(logits, params, seed=1, num_draws=100)
    assert draws != draw_many(logits, params, seed=2, num_draws=100)
    assert len(set(draws)) > 20  # positions do not repeat the same noise


def noise_of(seeds: list[int], positions: list[int], vocab_size: int) -> torch.Tensor:
    keys = torch.tensor([row_key(seed, position) for seed, position in zip(seeds, positions)])  # [num_rows]
    return exponential_noise(keys, vocab_size)  # [num_rows, vocab_size]


def test_noise_is_exponential_and_depends_only_on_seed_and_position():
    noise = noise_of([3, 4, 3], [10, 10, 10], 50_000)  # [3, 50_000]
    assert torch.equal(noise[0], noise[2])
    assert not torch.equal(noise[0], noise[1])
    assert torch.equal(noise[1], noise_of([4], [10], 50_000)[0])
    assert (noise > 0).all()
    assert abs(noise.mean().item() - 1.0) < 0.02
    assert abs(noise.var().item() - 1.0) < 0.05


def test_top_k_one_and_tiny_top_p_equal_greedy():
    logits = random_logits(16)
    greedy = logits.argmax(dim=-1).tolist()
    for params in (SamplingParams(temperature=1.5, top_k=1), SamplingParams(temperature=1.5, top_p=1e-6)):
        for position in range(20):
            out = sample(logits, [params] * 16, range(100, 116), [position] * 16)
            assert out.token_ids == greedy


def test_top_k_only_draws_from_the_k_most_likely():
    logits = random_logits(1, scale=0.3)[0]
    draws = set(draw_many(logits, SamplingParams(temperature=2.0, top_k=4), seed=7, num_draws=2000))
    assert draws == set(logits.topk(4).indices.tolist())


def test_top_p_only_draws_from_the_nucleus():
    logits = torch.full((VOCAB_SIZE,), -10.0)
    logits[[5, 9, 20]] = torch.tensor([2.0, 1.5, 1.0])  # together they hold > 99.9% of the mass
    draws = set(draw_many(logits, SamplingParams(temperature=1.0, top_p=0.6), seed=7, num_draws=2000))
    # Softmax mass: 5 -> ~0.51, 9 -> ~0.31: 5 alone is below 0.6, 5 and 9 reach it.
    assert draws == {5, 9}


def test_min_p_never_draws_a_token_below_min_p_times_the_top_probability():
    logits = torch.log(torch.tensor([0.30, 0.20, 0.16, 0.14] + [0.20 / 60] * 60))  # [64]
    params = SamplingParams(temperature=1.0, min_p=0.5)  # keeps p >= 0.15: ids 0, 1, 2
    draws = set(draw_many(logits, params, seed=3, num_draws=3000))
    assert draws == {0, 1, 2}
    unmasked = set(draw_many(logits, SamplingParams(temperature=1.0), seed=3, num_draws=3000))
    assert 3 in unmasked and len(unmasked - {0, 1, 2, 3}) > 0


def test_temperature_sampling_follows_the_tempered_softmax():
    logits = torch.tensor([1.0, 0.5, 0.0, -0.5, -1.0, 0.2, 0.8, -0.2])  # [8]
    temperature, num_draws = 0.7, 8000
    draws = torch.tensor(draw_many(logits, SamplingParams(temperature=temperature), 123, num_draws))
    observed = torch.bincount(draws, minlength=8).float()
    expected = (logits / temperature).softmax(dim=-1) * num_draws
    chi_square = ((observed - expected) ** 2 / expected).sum().item()
    assert chi_square < 30.0  # 7 degrees of freedom: p < 1e-4 above 29


def test_logprobs_are_the_raw_log_softmax_sorted_descending():
    logits = random_logits(3)
    params = [
        SamplingParams(temperature=0.5, logprobs=5),
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.0, logprobs=0),
    ]
    out = sample(logits, params, [1, 2, 3], [4, 5, 6])
    expected = logits.log_softmax(dim=-1)
    first = out.logprobs[0]
    assert first.token_id == out.token_ids[0]
    assert first.logprob == pytest.approx(expected[0, out.token_ids[0]].item(), abs=1e-5)
    assert list(first.top_ids) == expected[0].topk(5).indices.tolist()
    assert first.top_logprobs == pytest.approx(expected[0].topk(5).values.tolist(), abs=1e-5)
    assert list(first.top_logprobs) == sorted(first.top_logprobs, reverse=True)
    assert out.logprobs[1] is None
    last = out.logprobs[2]
    assert (last.top_ids, last.top_logprobs) == ((), ())
    assert last.logprob == pytest.approx(expected[2].max().item(), abs=1e-5)


def test_mismatched_inputs_are_rejected():
    with pytest.raises(ValueError):
        sample(random_logits(2), [SamplingParams()], [1, 2], [0, 0])
    with pytest.raises(ValueError):
        sample(random_logits(1)[0], [SamplingParams()], [1], [0])
