"""The engine's flags become its config: --kv-cache-memory takes a size with its unit and the
config holds it in bytes; a size it cannot read stops parsing with the forms it takes;
--quantization is int8 or int4, and the startup line says so."""
import argparse

import pytest

from pdserve.engine.engine_args import add_engine_arguments, engine_config_from, model_text


def parse(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="/m")
    add_engine_arguments(parser)
    return parser.parse_args(flags)


def test_kv_cache_memory_reaches_the_config_in_bytes():
    assert engine_config_from(parse("--kv-cache-memory", "2GiB"), detokenize=True).kv_cache_memory_bytes == 2**31
    assert engine_config_from(parse("--kv-cache-memory", "4096"), detokenize=True).kv_cache_memory_bytes == 4096
    assert engine_config_from(parse(), detokenize=True).kv_cache_memory_bytes is None


def test_a_size_it_cannot_read_stops_parsing_and_says_what_it_takes(capsys):
    with pytest.raises(SystemExit):
        parse("--kv-cache-memory", "4GB")
    assert "such as 4GiB, 512MiB or a number of bytes" in capsys.readouterr().err


def test_quantization_reaches_the_config_and_names_the_weights_in_the_startup_line(tiny_model, capsys):
    assert engine_config_from(parse(), detokenize=True).quantization is None
    for quantization in ("int8", "int4"):
        assert engine_config_from(parse("--quantization", quantization), detokenize=True).quantization == quantization
    with pytest.raises(SystemExit):
        parse("--quantization", "fp8")
    assert "invalid choice: 'fp8'" in capsys.readouterr().err
    args = parse("--quantization", "int8", "--dtype", "float32")
    args.model = tiny_model()
    assert model_text(args, "tiny") == "tiny (float32 on cpu, int8 weights)"
    args.quantization = None
    assert model_text(args, "tiny") == "tiny (float32 on cpu)"


def test_the_kv_cache_dtype_reaches_the_config_and_the_startup_line(tiny_model):
    assert engine_config_from(parse(), detokenize=True).kv_cache_dtype == "auto"
    args = parse("--kv-cache-dtype", "int8", "--dtype", "float32")
    assert engine_config_from(args, detokenize=True).kv_cache_dtype == "int8"
    args.model = tiny_model()
    assert model_text(args, "tiny") == "tiny (float32 on cpu, int8 KV)"
