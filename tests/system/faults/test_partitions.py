"""Partitions between hosts (tests/system/faults/netns.py: each process on a host of its own, two
of them cut apart) while the decode replica cut off still reaches Redis, so the registry goes on
listing it: from the gateway (keepalive finds the cut and the streams on it move to the other
decode replica), or from the prefill replica (the KV pushes to it fail and are blamed on it).
Either way no request fails, the tokens are those of an unharmed run, new requests keep off the
cut replica (outlier ejection), and once the link heals it serves again. Skipped where this
machine will not make namespaces."""
import asyncio
import time
from dataclasses import dataclass

import pytest

from tests.system.conftest import Cluster
from tests.system.faults.conftest import StreamRun, cluster_on_hosts, greedy_request, request_info
from tests.system.faults.test_decode_migration import prompts

pytestmark = pytest.mark.faults

REMOTE = ("--prefill-placement", "remote")  # every prompt through the prefill replica: both links in use
LAYOUT = [("prefill", "p0", "p0", ()), ("decode", "d0", "d0", ()), ("decode", "d1", "d1", ()),
          ("gateway", "gw", "gw", REMOTE)]
NUM_STREAMS = 8
NUM_TOKENS = 150
AVOID_WITHIN_S = 15.0  # new requests keep off the cut replica from this long after the cut
SERVE_AGAIN_WITHIN_S = 30.0  # after healing
NEW_EVERY_S = 1.0
NEW_TOKENS = 8


@pytest.fixture(scope="module")
def cluster(hosts, e2e_model, tmp_path_factory):
    with cluster_on_hosts(hosts, e2e_model, tmp_path_factory, LAYOUT) as started:
        yield started


async def new_requests(cluster: Cluster, prefix: str, prompt: list[int], num: int) -> list[tuple[str, float, object]]:
    """`num` requests, one every NEW_EVERY_S: (request id, when sent, its error or None)."""
    async def one(i: int) -> tuple[str, float, object]:
        await asyncio.sleep(i * NEW_EVERY_S)
        sent_s = time.monotonic()
        [outcome] = await StreamRun(cluster.gateway.endpoint, [greedy_request(f"{prefix}-{i}", prompt, NEW_TOKENS)]).run()
        return f"{prefix}-{i}", sent_s, outcome.error
    return await asyncio.gather(*(one(i) for i in range(num)))


def serves_again(cluster: Cluster, replica: str, prompt: list[int], deadline_s: float, prefix: str) -> float:
    """Seconds until a request lands on `replica` again: rounds of four at once, so the router
    spreads them over both decode replicas; fails past `deadline_s`."""
    started_s = time.monotonic()
    for round_index in range(100):
        requests = [greedy_request(f"{prefix}-{round_index}-{i}", prompt, NEW_TOKENS) for i in range(4)]
        outcomes = asyncio.run(StreamRun(cluster.gateway.endpoint, requests).run())
        assert all(outcome.error is None for outcome in outcomes), [o.error for o in outcomes]
        if any(request_info(cluster, r.request_id).decode_replica == replica for r in requests):
            return time.monotonic() - started_s
        assert time.monotonic() < deadline_s, f"{replica} got no request {SERVE_AGAIN_WITHIN_S:g} s after healing"
        time.sleep(0.5)
    raise AssertionError("too many rounds")


@dataclass
class CutRun:
    victim: str  # the decode replica cut off
    struck_request: str  # a request it served at the cut
    errors: list  # (stream, status, details) of the streams that failed
    changed: list[int]  # streams whose tokens differ from the unharmed run's
    new_errors: list[str]  # of the requests sent after the cut
    late_on_victim: list[str]  # requests sent AVOID_WITHIN_S after the cut that it served
    num_new: int
    back_s: float  # from healing until it served a request again


