"""`--dtype auto` means what it means in vLLM: the checkpoint's dtype, but bfloat16 for a float32
checkpoint on a GPU."""
import pytest

from pdserve.engine.engine_config import EngineConfig, resolve_dtype
from pdserve.protocol.errors import InvalidConfigError


@pytest.mark.parametrize("checkpoint, device, expected", [
    ("float32", "cpu", "float32"),
    ("bfloat16", "cpu", "bfloat16"),
    ("float16", "cpu", "float16"),
    ("float32", "cuda", "bfloat16"),
    ("float32", "cuda:1", "bfloat16"),
    ("float16", "cuda", "float16"),
    ("int8", "cpu", "float32"),  # not a dtype the engine runs in: the safe default
])
def test_auto_follows_the_checkpoint(checkpoint, device, expected):
    assert resolve_dtype("auto", checkpoint, device) == expected


def test_an_explicit_dtype_wins():
    assert resolve_dtype("float16", "float32", "cuda") == "float16"
    assert resolve_dtype("float32", "bfloat16", "cpu") == "float32"


def test_the_default_is_auto_and_unknown_names_are_refused():
    assert EngineConfig(model="/m").dtype == "auto"
    with pytest.raises(InvalidConfigError, match="not one of auto"):
        EngineConfig(model="/m", dtype="fp8")
