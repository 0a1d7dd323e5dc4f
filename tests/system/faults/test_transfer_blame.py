"""A decode replica whose KV pool prefill cannot open (its shared-memory segment is hidden from
/dev/shm, while the replica itself runs on): each request placed there fails its KV transfer,
the prefill replica reports the decode side at fault, and the request moves to the other decode
replica through the same prefill replica, with the tokens of an unharmed run. With no other
decode replica the client is told the decode replica failed it, never "no live prefill
replica"; no KV block stays taken."""
import asyncio
import contextlib
import os
from pathlib import Path

import grpc
import pytest

from tests.system.faults.conftest import (
    StreamRun, assert_prefill_kv_free, greedy_request, migrations, num_prefills, request_info, wait_until_gone)
from tests.system.faults.front_clients import offline_greedy
from tests.system.faults.test_decode_migration import prompts

pytestmark = pytest.mark.faults

NUM_REQUESTS = 6
NUM_TOKENS = 8
SHM_DIR = Path("/dev/shm")


def kv_segment_of(pid: int) -> Path:
    """The shared-memory segment that holds the decode replica's KV pool (it maps it)."""
    maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
    names = {line.split()[-1] for line in maps if "/dev/shm/pdserve_kv_" in line}
    assert len(names) == 1, names
    return Path(names.pop())


@contextlib.contextmanager
def hidden(segment: Path):
    """The segment renamed away, so no other process can open it by name; its owner keeps its
    mapping. Put back at the end, so that the owner unlinks it as it stops."""
    moved = segment.with_name(segment.name + ".hidden")
    os.rename(segment, moved)
    try:
        yield
    finally:
        os.rename(moved, segment)


@pytest.mark.timeout(420)
def test_a_decode_replica_that_fails_kv_transfers_is_left_and_the_prefill_replica_kept(make_cluster, e2e_model):
    cluster = make_cluster([("decode", "d0", ()), ("decode", "d1", ()), ("prefill", "p0", ()),
                            ("gateway", "gw", ("--prefill-placement", "remote", "--transport", "shm"))])
    cases = prompts(e2e_model, NUM_REQUESTS, seed=5)
    reference = offline_greedy(e2e_model, cases, NUM_TOKENS)
    d0, d1 = (next(s for s in cluster.services if s.name == name) for name in ("d0", "d1"))

    # Before any transfer: the prefill replica maps a decode pool once, at its first transfer there.
    with hidden(kv_segment_of(d0.process.pid)):
        run = StreamRun(cluster.gateway.endpoint, [greedy_request(f"r-{i}", p, NUM_TOKENS) for i, p in enumerate(cases)])
        outcomes = asyncio.run(run.run())
        failed = [(i, o.error.code(), o.error.details()) for i, o in enumerate(outcomes) if o.error is not None]
        assert failed == []
        for i, (outcome, want) in enumerate(zip(outcomes, reference)):
            assert outcome.token_ids == want.token_ids, f"request {i} differs from the unharmed run"
        infos = [request_info(cluster, f"r-{i}") for i in range(NUM_REQUESTS)]
        assert all(info.decode_replica == "d1" and info.prefill_replica == "p0" for info in infos)
        num_moved = sum(num_prefills(info) > 1 for info in infos)
        moves = migrations(cluster)
        print(f"\nhidden decode pool: {NUM_REQUESTS} requests, {num_moved} moved off d0, migrations {moves}")
        assert num_moved >= 1 and moves.get("kv_transfer_failed", 0) == num_moved
        assert moves.get("prefill_unavailable", 0) == 0
        cluster.assert_all_kv_free()  # d0's reservations were aborted, not left to expire
        assert_prefill_kv_free(cluster)

        cluster.kill(d1)
        wait_until_gone(cluster, "decode", "d1")
        alone = asyncio.run(StreamRun(cluster.gateway.endpoint, [greedy_request("alone", cases[0], NUM_TOKENS)]).run())
        error = alone[0].error
        assert error is not None and error.code() == grpc.StatusCode.UNAVAILABLE
        assert "no live prefill replica" not in error.details()
        assert "failed on d0" in error.details(), error.details()
        assert set(cluster.replicas("prefill")) == {"p0"} and set(cluster.replicas("decode")) == {"d0"}
        cluster.assert_all_kv_free()
