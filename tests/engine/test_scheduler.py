"""The continuous-batching scheduler as a specification, driven without torch.

A stand-in "model" makes each next token a pure function of the tokens before it, so a run
that preempts and recomputes must produce exactly the tokens of a run that never preempts.
"""
from hypothesis import given, settings, strategies as st

from pdserve.engine.block_allocator import BlockAllocator
from pdserve.engine.request import Request, RequestStatus
from pdserve.protocol.sampling_params import SamplingParams
from pdserve.engine.scheduler import Scheduler


def next_token(token_ids: list[int]) -> int:
    return (sum(token_ids) * 31 + len(token_ids)) % 1000


def make_request(request_id: str, prompt_len: int, max_tokens: int) -> Request:
    prompt = [(7 * i + len(request_id)) % 1000 for i in range(prompt_len)]
    return Request(request_id, prompt, SamplingParams(max_tokens=max_tokens, temperature=0), seed=0)


def step(scheduler: Scheduler) -> list[Request]:
    """One engine step with the stand-in model; returns the requests that finished."""
    output = scheduler.schedule()
    sampled = {}
    for chunk in output.chunks:
        request = chunk.request
        assert chunk.start == request.num_computed_tokens
        if chunk.samples:
            sampled[request.request_id] = next_token(request.token_ids(0, request.num_tokens))
    scheduler.update(output, sampled)
    finished = []
    for chunk in output.chunks:
        request = chunk.request
        if len(request.output_token_ids) >= request.params.max_tokens:
            scheduler.finish(request, RequestStatus.FINISHED_LENGTH)
            finished.append(request)
    return finished


def run_all(scheduler: Scheduler, requests: list[Request], max_steps: int = 10_000) -> dict[str, list[int]]:
    for request in requests:
        scheduler.add(request)
    for _ in range(max_steps):
        if not scheduler.has_unfinished:
            break
        step(scheduler)
    assert not scheduler.has_unfinished, "scheduler made no progress"
    return {r.request_id: r.output_token_ids for r in requests}


def test_long_prompt_is_prefilled_in_chunks_beside_running_decodes():
    scheduler = Scheduler(BlockAllocator(64, 4), max_num_batched_tokens=8, max_num_seqs=8)
    scheduler.add(make_request("short", 3, 5))
    step(scheduler)  # "short" prefilled and sampled its first token
    scheduler.add(make_request("long", 20, 2))
    output = scheduler.schedule()
    assert [(c.request.request_id, c.num_new_tokens) for c in output.chunks] == [("short", 1), ("long", 7)]
    assert not output.chunks[1].samples


def test_decode_chunks_come_before_prefill_chunks():
    scheduler = Scheduler(BlockAllocator(64, 4), max_num_batched_tokens=64, max_num_seqs=8)
    scheduler.add(make_request("a", 5, 4))
    step(scheduler)
    scheduler.add(make_request("b", 6, 4))
    scheduler.add(make_request("c", 1, 4))
    output = scheduler.schedule()
    sizes = [c.num_new_tokens for c in output.chunks]
    assert sizes == sorted(sizes, key=lambda n: n != 1)
    assert output.num_decode_chunks == 2


def test_newest_running_request_is_preempted_when_the_pool_runs_out():
    scheduler = Scheduler(BlockAllocator(4, 4), max_num_batched_tokens=64, max_num_seqs=8)
    old, new = make_request("old", 8, 8), make_request("new", 4, 8)
    scheduler.add(old)
    scheduler.add(new)
    step(scheduler)  # both prefilled: old holds 2 blocks, new 1 block; one block free
    output = scheduler.schedule()  # positions 8 and 4: old takes the free block, new has none
    assert scheduler.num_preemptions == 1
    assert new.status is RequestStatus.PREEMPTED and new.num_computed_tokens == 0
    assert scheduler.waiting[0] is new
    assert [c.request.request_id for c in output.chunks] == ["old"]


