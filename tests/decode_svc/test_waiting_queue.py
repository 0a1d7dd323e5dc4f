"""A decode replica with a real engine takes prompts it prefills itself into its waiting queue up
to `max_waiting_requests`; the next fails at once in the session (WaitingQueueFullError), which
carries on serving the others. The prompts arrive while the engine thread is held in a command,
so all of them reach it between the same two steps."""
import asyncio
import threading

from pdserve.cluster.waiting_bound import WaitingQueueFullError
from pdserve.decode_svc.replica import DecodeReplica, DecodeReplicaConfig
from pdserve.engine.engine_config import EngineConfig
from pdserve.engine.output_group import RequestFailure
from pdserve.protocol.sampling_params import SamplingParams
from tests.helpers import ENGINE_DTYPE

DEADLINE_S = 30.0
NUM_TOKENS = 3


def test_a_prompt_past_the_waiting_bound_fails_alone_and_the_others_are_served(tiny_model):
    async def main():
        engine = EngineConfig(model=tiny_model(), dtype=ENGINE_DTYPE, kv_cache_memory_bytes=16 * 2**20)
        replica = DecodeReplica(DecodeReplicaConfig(engine, "d0", "127.0.0.1:1", max_waiting_requests=2),
                                asyncio.get_running_loop())
        replica.start()
        release = threading.Event()
        held = replica.engine.call(lambda engine: release.wait(DEADLINE_S))
        with replica.session() as session:
            for i in range(3):
                session.prefill_here(f"r{i}", [5, 6, 7, 8], [], SamplingParams(max_tokens=NUM_TOKENS), seed=0)
            release.set()
            await held
            failures, num_tokens = {}, {}

            async def until_all_ended():
                while len(failures) + len(num_tokens) < 3 or sum(num_tokens.values()) < 2 * NUM_TOKENS:
                    for entry in await session.next_step():
                        if isinstance(entry, RequestFailure):
                            failures[entry.request_id] = entry.error
                        else:
                            num_tokens[entry.request_id] = num_tokens.get(entry.request_id, 0) + len(entry.new_token_ids)

            await asyncio.wait_for(until_all_ended(), DEADLINE_S)
        await replica.stop()
        return failures, num_tokens

    failures, num_tokens = asyncio.run(main())
    assert list(failures) == ["r2"] and isinstance(failures["r2"], WaitingQueueFullError)
    assert num_tokens == {"r0": NUM_TOKENS, "r1": NUM_TOKENS}
