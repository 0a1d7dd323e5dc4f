"""`pdserve up` supervises: a replica killed with SIGKILL is restarted while the rest keeps
serving, and `up` killed with SIGKILL leaves no process of its deployment behind."""
import asyncio
import os
import re
import signal
import time
from pathlib import Path

import grpc
import pytest

from tests.system.faults.up_deployment import STOP_DEADLINE_S, cmdline, generate, start_up, stop_up, wrong_outputs
from tests.helpers import children_of, is_alive, wait_until
from pdserve.v1 import gateway_pb2_grpc

pytestmark = [pytest.mark.faults, pytest.mark.slow]
RESTART_DEADLINE_S = 180.0


async def generate_all(gateway: str, cases) -> list:
    async with grpc.aio.insecure_channel(gateway) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        return await asyncio.gather(*(generate(stub, i, prompt, n) for i, (prompt, n) in enumerate(cases)))


def test_a_killed_decode_replica_is_restarted_and_the_deployment_keeps_serving(deployment, workload):
    cases, expected = workload
    before = deployment.children()
    old_endpoint = deployment.registry("decode")["decode-0"]["endpoint"]

    killed_s = time.monotonic()
    os.kill(before["decode-0"], signal.SIGKILL)
    wait_until(lambda: re.search(r"decode-0 exited with status -9", deployment.log()), "up to see the exit", 10.0)
    # Meanwhile the other replica serves whatever is routed to it.
    during = asyncio.run(generate_all(deployment.gateway, cases))

    restarted = wait_until(lambda: (entry := deployment.registry("decode").get("decode-0"))
                           and entry["endpoint"] != old_endpoint and entry, "a new decode-0 to register",
                           RESTART_DEADLINE_S)
    wait_until(lambda: deployment.serves(restarted["endpoint"]), "the new decode-0 to serve", 30.0)
    restart_s = time.monotonic() - killed_s

    after = asyncio.run(generate_all(deployment.gateway, cases + cases))
    now = deployment.children()
    print(f"kill -9 decode-0: registered again after {restart_s:.1f} s; during the restart "
          f"{sum(o.token_ids is None for o in during)}/{len(during)} failed; after it "
          f"{sum(o.token_ids is None for o in after)}/{len(after)} failed, "
          f"{sum(o.decode_replica == 'decode-0' for o in after)} on the new decode-0")
    assert deployment.process.poll() is None, "up stopped"
    assert [o.error for o in after if o.token_ids is None] == []
    assert wrong_outputs(during + after, expected + expected) == []
    assert {o.decode_replica for o in after} == {"decode-0", "decode-1"}
    assert now["decode-0"] != before["decode-0"]
    assert {name: now[name] for name in ("prefill-0", "decode-1", "gateway")} == \
           {name: before[name] for name in ("prefill-0", "decode-1", "gateway")}, "others were restarted"


def test_killing_up_with_sigkill_leaves_no_process_behind(fault_model, tmp_path):
    up = start_up(tmp_path, fault_model, "--prefill", "1", "--decode", "1")
    try:
        children = up.children()
        assert {"prefill-0", "decode-0", "gateway"} <= children.keys()
        assert len(children) == 4, children  # and its Redis
        grandchildren = {pid for child in children.values() for pid in children_of(child)}
        redis_port = up.redis_url.rsplit(":", 1)[1].split("/")[0]
        marks = (f"127.0.0.1:{redis_port}/", f"--port\0{redis_port}\0", f"--grpc-port\0{up.grpc_port}\0")

        def left_behind() -> dict[int, str]:
            pids = {*children.values(), *grandchildren}
            for proc in Path("/proc").glob("[0-9]*"):
                if any(mark in "\0".join(cmdline(int(proc.name))) + "\0" for mark in marks):
                    pids.add(int(proc.name))
            return {pid: " ".join(cmdline(pid)) for pid in pids if is_alive(pid)}

        killed_s = time.monotonic()
        up.process.kill()
        up.process.wait(timeout=10)
        try:
            wait_until(lambda: not left_behind(), "every process of the deployment to exit", STOP_DEADLINE_S)
        except AssertionError:
            raise AssertionError(f"left running: {left_behind()}") from None
        print(f"kill -9 up: {len(children)} children and {len(grandchildren)} grandchildren gone "
              f"{time.monotonic() - killed_s:.1f} s later")
    finally:
        stop_up(up)
