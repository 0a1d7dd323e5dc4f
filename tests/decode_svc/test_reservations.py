"""Decode-side KV reservations as a specification: writes only into live reservations and only
with their write token, every reservation either joins a request or ends, a caller's blocks in
reservations are capped, and the blocks of an ended reservation are never handed back while a
write into them is in progress (fencing)."""
import pytest

from pdserve.decode_svc.reservations import CallerQuotaError, ReservationError, ReservationTable
from pdserve.protocol.errors import WriteTokenError

TOKEN = b"t" * 16


def add(table, request_id, block_ids, now_s=0, caller="gw", in_place=False, num_prompt_tokens=4):
    return table.add(request_id, block_ids, num_prompt_tokens, now_s, caller=caller, write_token=TOKEN,
                     in_place=in_place)


def test_only_a_reservation_awaiting_kv_accepts_writes():
    table = ReservationTable(timeout_s=5)
    add(table, "r", [3, 4], num_prompt_tokens=20)
    assert table.begin_write("r", TOKEN, now_s=0) == [3, 4]
    assert table.end_write("r") is None
    table.mark_landed("r", TOKEN, num_bytes=100, now_s=1)
    with pytest.raises(ReservationError):
        table.begin_write("r", TOKEN, now_s=1)
    with pytest.raises(ReservationError, match="no KV reservation"):
        table.begin_write("unknown", TOKEN, now_s=1)


@pytest.mark.parametrize("token", [b"", b"x" * 16], ids=["missing", "wrong"])
def test_a_write_or_landing_without_the_token_is_refused(token):
    table = ReservationTable(timeout_s=5)
    add(table, "r", [3])
    with pytest.raises(WriteTokenError):
        table.begin_write("r", token, now_s=0)
    with pytest.raises(WriteTokenError):
        table.mark_landed("r", token, num_bytes=8, now_s=0)
    with pytest.raises(ReservationError, match="not landed"):
        table.join("r")


def test_join_needs_landed_kv_and_removes_the_entry():
    table = ReservationTable(timeout_s=5)
    add(table, "r", [1])
    with pytest.raises(ReservationError, match="not landed"):
        table.join("r")
    table.mark_landed("r", TOKEN, num_bytes=8, now_s=0)
    assert table.join("r").block_ids == [1]
    assert len(table) == 0
    with pytest.raises(ReservationError, match="no reservation"):
        table.join("r")


def test_unlanded_and_unjoined_reservations_expire():
    table = ReservationTable(timeout_s=5)
    add(table, "never-lands", [1])
    add(table, "never-joins", [2])
    table.mark_landed("never-joins", TOKEN, num_bytes=8, now_s=3)  # landing renews the deadline
    assert [e.request_id for e in table.pop_expired(now_s=5)] == ["never-lands"]
    assert table.pop_expired(now_s=7.9) == []
    assert [e.request_id for e in table.pop_expired(now_s=8)] == ["never-joins"]
    assert len(table) == 0


def test_a_write_after_the_deadline_cannot_begin_or_land():
    table = ReservationTable(timeout_s=1)
    add(table, "r", [1])
    with pytest.raises(ReservationError):
        table.begin_write("r", TOKEN, now_s=1)
    with pytest.raises(ReservationError):
        table.mark_landed("r", TOKEN, num_bytes=8, now_s=1)
    table.pop_expired(now_s=2)
    with pytest.raises(ReservationError):
        table.mark_landed("r", TOKEN, num_bytes=8, now_s=2)


def test_expiry_during_a_write_frees_the_blocks_only_when_the_write_ends():
    table = ReservationTable(timeout_s=1)
    add(table, "r", [7, 8])
    table.begin_write("r", TOKEN, now_s=0.5)
    assert table.pop_expired(now_s=2) == []  # expired, but the write still holds the blocks
    assert table.pop_expired(now_s=3) == []
    with pytest.raises(ReservationError):  # and nothing new may start in them
        table.begin_write("r", TOKEN, now_s=3)
    with pytest.raises(ReservationError):
        table.mark_landed("r", TOKEN, num_bytes=8, now_s=3)
    released = table.end_write("r")
    assert released is not None and released.block_ids == [7, 8]
    assert len(table) == 0 and table.pop_expired(now_s=4) == []


def test_an_abort_during_a_write_frees_the_blocks_only_when_the_last_write_ends():
    table = ReservationTable(timeout_s=5)
    add(table, "r", [7])
    table.begin_write("r", TOKEN, now_s=0)
    table.begin_write("r", TOKEN, now_s=0)
    assert table.remove("r") is False  # the caller must not release the blocks now
    with pytest.raises(ReservationError):
        table.join("r")
    assert table.end_write("r") is None  # one write still runs
    assert table.end_write("r").request_id == "r"
    assert table.remove("r") is True and len(table) == 0


def test_landing_waits_for_writes_in_progress():
    table = ReservationTable(timeout_s=5)
    add(table, "r", [7])
    table.begin_write("r", TOKEN, now_s=0)
    with pytest.raises(ReservationError, match="still being written"):
        table.mark_landed("r", TOKEN, num_bytes=8, now_s=0)
    table.end_write("r")
    table.mark_landed("r", TOKEN, num_bytes=8, now_s=0)


def test_expired_in_place_blocks_stay_out_of_reuse_for_the_grace_period():
    table = ReservationTable(timeout_s=1, in_place_grace_s=2)
    add(table, "shm", [1], in_place=True)
    add(table, "grpc", [2])
    assert [e.request_id for e in table.pop_expired(now_s=1)] == ["grpc"]
    with pytest.raises(ReservationError):
        table.mark_landed("shm", TOKEN, num_bytes=8, now_s=1.5)  # the commit comes too late
    assert table.pop_expired(now_s=2.9) == []
    assert [e.request_id for e in table.pop_expired(now_s=3)] == ["shm"]


def test_each_caller_holds_at_most_its_cap_in_reservations_not_yet_joined():
    table = ReservationTable(timeout_s=5, max_blocks_per_caller=4)
    add(table, "a", [1, 2, 3], caller="gw-1")
    table.check_quota("gw-1", 1)
    with pytest.raises(CallerQuotaError, match="cap of 4 blocks"):
        table.check_quota("gw-1", 2)
    table.check_quota("gw-2", 4)  # another caller has its own share
    table.mark_landed("a", TOKEN, num_bytes=8, now_s=0)
    table.join("a")  # joined blocks belong to a running request, not to a reservation
    table.check_quota("gw-1", 4)
