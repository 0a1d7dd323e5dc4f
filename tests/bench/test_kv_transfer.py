"""`pdserve bench kv-transfer` on the CPU: every transport's row, and the decode pool read back
holds exactly the bytes sent, so a transport that lands the wrong bytes fails the run."""
import pytest
import torch

from pdserve.bench.kv_transfer import KVNotLanded, check_landed, measure


def test_every_cpu_transport_is_timed_and_lands_the_bytes_it_sent():
    rows = measure(num_bytes=2**20, num_repeats=1)  # raises KVNotLanded otherwise
    assert [row["path"] for row in rows] == ["torch copy_ (contiguous)", "torch block copy (scattered)",
                                          "kvtransfer TRANSPORT_SHM", "kvtransfer TRANSPORT_GRPC"]
    assert all(row["gb_per_s"] > 0 for row in rows)


def test_a_wrong_byte_or_a_write_outside_the_reservation_is_caught():
    src = torch.arange(2 * 2 * 3, dtype=torch.float32).view(1, 2, 3, 2, 1, 1)  # 3 blocks of 2 tokens
    pool = torch.zeros(1, 2, 5, 2, 1, 1)
    pool[:, :, [4, 0, 2]] = src[:, :, [0, 1, 2]]
    check_landed(pool, src, [0, 1, 2], [4, 0, 2])
    pool[0, 0, 1, 0] = 1.0  # an unreserved block
    with pytest.raises(KVNotLanded, match="not reserved"):
        check_landed(pool, src, [0, 1, 2], [4, 0, 2])
    pool[0, 0, 1, 0], pool[0, 1, 4, 1] = 0.0, -1.0  # a reserved one, wrong
    with pytest.raises(KVNotLanded, match="do not hold"):
        check_landed(pool, src, [0, 1, 2], [4, 0, 2])