def cut_mid_stream(cluster: Cluster, hosts, e2e_model: str, other_end: str, prefix: str, seed: int) -> CutRun:
    """Streams NUM_STREAMS greedy requests; once one is mid-stream, cuts its decode replica
    off from host `other_end`, sends new requests one a second for AVOID_WITHIN_S + 5 s, heals,
    and waits for the replica to serve again; every block is free at the end."""
    cases = prompts(e2e_model, NUM_STREAMS, seed=seed)
    reference = asyncio.run(StreamRun(cluster.gateway.endpoint, [
        greedy_request(f"{prefix}ref-{i}", prompt, NUM_TOKENS) for i, prompt in enumerate(cases)]).run())
    assert all(outcome.error is None for outcome in reference)
    new_prompt = prompts(e2e_model, 1, seed=seed + 1)[0]
    newcomers: list = []

    async def cut(run: StreamRun):
        run.struck_request = await run.wait_mid_stream(min_tokens=10, min_left=40)
        run.victim = (await asyncio.to_thread(request_info, cluster, run.struck_request)).decode_replica
        hosts.cut(other_end, run.victim)
        run.killed_s = time.monotonic()
        newcomers.extend(await new_requests(cluster, f"{prefix}new", new_prompt,
                                            round(AVOID_WITHIN_S / NEW_EVERY_S) + 5))

    run = StreamRun(cluster.gateway.endpoint, [greedy_request(f"{prefix}-{i}", p, NUM_TOKENS)
                                               for i, p in enumerate(cases)])
    try:
        outcomes = asyncio.run(run.run(cut))
    finally:
        if run.victim is not None:
            hosts.heal(other_end, run.victim)
    healed_s = time.monotonic()
    late = [request_id for request_id, sent_s, _ in newcomers if sent_s - run.killed_s >= AVOID_WITHIN_S]
    assert late
    result = CutRun(
        victim=run.victim,
        struck_request=run.struck_request,
        errors=[(i, o.error.code(), o.error.details()) for i, o in enumerate(outcomes) if o.error is not None],
        changed=[i for i, (o, want) in enumerate(zip(outcomes, reference)) if o.token_ids != want.token_ids],
        new_errors=[str(error) for _, _, error in newcomers if error is not None],
        late_on_victim=[r for r in late if request_info(cluster, r).decode_replica == run.victim],
        num_new=len(newcomers),
        back_s=serves_again(cluster, run.victim, new_prompt, healed_s + SERVE_AGAIN_WITHIN_S, f"{prefix}heal"))
    cluster.assert_all_kv_free(timeout_s=30.0)
    print(f"\n{other_end}-{run.victim} cut: {NUM_STREAMS} streams, {len(result.errors)} failed; {result.num_new} "
          f"new requests meanwhile, {len(result.new_errors)} failed; it served again {result.back_s:.1f}s after healing")
    return result


@pytest.mark.timeout(420)
def test_a_decode_replica_cut_off_from_the_gateway_loses_no_stream_and_serves_again_once_healed(
        cluster, hosts, e2e_model):
    cut = cut_mid_stream(cluster, hosts, e2e_model, "gw", "g", seed=31)
    assert (cut.errors, cut.changed, cut.new_errors, cut.late_on_victim) == ([], [], [], [])
    assert request_info(cluster, cut.struck_request).decode_replica != cut.victim  # moved off it


@pytest.mark.timeout(420)
def test_a_decode_replica_cut_off_from_the_prefill_replica_loses_no_request_and_serves_again_once_healed(
        cluster, hosts, e2e_model):
    """The KV pushes to the cut replica fail: they are blamed on it, not on the prefill replica (the
    only one), so the requests move to the other decode replica and none reads "no live prefill
    replica"; the streams already decoding on it, which need no push, go on there."""
    cut = cut_mid_stream(cluster, hosts, e2e_model, "p0", "p", seed=33)
    assert (cut.errors, cut.changed, cut.new_errors, cut.late_on_victim) == ([], [], [], [])