def test_max_num_seqs_caps_the_running_batch():
    scheduler = Scheduler(BlockAllocator(64, 4), max_num_batched_tokens=64, max_num_seqs=2)
    for i in range(4):
        scheduler.add(make_request(f"r{i}", 2, 3))
    output = scheduler.schedule()
    assert len(output.chunks) == 2 and len(scheduler.waiting) == 2


def test_preempted_requests_produce_the_same_tokens_as_an_unpreempted_run():
    def requests():
        return [make_request(f"r{i}", 3 + 5 * i, 12) for i in range(6)]

    roomy = Scheduler(BlockAllocator(256, 4), max_num_batched_tokens=32, max_num_seqs=16)
    tight = Scheduler(BlockAllocator(14, 4), max_num_batched_tokens=32, max_num_seqs=16)
    expected = run_all(roomy, requests())
    assert run_all(tight, requests()) == expected
    assert roomy.num_preemptions == 0 and tight.num_preemptions > 0


events = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(1, 30), st.integers(1, 10)),
        st.tuples(st.just("step"), st.just(0), st.just(0)),
        st.tuples(st.just("abort"), st.integers(0, 20), st.just(0)),
    ),
    max_size=80)


@settings(max_examples=200, deadline=None)
@given(events, st.integers(1, 24), st.integers(1, 6))
def test_budget_and_pool_hold_and_nothing_leaks(events, budget, max_num_seqs):
    allocator = BlockAllocator(12, 4)  # 48 slots: every request below fits alone
    scheduler = Scheduler(allocator, max_num_batched_tokens=budget, max_num_seqs=max_num_seqs)
    next_id = 0
    for kind, a, b in events:
        if kind == "add":
            scheduler.add(make_request(f"r{next_id}", a, b))
            next_id += 1
        elif kind == "abort":
            scheduler.abort(f"r{a}")
        else:
            output = scheduler.schedule()
            assert sum(chunk.num_new_tokens for chunk in output.chunks) <= budget
            assert len(scheduler.running) <= max_num_seqs
            for chunk in output.chunks:
                assert len(chunk.block_table) * 4 >= chunk.start + chunk.num_new_tokens
            step_finish(scheduler, output)
    run_all(scheduler, [])
    assert allocator.num_free_blocks == allocator.num_blocks


def step_finish(scheduler: Scheduler, output) -> None:
    sampled = {c.request.request_id: 1 for c in output.chunks if c.samples}
    scheduler.update(output, sampled)
    for chunk in output.chunks:
        if len(chunk.request.output_token_ids) >= chunk.request.params.max_tokens:
            scheduler.finish(chunk.request, RequestStatus.FINISHED_LENGTH)


def test_token_ids_spans_prompt_and_output():
    request = make_request("r", 4, 8)
    request.output_token_ids += [901, 902, 903]
    everything = request.prompt_token_ids + request.output_token_ids
    for start in range(len(everything)):
        for stop in range(start, len(everything) + 1):
            assert request.token_ids(start, stop) == everything[start:stop]


def test_a_request_whose_kv_landed_runs_while_a_prompt_ahead_of_it_waits_for_blocks():
    """Queued behind the prompt, the landed request would hold the blocks the prompt waits for."""
    allocator = BlockAllocator(4, 16, enable_caching=False)
    scheduler = Scheduler(allocator, max_num_batched_tokens=2048, max_num_seqs=8)
    scheduler.add(Request("prompt", list(range(60)), SamplingParams(max_tokens=4), seed=0))  # needs all 4 blocks
    landed = Request("landed", list(range(40)), SamplingParams(max_tokens=4), seed=0, output_token_ids=[7])
    allocator.allocate("landed", 40)  # 3 blocks, its KV in place
    landed.num_computed_tokens = 40
    scheduler.add_landed(landed)
    assert [chunk.request.request_id for chunk in scheduler.schedule().chunks] == ["landed"]
