"""KV across hosts: Redis, the gateways, the prefill replica and two decode replicas each on a host
of their own (tests/system/faults/netns.py: a network namespace and a private /dev/shm each, one
kernel), joined by a bridge. The specification: each replica's host id carries the kernel and its
own /dev/shm, so auto routing moves KV over grpc, and a gateway that forces shm is refused at once
with an error naming both hosts; greedy output is transformers' token for token; a client that
leaves frees every KV block on both sides; a decode replica killed mid-stream moves its requests to
the other host, tokens unchanged, as on one host. It also measures the grpc path's bandwidth
between two namespaces next to loopback grpc in the same run (BENCHMARKS.md). Skipped, with the
reason, where this machine will not make namespaces (not root, say)."""
import asyncio
import json
import subprocess
import sys
import time

import grpc
import pytest
import redis

from pdserve.bench.kv_transfer import NETNS_GRPC_PATH
from pdserve.cluster.registry import default_host_id
from pdserve.protocol.transport_choice import transport_name
from pdserve.v1 import common_pb2, gateway_pb2_grpc
from tests.system.conftest import Cluster
from tests.system.faults.conftest import (
    StreamRun, assert_prefill_kv_free, cluster_on_hosts, greedy_request, migrations, request_info, wait_until_gone)
from tests.system.faults.stream_clients import grpc_stream, request_records
from tests.system.faults.test_decode_migration import kill_mid_stream, prompts

pytestmark = pytest.mark.faults

REMOTE = ("--prefill-placement", "remote")  # every prompt through a prefill replica: the path under test
# (kind, name, host, flags); the first gateway is the cluster's, routing on auto.
LAYOUT = [("prefill", "p0", "p0", ()), ("decode", "d0", "d0", ()), ("decode", "d1", "d1", ()),
          ("gateway", "gw", "gw", REMOTE), ("gateway", "gw-shm", "gw", ("--transport", "shm", *REMOTE))]
NUM_TOKENS = 60  # per stream of the kill test
BENCH_TIMEOUT_S = 120.0
GRPC = transport_name(common_pb2.TRANSPORT_GRPC)  # as request records name it


@pytest.fixture(scope="module")
def cluster(hosts, e2e_model, tmp_path_factory):
    with cluster_on_hosts(hosts, e2e_model, tmp_path_factory, LAYOUT) as started:
        yield started


def stored_transports(cluster: Cluster, request_ids: list[str]) -> set[str]:
    client = redis.Redis.from_url(cluster.redis_url, decode_responses=True, socket_timeout=5)
    try:
        return {client.hget(f"req:{request_id}", "transport") for request_id in request_ids}
    finally:
        client.close()


def test_auto_routing_moves_kv_over_grpc_and_greedy_equals_transformers(cluster, e2e_model, hf_greedy):
    cases = [(prompt, 4 + i * 3) for i, prompt in enumerate(prompts(e2e_model, 6, seed=21))]
    requests = [greedy_request(f"across-{i}", prompt, max_tokens) for i, (prompt, max_tokens) in enumerate(cases)]
    outcomes = asyncio.run(StreamRun(cluster.gateway.endpoint, requests).run())
    assert [outcome.error for outcome in outcomes] == [None] * len(cases)
    assert [outcome.token_ids for outcome in outcomes] == hf_greedy(e2e_model, cases)
    assert stored_transports(cluster, [request.request_id for request in requests]) == {GRPC}
    cluster.assert_all_kv_free()
    assert_prefill_kv_free(cluster)


