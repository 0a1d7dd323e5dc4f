"""Each system's command line: every one loads the weights in the run's dtype, parsed by the real
command's own parser; vLLM runs only with its peer script."""
import dataclasses
from pathlib import Path

import pytest

from pdserve.bench.errors import BenchConfigError
from pdserve.bench.systems import SystemOptions, SystemUnavailable, parse_systems, system_spec


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


def test_disaggregated_runs_the_asked_xpyd():
    up = parse_pdserve(system_spec("disaggregated", dataclasses.replace(
        options(), num_prefill_replicas=2, num_decode_replicas=3)).argv)
    assert (up.prefill, up.decode) == (2, 3)


def test_vllm_gets_the_dtype_and_prefix_caching_after_the_peer_scripts_own(tmp_path):
    script = tmp_path / "peer"
    script.write_text("#!/bin/sh\n")
    argv = system_spec("vllm", options("bfloat16", peer_vllm=script)).argv
    assert argv[:4] == (str(script), "serve", "/models/tiny", argv[3])
    assert argv[4:] == ("--dtype", "bfloat16", "--enable-prefix-caching")


def test_a_peer_without_its_script_is_unavailable(tmp_path):
    with pytest.raises(SystemUnavailable, match="no --peer-vllm"):
        system_spec("vllm", options())
    with pytest.raises(SystemUnavailable, match="not found"):
        system_spec("vllm", options(peer_vllm=tmp_path / "missing"))


def test_systems_parse_in_order_and_unknown_or_repeated_names_are_refused():
    assert parse_systems("vllm, colocated") == ("vllm", "colocated")
    for text in ("static", "llama-cpp", "colocated,colocated", ""):
        with pytest.raises(BenchConfigError):
            parse_systems(text)
