"""Decode-side KV reservations as a specification: writes only into live reservations and only
with their write token, every reservation either joins a request or ends, a caller's blocks in
reservations are capped, and the blocks of an ended reservation are never handed back while a
write into them is in progress or can still start (fencing): a receiver-side write until it ends,
an in-place writer (a fake write fence here) until it lets go of the fence, however long after
the deadline that is."""
import pytest

from pdserve.decode_svc.reservations import CallerQuotaError, ReservationError, ReservationTable
from pdserve.protocol.errors import WriteTokenError

TOKEN = b"t" * 16


def no_writer(first_block_id: int) -> bool:
    return True


def table_of(timeout_s: float) -> ReservationTable:
    return ReservationTable(timeout_s, no_writer)


def add(table, request_id, block_ids, now_s=0, caller="gw", in_place=False, num_prompt_tokens=4):
    return table.add(request_id, block_ids, num_prompt_tokens, now_s, caller=caller, write_token=TOKEN,
                     in_place=in_place)


def test_only_a_reservation_awaiting_kv_accepts_writes():
    table = table_of(5)
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
    table = table_of(5)
    add(table, "r", [3])
    with pytest.raises(WriteTokenError):
        table.begin_write("r", token, now_s=0)
    with pytest.raises(WriteTokenError):
        table.mark_landed("r", token, num_bytes=8, now_s=0)
    with pytest.raises(ReservationError, match="not landed"):
        table.join("r")


def test_join_needs_landed_kv_and_removes_the_entry():
    table = table_of(5)
    add(table, "r", [1])
    with pytest.raises(ReservationError, match="not landed"):
        table.join("r")
    table.mark_landed("r", TOKEN, num_bytes=8, now_s=0)
    assert table.join("r").block_ids == [1]
    assert len(table) == 0
    with pytest.raises(ReservationError, match="no reservation"):
        table.join("r")


def test_unlanded_and_unjoined_reservations_expire():
    table = table_of(5)
    add(table, "never-lands", [1])
    add(table, "never-joins", [2])
    table.mark_landed("never-joins", TOKEN, num_bytes=8, now_s=3)  # landing renews the deadline
    assert [e.request_id for e in table.pop_ended(now_s=5)] == ["never-lands"]
    assert table.pop_ended(now_s=7.9) == []
    assert [e.request_id for e in table.pop_ended(now_s=8)] == ["never-joins"]
    assert len(table) == 0


def test_a_write_after_the_deadline_cannot_begin_or_land():
    table = table_of(1)
    add(table, "r", [1])
    with pytest.raises(ReservationError):
        table.begin_write("r", TOKEN, now_s=1)
    with pytest.raises(ReservationError):
        table.mark_landed("r", TOKEN, num_bytes=8, now_s=1)
    table.pop_ended(now_s=2)
    with pytest.raises(ReservationError):
        table.mark_landed("r", TOKEN, num_bytes=8, now_s=2)


def test_expiry_during_a_write_frees_the_blocks_only_when_the_write_ends():
    table = table_of(1)
    add(table, "r", [7, 8])
    table.begin_write("r", TOKEN, now_s=0.5)
    assert table.pop_ended(now_s=2) == []  # expired, but the write still holds the blocks
    assert table.pop_ended(now_s=3) == []
    with pytest.raises(ReservationError):  # and nothing new may start in them
        table.begin_write("r", TOKEN, now_s=3)
    with pytest.raises(ReservationError):
        table.mark_landed("r", TOKEN, num_bytes=8, now_s=3)
    released = table.end_write("r")
    assert released is not None and released.block_ids == [7, 8]
    assert len(table) == 0 and table.pop_ended(now_s=4) == []