def test_forcing_shm_between_hosts_is_refused_at_once_naming_both(cluster, e2e_model):
    host_ids = {name: entry["host_id"] for kind in ("prefill", "decode")
                for name, entry in cluster.replicas(kind).items()}
    kernel = default_host_id().split("-shm-")[0]  # this process's: the replicas run on its kernel
    assert len(set(host_ids.values())) == 3
    assert all(host_id.startswith(kernel + "-shm-") for host_id in host_ids.values())
    gateway = next(service for service in cluster.services if service.name == "gw-shm")
    started_s = time.monotonic()
    outcome, = asyncio.run(StreamRun(gateway.endpoint, [greedy_request("shm", prompts(e2e_model, 1)[0], 4)]).run())
    assert time.monotonic() - started_s < 5.0
    assert outcome.error.code() == grpc.StatusCode.FAILED_PRECONDITION and not outcome.token_ids
    details = outcome.error.details()
    assert "TRANSPORT_SHM needs prefill and decode on the same host" in details
    assert host_ids["p0"] in details and (host_ids["d0"] in details or host_ids["d1"] in details)
    cluster.assert_all_kv_free()
    assert_prefill_kv_free(cluster)


def test_clients_that_leave_free_every_kv_block_on_both_hosts(cluster, e2e_model):
    cut_afters = [1, 2, 4, 8]

    async def leave():
        async with grpc.aio.insecure_channel(cluster.gateway.endpoint) as channel:
            stub = gateway_pb2_grpc.GatewayStub(channel)
            return await asyncio.gather(*(
                grpc_stream(stub, f"leave-{i}", prompt, 500, cut_after=cut_after)
                for i, (prompt, cut_after) in enumerate(zip(prompts(e2e_model, len(cut_afters)), cut_afters))))

    outcomes = asyncio.run(leave())
    assert all(outcome.cut and outcome.status is None for outcome in outcomes)
    cluster.wait_until(lambda: {request_records(cluster.redis_url)[o.request_id][0] for o in outcomes} == {"ABORTED"},
                       "every request left to be recorded ABORTED")
    cluster.assert_all_kv_free()
    assert_prefill_kv_free(cluster)


def test_a_decode_replica_killed_mid_stream_moves_its_requests_to_the_other_host(cluster, e2e_model):
    cases = prompts(e2e_model, 4, seed=23)
    reference = asyncio.run(StreamRun(cluster.gateway.endpoint, [
        greedy_request(f"unharmed-{i}", prompt, NUM_TOKENS) for i, prompt in enumerate(cases)]).run())
    run = StreamRun(cluster.gateway.endpoint, [greedy_request(f"k-{i}", p, NUM_TOKENS) for i, p in enumerate(cases)])
    outcomes = asyncio.run(run.run(kill_mid_stream(cluster, min_tokens=5, min_left=20)))
    assert [outcome.error for outcome in outcomes] == [None] * len(cases)
    assert any(outcome.arrival_s[-1] > run.killed_s for outcome in outcomes)  # the kill was mid-stream
    assert migrations(cluster).get("decode_unavailable", 0) >= 1
    assert [outcome.token_ids for outcome in outcomes] == [outcome.token_ids for outcome in reference]
    assert request_info(cluster, run.struck_request).decode_replica != run.victim
    assert stored_transports(cluster, [f"k-{i}" for i in range(len(cases))]) == {GRPC}
    wait_until_gone(cluster, "decode", run.victim)
    cluster.assert_all_kv_free()
    assert_prefill_kv_free(cluster)


def test_grpc_kv_bandwidth_between_namespaces(hosts, tmp_path):
    """Prints the bench's table: KV pushed from the prefill host to a decode on the d1 host, and
    over loopback within the prefill host, in the same run."""
    rows_path = tmp_path / "kv_transfer.json"
    command = [sys.executable, "-m", "pdserve.bench.kv_transfer", "--mib", "64", "--repeats", "10",
               "--decode-netns", hosts.namespace("d1"), "--decode-host", hosts.address("d1"), "--json", str(rows_path)]
    done = subprocess.run([*hosts.launcher("p0"), *command], capture_output=True, text=True, timeout=BENCH_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    gb_per_s = {row["path"]: row["gb_per_s"] for row in json.loads(rows_path.read_text())["rows"]}
    across, loopback = gb_per_s[NETNS_GRPC_PATH], gb_per_s["kvtransfer TRANSPORT_GRPC"]
    print(f"\n{done.stdout}\ngrpc KV between network namespaces {across:.2f} GB/s, over loopback {loopback:.2f} GB/s "
          f"({across / loopback:.2f}x)")
    assert across > 0 and loopback > 0
