"""A prefill and a decode replica with int8 KV pools (`--kv-cache-dtype int8`) serve through the
gateway what one in-process engine with an int8 pool serves, token for token: the prefill replica
samples the first token and writes the int8 entries, which cross to the decode replica over shared
memory, and decoding goes on from them. (A decode replica of a float pool is never paired with an
int8 prefill replica: tests/system/test_kv_layout_pairing.py.)
"""
import asyncio

import pytest

from pdserve.engine.config import ModelConfig
from pdserve.engine.llm import LLM
from pdserve.protocol.sampling_params import SamplingParams
from tests.helpers import ENGINE_OPTIONS
from tests.system.test_disaggregated import stream_all

pytestmark = pytest.mark.e2e

INT8_KV = ("--kv-cache-dtype", "int8")


def test_int8_pools_serve_what_an_engine_with_an_int8_pool_serves(make_cluster, e2e_model):
    cluster = make_cluster([
        ("prefill", "p0", INT8_KV),
        ("decode", "d0", INT8_KV),
        ("gateway", "gw", ("--prefill-placement", "remote")),
    ])
    vocab_size = ModelConfig.from_dir(e2e_model).vocab_size
    cases = [([(11 * i + 3 * j) % vocab_size for j in range(3 + 23 * i)], 5 + i % 4) for i in range(8)]

    results = asyncio.run(stream_all(cluster.gateway.endpoint, cases))

    engine = LLM(e2e_model, **ENGINE_OPTIONS, kv_cache_dtype="int8")
    expected = [output.outputs[0].token_ids for output in engine.generate(
        [prompt for prompt, _ in cases],
        [SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True) for _, max_tokens in cases],
        use_tqdm=False)]
    assert [token_ids for token_ids, _, _ in results] == [list(tokens) for tokens in expected]
    assert {info.decode_replica for _, _, info in results} == {"d0"}
    cluster.assert_all_kv_free()