def test_an_abort_during_a_write_frees_the_blocks_only_when_the_last_write_ends():
    table = table_of(5)
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
    table = table_of(5)
    add(table, "r", [7])
    table.begin_write("r", TOKEN, now_s=0)
    with pytest.raises(ReservationError, match="still being written"):
        table.mark_landed("r", TOKEN, num_bytes=8, now_s=0)
    table.end_write("r")
    table.mark_landed("r", TOKEN, num_bytes=8, now_s=0)


class FakeFence:
    """The write fence as the table sees it: a writer holds a reservation's first block or not."""

    def __init__(self):
        self.held: set[int] = set()
        self.closed: list[int] = []

    def try_close(self, first_block_id: int) -> bool:
        if first_block_id in self.held:
            return False
        self.closed.append(first_block_id)
        return True


def test_an_expired_in_place_reservation_is_fenced_and_released_at_its_deadline():
    fence = FakeFence()
    table = ReservationTable(1, fence.try_close)
    add(table, "shm", [4, 5], in_place=True)
    add(table, "grpc", [2])
    assert table.pop_ended(now_s=0.9) == [] and fence.closed == []
    assert [e.request_id for e in table.pop_ended(now_s=1)] == ["shm", "grpc"]
    assert fence.closed == [4]  # only the in-place one has a fence, named by its first block


def test_an_in_place_writer_paused_past_the_deadline_keeps_the_blocks_until_it_lets_go():
    fence = FakeFence()
    table = ReservationTable(1, fence.try_close)
    add(table, "shm", [4, 5], in_place=True)
    fence.held.add(4)  # its writer took the fence in time, then stopped mid-copy
    for now_s in (1, 10, 1e6):
        assert table.pop_ended(now_s=now_s) == []
    with pytest.raises(ReservationError):  # its late commit is refused
        table.mark_landed("shm", TOKEN, num_bytes=8, now_s=2)
    with pytest.raises(ReservationError):
        table.join("shm")
    fence.held.clear()  # the copy finished, or its process is gone
    assert [e.block_ids for e in table.pop_ended(now_s=1e6)] == [[4, 5]]
    assert fence.closed == [4] and len(table) == 0


def test_an_abort_under_an_in_place_writer_releases_the_blocks_once_it_lets_go():
    fence = FakeFence()
    table = ReservationTable(5, fence.try_close)
    add(table, "shm", [4], in_place=True)
    fence.held.add(4)
    assert table.remove("shm") is False  # the caller must not release the blocks now
    assert table.remove("shm") is False
    assert table.pop_ended(now_s=0) == []
    fence.held.clear()
    assert [e.request_id for e in table.pop_ended(now_s=0)] == ["shm"]
    assert table.remove("shm") is True and fence.closed == [4]


def test_an_abort_with_no_in_place_writer_closes_the_fence_and_releases_at_once():
    fence = FakeFence()
    table = ReservationTable(5, fence.try_close)
    add(table, "shm", [4], in_place=True)
    assert table.remove("shm") is True
    assert fence.closed == [4] and len(table) == 0


def test_a_landed_in_place_reservation_has_no_writer_left_to_fence():
    fence = FakeFence()
    table = ReservationTable(1, fence.try_close)
    add(table, "shm", [4], in_place=True)
    table.mark_landed("shm", TOKEN, num_bytes=8, now_s=0)  # its writer commits after its copy
    assert [e.request_id for e in table.pop_ended(now_s=1)] == ["shm"]
    assert fence.closed == []


def test_each_caller_holds_at_most_its_cap_in_reservations_not_yet_joined():
    table = ReservationTable(5, no_writer, max_blocks_per_caller=4)
    add(table, "a", [1, 2, 3], caller="gw-1")
    table.check_quota("gw-1", 1)
    with pytest.raises(CallerQuotaError, match="cap of 4 blocks"):
        table.check_quota("gw-1", 2)
    table.check_quota("gw-2", 4)  # another caller has its own share
    table.mark_landed("a", TOKEN, num_bytes=8, now_s=0)
    table.join("a")  # joined blocks belong to a running request, not to a reservation
    table.check_quota("gw-1", 4)
