"""Each system's command line: every one loads the weights in the run's dtype, parsed by the real
command's own parser; the peers run only with their scripts (and llama.cpp with its GGUF); only
`pdserve up` has a gRPC front for the grpc backend."""
import dataclasses
from pathlib import Path

import pytest

from pdserve.bench.errors import BenchConfigError
from pdserve.bench.systems import LLAMA_CPP_SLOTS, SystemOptions, SystemUnavailable, parse_systems, system_spec


def options(dtype: str = "float32", **peers) -> SystemOptions:
    return SystemOptions(model_dir=Path("/models/tiny"), dtype=dtype, **peers)


def parse_pdserve(argv: tuple[str, ...]):
    from pdserve.cli import build_parser

    assert argv[1:3] == ("-m", "pdserve")
    return build_parser().parse_args(argv[3:])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_colocated_and_disaggregated_load_the_asked_dtype(dtype):
    colocated = parse_pdserve(system_spec("colocated", options(dtype)).argv)
    assert (colocated.dtype, colocated.enable_prefix_caching) == (dtype, True)
    disaggregated = parse_pdserve(system_spec("disaggregated", options(dtype)).argv)
    assert (disaggregated.model, disaggregated.dtype) == ("/models/tiny", dtype)


def test_a_kv_pool_size_reaches_every_pdserve_engine_and_none_leaves_pdserves_default():
    sized = dataclasses.replace(options(), kv_cache_memory_bytes=64 * 2**20)
    for name in ("colocated", "disaggregated"):
        assert parse_pdserve(system_spec(name, sized).argv).kv_cache_memory == 64 * 2**20
        assert parse_pdserve(system_spec(name, options()).argv).kv_cache_memory is None


def test_disaggregated_runs_the_asked_xpyd():
    up = parse_pdserve(system_spec("disaggregated", dataclasses.replace(
        options(), num_prefill_replicas=2, num_decode_replicas=3)).argv)
    assert (up.prefill, up.decode) == (2, 3)


def test_more_flags_reach_their_system():
    flagged = dataclasses.replace(options(), up_flags=("--line-order", "fifo"),
                                  serve_flags=("--max-num-batched-tokens", "512"))
    up, serve = (parse_pdserve(system_spec(name, flagged).argv) for name in ("disaggregated", "colocated"))
    assert (up.line_order, serve.max_num_batched_tokens) == ("fifo", 512)
    assert parse_pdserve(system_spec("colocated", options()).argv).max_num_batched_tokens == 2048


def test_vllm_gets_the_dtype_and_prefix_caching_after_the_peer_scripts_own(tmp_path):
    script = tmp_path / "peer"
    script.write_text("#!/bin/sh\n")
    argv = system_spec("vllm", options("bfloat16", peer_vllm=script)).argv
    assert argv[:4] == (str(script), "serve", "/models/tiny", argv[3])
    assert argv[4:] == ("--dtype", "bfloat16", "--enable-prefix-caching")


def test_llama_cpp_serves_the_gguf_with_its_slots(tmp_path):
    script, gguf = tmp_path / "peer", tmp_path / "model.gguf"
    script.write_text("#!/bin/sh\n")
    gguf.write_bytes(b"GGUF")
    argv = system_spec("llama-cpp", options(peer_llama_cpp=script, gguf=gguf)).argv
    assert argv[:3] == (str(script), "serve", str(gguf)) and argv[4] == str(LLAMA_CPP_SLOTS)
    with pytest.raises(SystemUnavailable, match="--gguf"):
        system_spec("llama-cpp", options(peer_llama_cpp=script))


def test_a_peer_without_its_script_is_unavailable(tmp_path):
    with pytest.raises(SystemUnavailable, match="no --peer-vllm"):
        system_spec("vllm", options())
    with pytest.raises(SystemUnavailable, match="not found"):
        system_spec("vllm", options(peer_vllm=tmp_path / "missing"))
    with pytest.raises(SystemUnavailable, match="no --peer-llama-cpp"):
        system_spec("llama-cpp", options())


def test_the_grpc_backend_targets_the_gateway_of_pdserve_up_alone():
    spec = system_spec("disaggregated", options())
    up = parse_pdserve(spec.argv)
    assert spec.target("grpc") == f"127.0.0.1:{up.grpc_port}" and spec.target("openai") == spec.base_url
    with pytest.raises(SystemUnavailable, match="no gRPC front"):
        system_spec("colocated", options()).target("grpc")


def test_systems_parse_in_order_and_unknown_or_repeated_names_are_refused():
    assert parse_systems("vllm, colocated") == ("vllm", "colocated")
    for text in ("static", "colocated,colocated", ""):
        with pytest.raises(BenchConfigError):
            parse_systems(text)
