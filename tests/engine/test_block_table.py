"""The device-side block table as a specification, driven by the real scheduler on CPU.

After every step, each scheduled request's row, read up to its length, is the block table the
scheduler handed out; and the step wrote only the blocks that its requests' tables gained since
they were last scheduled (all of a table that is new to its row).
"""
import random

import torch

from pdserve.engine.block_allocator import BlockAllocator
from pdserve.engine.block_table import BlockTable
from pdserve.engine.request import Request, RequestStatus
from pdserve.protocol.sampling_params import SamplingParams
from pdserve.engine.scheduler import Scheduler, SchedulerOutput

BLOCK_SIZE = 4
MAX_BLOCKS_PER_SEQ = 8


class Replica:
    """The scheduler, and the runner's half that keeps the block table, without a model."""

    def __init__(self, num_blocks: int, max_num_seqs: int = 4, max_num_batched_tokens: int = 16):
        self.scheduler = Scheduler(BlockAllocator(num_blocks, BLOCK_SIZE, enable_caching=False),
                                   max_num_batched_tokens, max_num_seqs)
        self.block_table = BlockTable(max_num_seqs, MAX_BLOCKS_PER_SEQ, torch.device("cpu"))
        self.rows: dict[str, int] = {}  # request id -> row, as of the last step that scheduled it
        self.num_writes: list[int] = []  # per step

    def add(self, request_id: str, prompt_len: int, max_tokens: int) -> Request:
        request = Request(request_id, list(range(1, prompt_len + 1)), SamplingParams(max_tokens=max_tokens), seed=0)
        self.scheduler.add(request)
        return request

    def step(self) -> SchedulerOutput:
        """Schedules, brings the table up to date, and checks every scheduled row against its chunk."""
        output = self.scheduler.schedule()
        self.block_table.release(output.departed_request_ids)
        rows, flat_indices, block_ids = self.block_table.diff(output.chunks)
        self.block_table.write(torch.tensor(flat_indices, dtype=torch.int64), torch.tensor(block_ids, dtype=torch.int32))
        width = max((len(chunk.block_table) for chunk in output.chunks), default=0)
        gathered = self.block_table.gather(torch.tensor(rows, dtype=torch.int32), width)  # [num_chunks, width]
        assert gathered.shape == (len(output.chunks), width) and gathered.is_contiguous()
        for chunk, row, gathered_row in zip(output.chunks, rows, gathered.tolist()):
            assert gathered_row[:len(chunk.block_table)] == chunk.block_table
            self.rows[chunk.request.request_id] = row
        self.num_writes.append(len(flat_indices))
        self.scheduler.update(output, {chunk.request.request_id: 0 for chunk in output.chunks if chunk.samples})
        return output

    def finish_done(self) -> list[str]:
        done = [r for r in self.scheduler.running if len(r.output_token_ids) >= r.params.max_tokens]
        for request in done:
            self.scheduler.finish(request, RequestStatus.FINISHED_LENGTH)
        return [request.request_id for request in done]


def test_a_step_writes_only_the_blocks_its_tables_gained():
    replica = Replica(num_blocks=32)
    replica.add("a", prompt_len=3, max_tokens=8)
    replica.step()  # prefill of 3 tokens: one block
    replica.add("b", prompt_len=9, max_tokens=8)
    replica.step()  # a decodes position 3, still block 0; b prefills 9 tokens: three blocks
    replica.step()  # a's position 4 opens its second block; b's position 9 sits in its third
    replica.step()  # a 5, b 10: no new block
    replica.step()  # a 6, b 11
    replica.step()  # a 7, b 12: b opens its fourth block
    assert replica.num_writes == [1, 3, 1, 0, 0, 1]


def test_a_row_given_back_is_reused_by_a_new_request():
    replica = Replica(num_blocks=32, max_num_seqs=2, max_num_batched_tokens=32)
    replica.add("long", prompt_len=20, max_tokens=1)
    replica.add("short", prompt_len=4, max_tokens=3)
    replica.step()
    assert replica.finish_done() == ["long"]
    replica.add("next", prompt_len=5, max_tokens=1)
    output = replica.step()  # short's second block is long's first; next's two blocks follow
    assert output.departed_request_ids == ["long"]
    assert replica.rows["next"] == replica.rows["long"]
    assert [chunk.block_table for chunk in output.chunks] == [[5, 0], [1, 2]]
    assert replica.num_writes == [6, 3]


def test_an_aborted_request_gives_back_its_row():
    replica = Replica(num_blocks=32, max_num_seqs=1)
    replica.add("first", prompt_len=6, max_tokens=5)
    replica.step()
    replica.scheduler.abort("first")
    replica.add("first", prompt_len=3, max_tokens=5)  # the id comes back: a new request, a new table
    output = replica.step()
    assert output.departed_request_ids == ["first"]
    assert replica.num_writes == [2, 1]


def test_a_preempted_request_writes_its_whole_table_when_it_resumes():
    replica = Replica(num_blocks=6, max_num_seqs=2)
    replica.add("old", prompt_len=8, max_tokens=8)
    replica.add("new", prompt_len=8, max_tokens=8)
    outputs = [replica.step() for _ in range(6)]  # both reach three blocks; old's fourth preempts new
    assert [output.departed_request_ids for output in outputs] == [[]] * 5 + [["new"]]
    replica.step()
    replica.step()
    assert replica.finish_done() == ["old"]
    [resumed] = replica.step().chunks
    assert (resumed.request.request_id, resumed.start, len(resumed.block_table)) == ("new", 0, 4)
    assert replica.num_writes == [4, 2, 0, 0, 0, 1, 0, 0, 4]


def test_random_traffic_with_preemption_keeps_every_row_equal_to_its_table():
    generator = random.Random(0)
    replica = Replica(num_blocks=12, max_num_seqs=3, max_num_batched_tokens=8)
    sent: dict[str, int] = {}  # request id -> blocks its row holds, while it stays in the batch
    for step in range(300):
        if generator.random() < 0.3:
            replica.add(f"r{step}", prompt_len=generator.randint(1, 12), max_tokens=generator.randint(1, 16))
        if running := replica.scheduler.running:
            if generator.random() < 0.05:
                replica.scheduler.abort(generator.choice(running).request_id)
        output = replica.step()
        for request_id in output.departed_request_ids:
            sent.pop(request_id, None)
        expected_writes = sum(len(c.block_table) - sent.get(c.request.request_id, 0) for c in output.chunks)
        assert replica.num_writes[-1] == expected_writes
        sent.update((c.request.request_id, len(c.block_table)) for c in output.chunks)
        replica.finish_done()
    assert replica.scheduler.num_preemptions > 0
