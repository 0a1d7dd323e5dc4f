"""A prefill replica with a real engine takes prompts into its waiting queue up to
`max_waiting_requests` and refuses the next at once (WaitingQueueFullError), holding nothing
for it; the prompts it took are prefilled. The prompts arrive while the engine thread is held
in a command, so all of them reach it between the same two steps."""
import asyncio
import threading

from pdserve.cluster.waiting_bound import WaitingQueueFullError
from pdserve.engine.engine_config import EngineConfig
from pdserve.kvtransfer.target import KVTarget
from pdserve.prefill_svc.replica import FirstToken, PrefillReplica, PrefillReplicaConfig
from pdserve.protocol.sampling_params import SamplingParams
from pdserve.v1 import common_pb2
from tests.helpers import ENGINE_DTYPE

DEADLINE_S = 30.0


def test_a_prompt_past_the_waiting_bound_is_refused_and_the_others_prefilled(tiny_model):
    async def main():
        config = PrefillReplicaConfig(EngineConfig(model=tiny_model(), dtype=ENGINE_DTYPE,
                                                   kv_cache_memory_bytes=16 * 2**20), "p0", max_waiting_requests=2)
        replica = PrefillReplica(config, asyncio.get_running_loop())
        replica.start()
        release = threading.Event()
        held = replica.engine.call(lambda engine: release.wait(DEADLINE_S))
        target = KVTarget("", (), replica.layout, common_pb2.TRANSPORT_SHM)
        runs = [replica.run(f"r{i}", [5, 6, 7, 8], SamplingParams(max_tokens=4), 0, target, []) for i in range(3)]
        firsts = [asyncio.ensure_future(anext(run)) for run in runs]
        await asyncio.sleep(0)  # each run queues its prompt behind the held command
        release.set()
        await held
        outcomes = await asyncio.wait_for(asyncio.gather(*firsts, return_exceptions=True), DEADLINE_S)
        for run in runs:
            await run.aclose()
        free = await replica.engine.call(lambda engine: (engine.allocator.num_free_blocks, engine.allocator.num_blocks))
        await replica.stop()
        return outcomes, replica.queued_tokens, free

    outcomes, queued_tokens, (num_free, num_blocks) = asyncio.run(main())
    assert [type(outcome) for outcome in outcomes] == [FirstToken, FirstToken, WaitingQueueFullError]
    assert "--max-waiting-requests" in str(outcomes[2])
    assert queued_tokens == 0 and num_free == num_blocks
