"""Decode-side KV reservations as a specification: writes only into live reservations, and
every reservation either joins a request or expires."""
import pytest

from decode_svc.reservations import ReservationError, ReservationTable


def test_only_a_reservation_awaiting_kv_accepts_writes():
    table = ReservationTable(timeout_s=5)
    table.add("r", [3, 4], num_prompt_tokens=20, now_s=0)
    assert table.writable_block_ids("r") == [3, 4]
    table.mark_landed("r", num_bytes=100, now_s=1)
    assert table.writable_block_ids("r") is None
    assert table.writable_block_ids("unknown") is None


def test_join_needs_landed_kv_and_removes_the_entry():
    table = ReservationTable(timeout_s=5)
    table.add("r", [1], num_prompt_tokens=4, now_s=0)
    with pytest.raises(ReservationError, match="not landed"):
        table.join("r")
    table.mark_landed("r", num_bytes=8, now_s=0)
    assert table.join("r").block_ids == [1]
    assert len(table) == 0
    with pytest.raises(ReservationError, match="no reservation"):
        table.join("r")


def test_unlanded_and_unjoined_reservations_expire():
    table = ReservationTable(timeout_s=5)
    table.add("never-lands", [1], num_prompt_tokens=4, now_s=0)
    table.add("never-joins", [2], num_prompt_tokens=4, now_s=0)
    table.mark_landed("never-joins", num_bytes=8, now_s=3)  # landing renews the deadline
    assert [e.request_id for e in table.pop_expired(now_s=5)] == ["never-lands"]
    assert table.pop_expired(now_s=7.9) == []
    assert [e.request_id for e in table.pop_expired(now_s=8)] == ["never-joins"]
    assert len(table) == 0


def test_a_push_after_expiry_cannot_land():
    table = ReservationTable(timeout_s=1)
    table.add("r", [1], num_prompt_tokens=4, now_s=0)
    table.pop_expired(now_s=2)
    with pytest.raises(ReservationError):
        table.mark_landed("r", num_bytes=8, now_s=2)
