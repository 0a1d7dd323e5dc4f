"""Staged index lists come back as they went in, each starting 16 bytes aligned in one buffer."""
import pytest
import torch

from pdserve.engine.staging import stage


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_each_list_comes_back_as_a_tensor_of_its_own_values(dtype):
    parts = [[1, 2, 3], [], [7], list(range(10))]
    staged = stage(parts, dtype, torch.device("cpu"))
    assert [tensor.tolist() for tensor in staged] == parts
    assert all(tensor.dtype == dtype for tensor in staged)
    assert len({tensor.untyped_storage().data_ptr() for tensor in staged}) == 1
    assert all(tensor.data_ptr() % 16 == 0 for tensor in staged)


def test_a_staged_table_views_as_rows():
    [rows] = stage([[1, 2, 3, 4, 5, 6]], torch.int32, torch.device("cpu"))
    assert rows.view(2, 3).tolist() == [[1, 2, 3], [4, 5, 6]]
    assert rows.view(2, 3).stride() == (3, 1)
