"""A model with sliding-window layers is warmed up at widths that reach every decode variant of
each of its layers' windows, and a window changes the variants only where it caps the keys."""
import pytest

from pdserve.kernels.launch_variants import launch_key, warm_up_widths


@pytest.mark.parametrize("sliding_windows", [(None, 512), (4096,), (None, 100, 1000)])
def test_every_width_shares_each_windows_launch_key_with_one_warm_up_width(sliding_windows):
    max_blocks_per_seq, block_size = 2048, 16
    widths = warm_up_widths(max_blocks_per_seq, block_size, sliding_windows)
    for window in sliding_windows:
        warmed = {launch_key(width, block_size, window) for width in widths}
        assert {launch_key(w, block_size, window) for w in range(1, max_blocks_per_seq + 1)} == warmed


def test_a_window_changes_the_launch_only_where_it_caps_the_keys():
    assert launch_key(8, 16, 4096) == launch_key(8, 16)  # 128 keys, under the window
    assert launch_key(2048, 16, 512) != launch_key(2048, 16)
    assert launch_key(2048, 16, 512)[:3] == launch_key(32, 16)[:3]  # 512 keys either way
