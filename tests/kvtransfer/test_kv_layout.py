"""The layout handshake as a specification: a fingerprint names exactly the fields that make KV
blocks byte-compatible, and any difference is refused with every differing field named."""
import dataclasses
import subprocess
import sys

import pytest
import torch

from pdserve.engine.kv_cache import KVCacheMismatchError, KVCacheSpec
from pdserve.kvtransfer.layout import LAYOUT_VERSION, LayoutMismatchError, check_layout, make_layout
from pdserve.protocol.errors import InvalidConfigError

SPEC = KVCacheSpec(num_layers=4, num_kv_heads=2, head_dim=64, block_size=16, dtype=torch.bfloat16)


def test_layout_carries_every_field_of_the_spec():
    layout = make_layout("tiny-llama", SPEC)
    assert (layout.model, layout.dtype, layout.num_layers, layout.num_kv_heads) == ("tiny-llama", "bfloat16", 4, 2)
    assert (layout.head_dim, layout.block_size, layout.layout_version) == (64, 16, LAYOUT_VERSION)


def test_fingerprint_is_stable_across_processes_and_releases():
    # A changed value means replicas of two releases would refuse each other: bump LAYOUT_VERSION.
    assert make_layout("tiny-llama", SPEC).fingerprint == "a6be60c83b9b09b0"


@pytest.mark.parametrize(
    "changed",
    [
        {"num_layers": 5},
        {"num_kv_heads": 4},
        {"head_dim": 128},
        {"block_size": 32},
        {"dtype": torch.float16},
        {"dtype": torch.int8},
    ],
)
def test_fingerprint_changes_with_every_field(changed):
    fields = {f: getattr(SPEC, f) for f in ("num_layers", "num_kv_heads", "head_dim", "block_size", "dtype")}
    other = KVCacheSpec(**{**fields, **changed})
    assert make_layout("tiny-llama", other).fingerprint != make_layout("tiny-llama", SPEC).fingerprint
    assert make_layout("other-model", SPEC).fingerprint != make_layout("tiny-llama", SPEC).fingerprint


def test_equal_layouts_pass():
    check_layout(make_layout("tiny-llama", SPEC), make_layout("tiny-llama", SPEC))


def test_mismatch_names_the_field_and_both_values():
    decode = make_layout("tiny-llama", SPEC)
    prefill = make_layout("tiny-llama", KVCacheSpec(4, 2, 64, 32, torch.bfloat16))
    with pytest.raises(LayoutMismatchError) as raised:
        check_layout(decode, prefill, "decode", "prefill")
    assert str(raised.value) == "KV layout mismatch: block_size 16 (decode) != 32 (prefill)"


def test_mismatch_names_every_differing_field():
    local = make_layout("tiny-llama", SPEC)
    remote = make_layout("tiny-qwen", KVCacheSpec(4, 2, 64, 16, torch.float32))
    with pytest.raises(LayoutMismatchError) as raised:
        check_layout(local, remote)
    message = str(raised.value)
    assert "model 'tiny-llama' (local) != 'tiny-qwen' (remote)" in message
    assert "dtype 'bfloat16' (local) != 'float32' (remote)" in message
    assert "block_size" not in message


def test_a_missing_or_forged_fingerprint_is_refused():
    local = make_layout("tiny-llama", SPEC)
    forged = dataclasses.replace(make_layout("tiny-llama", SPEC), fingerprint="0" * 16)
    with pytest.raises(LayoutMismatchError, match="fingerprint"):
        check_layout(local, forged)


def test_layout_target_and_transport_choice_import_neither_torch_nor_grpc():
    code = ("import sys, pdserve.kvtransfer.layout, pdserve.kvtransfer.target, pdserve.protocol.transport_choice; "
            "print('torch' in sys.modules, 'grpc' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.split() == ["False", "False"]


def test_spec_is_the_one_source_of_pool_geometry():
    assert SPEC.shape(3) == (4, 2, 3, 16, 2, 64)
    assert SPEC.block_shape == (16, 2, 64)
    assert SPEC.bytes_per_layer_block == 2 * 16 * 2 * 64 * 2  # K and V, bf16
    assert SPEC.bytes_per_block == 4 * SPEC.bytes_per_layer_block
    pool = SPEC.allocate(3, torch.device("cpu"))
    assert pool.numel() * pool.element_size() == 3 * SPEC.bytes_per_block
    assert KVCacheSpec.from_layout(make_layout("tiny-llama", SPEC)) == SPEC


def test_an_int8_pools_entries_carry_their_scale_and_take_about_half_of_bfloat16s_bytes():
    int8 = dataclasses.replace(SPEC, dtype=torch.int8)
    assert int8.block_shape == (16, 2, 64 + 4)  # 64 levels, then a float32 scale's 4 bytes
    assert int8.shape(3) == (4, 2, 3, 16, 2, 68)
    assert int8.bytes_per_layer_block == 2 * 16 * 2 * 68
    assert int8.bytes_per_block / SPEC.bytes_per_block == 68 / 128
    assert KVCacheSpec.from_layout(make_layout("tiny-llama", int8)) == int8
    int8.check(int8.allocate(2, torch.device("cpu")))
    with pytest.raises(InvalidConfigError, match="multiple of 4, not 66"):
        dataclasses.replace(int8, head_dim=66)  # its scales would not be 4-byte aligned


def test_spec_refuses_a_pool_of_another_geometry():
    SPEC.check(SPEC.allocate(5, torch.device("cpu")))
    for wrong in (torch.zeros(4, 2, 5, 16, 2, 32, dtype=torch.bfloat16), torch.zeros(4, 2, 5, 16, 2, 64)):
        with pytest.raises(KVCacheMismatchError, match=r"does not match its spec \[4, 2, num_blocks, 16, 2, 64\]"):
            SPEC.check(wrong)
