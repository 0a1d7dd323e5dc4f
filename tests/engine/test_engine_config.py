"""`--dtype auto` means what it means in vLLM: on a GPU the checkpoint's dtype, but bfloat16 for a
float32 checkpoint; on a CPU bfloat16 where the CPU has it in hardware, float32 elsewhere."""
import pytest

from pdserve.engine.engine_config import EngineConfig, parse_memory_size, resolve_dtype
from pdserve.protocol.errors import InvalidConfigError


@pytest.mark.parametrize("checkpoint, device, expected", [
    ("float32", "cuda", "bfloat16"),
    ("float32", "cuda:1", "bfloat16"),
    ("float16", "cuda", "float16"),
    ("bfloat16", "cuda", "bfloat16"),
    ("int8", "cuda", "float32"),  # not a dtype the engine runs in: the safe default
])
def test_auto_on_a_gpu_follows_the_checkpoint(checkpoint, device, expected):
    for cpu_bf16 in (False, True):
        assert resolve_dtype("auto", checkpoint, device, cpu_bf16) == expected


@pytest.mark.parametrize("checkpoint", ["float32", "bfloat16", "float16", "int8"])
def test_auto_on_a_cpu_is_bfloat16_where_the_cpu_has_it_and_float32_elsewhere(checkpoint):
    assert resolve_dtype("auto", checkpoint, "cpu", cpu_bf16=True) == "bfloat16"
    assert resolve_dtype("auto", checkpoint, "cpu", cpu_bf16=False) == "float32"


def test_an_explicit_dtype_wins():
    assert resolve_dtype("float16", "float32", "cuda", cpu_bf16=False) == "float16"
    assert resolve_dtype("float32", "bfloat16", "cpu", cpu_bf16=True) == "float32"
    assert resolve_dtype("bfloat16", "float32", "cpu", cpu_bf16=False) == "bfloat16"


def test_the_default_is_auto_and_unknown_names_are_refused():
    assert EngineConfig(model="/m").dtype == "auto"
    with pytest.raises(InvalidConfigError, match="not one of auto"):
        EngineConfig(model="/m", dtype="fp8")


@pytest.mark.parametrize("text, num_bytes", [
    ("4GiB", 4 * 2**30),
    ("512MiB", 512 * 2**20),
    ("1.5 GiB", 3 * 2**29),
    ("64kib", 64 * 2**10),
    ("1TiB", 2**40),
    ("1073741824", 2**30),
    ("100B", 100),
])
def test_a_memory_size_is_bytes_or_a_number_of_binary_units(text, num_bytes):
    assert parse_memory_size(text) == num_bytes


@pytest.mark.parametrize("text", ["", "GiB", "4GB", "4 G", "-1GiB", "1.5", "0x10", "4GiB extra"])
def test_anything_else_is_refused_with_the_forms_it_takes(text):
    with pytest.raises(InvalidConfigError, match="such as 4GiB, 512MiB or a number of bytes"):
        parse_memory_size(text)


def test_the_pool_is_given_in_blocks_or_in_bytes_not_both():
    with pytest.raises(InvalidConfigError, match="not both"):
        EngineConfig(model="/m", num_gpu_blocks=8, kv_cache_memory_bytes=2**20)


def test_the_kv_pool_is_in_the_dtype_or_int8():
    import torch

    assert EngineConfig(model="/m").kv_torch_dtype(torch.bfloat16) == torch.bfloat16
    assert EngineConfig(model="/m", kv_cache_dtype="int8").kv_torch_dtype(torch.bfloat16) == torch.int8
    for other in ("fp8", "int4", "bfloat16", ""):
        with pytest.raises(InvalidConfigError, match="kv_cache_dtype .* is not one of auto, int8"):
            EngineConfig(model="/m", kv_cache_dtype=other)


def test_quantization_is_none_int8_or_int4():
    assert EngineConfig(model="/m").quantization is None
    for quantization in ("int8", "int4"):
        assert EngineConfig(model="/m", quantization=quantization).quantization == quantization
    for other in ("fp8", "INT8", "q4_1", ""):
        with pytest.raises(InvalidConfigError, match="quantization .* is not one of int8, int4"):
            EngineConfig(model="/m", quantization=other)
