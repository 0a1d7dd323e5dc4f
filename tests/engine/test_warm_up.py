"""The warm-up launches each kernel variant serving can ask for: one width per distinct launch
key, every width serving can use shares a key with one of them, and the warm-up steps run
against the pool touching block 0 alone; layers on blocks run once on each row tile. That Triton then compiles nothing more is GPU-only."""
import pytest
import torch

from pdserve.engine.config import ModelConfig
from pdserve.engine.kv_cache import KVCacheSpec
from pdserve.engine.warm_up import warm_up
from pdserve.engine.weights import load_model
from pdserve.kernels.launch_variants import launch_key, warm_up_widths


@pytest.mark.parametrize("max_blocks_per_seq, block_size", [(8192, 16), (128, 16), (64, 32), (3, 8)])
def test_every_width_shares_its_launch_key_with_one_warm_up_width(max_blocks_per_seq, block_size):
    widths = warm_up_widths(max_blocks_per_seq, block_size)
    keys = [launch_key(width, block_size) for width in widths]
    assert len(set(keys)) == len(keys)
    assert {launch_key(w, block_size) for w in range(1, max_blocks_per_seq + 1)} == set(keys)
    assert widths[0] == 1 and widths[-1] <= max_blocks_per_seq


def test_widths_reach_every_split_count_and_integer_specialization():
    keys = {launch_key(width, 16) for width in warm_up_widths(8192, 16)}
    assert {num_splits_pad for _, num_splits_pad, _, _ in keys} == {1, 2, 4, 8, 16}
    assert {width_class for *_, width_class in keys} == {"one", "multiple of 16", "other"}


def test_the_warm_up_steps_touch_block_zero_only(tiny_model):
    model_dir = tiny_model(dtype="float32")
    config = ModelConfig.from_dir(model_dir)
    model = load_model(model_dir, config, torch.float32, torch.device("cpu"))
    spec = KVCacheSpec.for_model(config, 16, torch.float32)
    kv_cache = spec.allocate(8, torch.device("cpu")).zero_()  # to see what the warm-up writes
    warm_up(model, kv_cache, 16, warm_up_widths(8, 16), torch.device("cpu"))
    assert kv_cache[:, :, 0].abs().sum() > 0
    assert not kv_cache[:, :, 1:].any()


def test_the_row_tiles_warmed_up_are_every_tile_a_block_linear_launch_picks():
    from pdserve.kernels.triton_block_linear import ROW_TILES, Tiles

    assert {Tiles().rows_for(num_rows) for num_rows in range(1, 4097)} == set(ROW_TILES)


def test_the_warm_up_runs_layers_on_blocks_on_each_row_tile(tiny_model):
    model_dir = tiny_model(dtype="float32")
    config = ModelConfig.from_dir(model_dir)
    model = load_model(model_dir, config, torch.float32, torch.device("cpu"), quantization="int8")
    spec = KVCacheSpec.for_model(config, 16, torch.float32)
    seen = []
    model.lm_head.register_forward_hook(lambda layer, args, out: seen.append(args[0].shape[0]))
    warm_up(model, spec.allocate(8, torch.device("cpu")), 16, [1], torch.device("cpu"))
    assert seen == [2, 16, 32, 64]  # the step's two tokens, then each tile's rows
