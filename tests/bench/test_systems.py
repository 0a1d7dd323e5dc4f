"""Each system's command line: every one loads the weights in the comparison's dtype, parsed by the
real command's own parser."""
import argparse
import dataclasses
from pathlib import Path

import pytest

from pdserve.bench.systems import SystemOptions, SystemUnavailable, system_spec


def options(dtype: str, vllm_script: Path | None = None) -> SystemOptions:
    return SystemOptions(model_dir=Path("/models/tiny"), static_max_batch_size=8, vllm_script=vllm_script,
                         startup_timeout_s=10.0, vllm_startup_timeout_s=10.0, dtype=dtype)


def parse_static(argv: tuple[str, ...]) -> argparse.Namespace:
    from pdserve.bench.static_server import add_arguments

    assert argv[1:3] == ("-m", "pdserve.bench.static_server")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv[3:])


def parse_pdserve(argv: tuple[str, ...]) -> argparse.Namespace:
    from pdserve.cli import build_parser

    assert argv[1:3] == ("-m", "pdserve")
    return build_parser().parse_args(argv[3:])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_static_colocated_and_disaggregated_load_the_asked_dtype(dtype):
    assert parse_static(system_spec("static", options(dtype)).argv).dtype == dtype
    assert parse_pdserve(system_spec("colocated", options(dtype)).argv).dtype == dtype
    disaggregated = parse_pdserve(system_spec("disaggregated", options(dtype)).argv)
    assert (disaggregated.model, disaggregated.dtype) == ("/models/tiny", dtype)


def test_vllm_gets_the_dtype_and_prefix_caching_after_the_peer_scripts_own(tmp_path):
    script = tmp_path / "peer"
    script.write_text("#!/bin/sh\n")
    argv = system_spec("vllm", options("bfloat16", script)).argv
    assert argv[:4] == (str(script), "serve", "/models/tiny", argv[3])
    assert argv[4:] == ("--dtype", "bfloat16", "--enable-prefix-caching")


def test_colocated_caches_prefixes_and_colocated_nocache_does_not():
    assert parse_pdserve(system_spec("colocated", options("float32")).argv).enable_prefix_caching
    assert not parse_pdserve(system_spec("colocated-nocache", options("float32")).argv).enable_prefix_caching


def test_vllm_without_its_peer_script_is_unavailable(tmp_path):
    with pytest.raises(SystemUnavailable, match="no --peer-vllm"):
        system_spec("vllm", options("float32"))
    with pytest.raises(SystemUnavailable, match="not found"):
        system_spec("vllm", options("float32", tmp_path / "missing"))


def test_bench_compare_records_the_dtype_and_the_slos(tmp_path):
    from pdserve.bench.compare import add_arguments, config_from

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    config = config_from(parser.parse_args(["--model", str(tmp_path), "--dtype", "bfloat16",
                                            "--goodput", "ttft:1000", "tpot:50"]))
    workload = config.workload_dict()
    assert (workload["dtype"], workload["goodput_slos_ms"]) == ("bfloat16", {"ttft": 1000.0, "tpot": 50.0})


def test_disaggregated_load_routes_by_load_alone_on_the_asked_decode_replicas():
    many = dataclasses.replace(options("float32"), num_decode_replicas=2)
    cache_aware, load = (parse_pdserve(system_spec(name, many).argv) for name in ("disaggregated", "disaggregated-load"))
    assert (cache_aware.routing, load.routing) == ("cache-aware", "load")
    assert cache_aware.decode == load.decode == 2
