"""Prompt chunks sized to a step time (engine.step_budget), and the scheduler keeping to it."""
from pdserve.engine.block_allocator import BlockAllocator
from pdserve.engine.request import Request
from pdserve.engine.scheduler import Scheduler
from pdserve.engine.step_budget import StepBudget
from pdserve.protocol.sampling_params import SamplingParams


def test_the_budget_starts_small_and_learns_what_fits_in_the_step():
    budget = StepBudget(max_step_s=0.1, max_tokens=2048, min_tokens=16)
    assert budget.prompt_tokens(num_decodes=4) == 16
    for _ in range(50):
        budget.observe(num_decodes=4, num_prompt_tokens=0, seconds=0.03)  # decodes alone: 30 ms
        budget.observe(num_decodes=4, num_prompt_tokens=100, seconds=0.13)  # + 1 ms a prompt token
    assert 65 <= budget.prompt_tokens(num_decodes=4) <= 75  # (100 - 30) ms at 1 ms a token
    assert 95 <= budget.prompt_tokens(num_decodes=0) <= 105  # no decodes: the whole step
    budget.observe(num_decodes=0, num_prompt_tokens=4, seconds=5.0)  # too small a chunk to judge
    assert 95 <= budget.prompt_tokens(num_decodes=0) <= 105


def test_the_budget_never_goes_below_its_minimum_or_above_the_scheduler_budget():
    budget = StepBudget(max_step_s=0.05, max_tokens=64, min_tokens=8)
    budget.observe(num_decodes=1, num_prompt_tokens=0, seconds=0.2)
    budget.observe(num_decodes=1, num_prompt_tokens=32, seconds=0.3)
    assert budget.prompt_tokens(num_decodes=1) == 8
    fast = StepBudget(max_step_s=10.0, max_tokens=64)
    fast.observe(num_decodes=0, num_prompt_tokens=32, seconds=0.001)
    assert fast.prompt_tokens(num_decodes=0) == 64


def test_a_step_faster_than_the_decodes_estimate_teaches_nothing():
    budget = StepBudget(max_step_s=0.1, max_tokens=2048, min_tokens=16)
    budget.observe(num_decodes=4, num_prompt_tokens=0, seconds=0.05)
    budget.observe(num_decodes=4, num_prompt_tokens=64, seconds=0.04)  # under the 50 ms of decodes alone
    assert budget.s_per_prompt_token is None and budget.prompt_tokens(num_decodes=4) == 16
    budget.observe(num_decodes=4, num_prompt_tokens=64, seconds=0.114)  # 1 ms a prompt token
    budget.observe(num_decodes=4, num_prompt_tokens=64, seconds=0.01)
    assert budget.s_per_prompt_token > 0 and budget.prompt_tokens(num_decodes=4) >= 16


def test_the_scheduler_keeps_prompt_chunks_within_the_prompt_budget_and_decodes_run():
    scheduler = Scheduler(BlockAllocator(64, 16, enable_caching=False), max_num_batched_tokens=2048, max_num_seqs=8)
    decoding = Request("d", list(range(10)), SamplingParams(max_tokens=8), seed=0)
    scheduler.add(decoding)
    scheduler.update(scheduler.schedule(), {"d": 1})  # its prompt, then it decodes
    for name in ("a", "b"):
        scheduler.add(Request(name, list(range(100)), SamplingParams(max_tokens=8), seed=0))
    output = scheduler.schedule(max_prompt_tokens=48)
    sizes = {chunk.request.request_id: chunk.num_new_tokens for chunk in output.chunks}
    assert sizes == {"d": 1, "a": 48} and output.num_prompt_tokens == 48
    scheduler.update(output, {"d": 2})
    sizes = {c.request.request_id: c.num_new_tokens for c in scheduler.schedule(max_prompt_tokens=60).chunks}
    assert sizes == {"d": 1, "a": 52, "b": 8}
