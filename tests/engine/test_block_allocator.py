"""The block allocator as a specification: tables grow by whole blocks, a block belongs to one
table at a time, and no sequence of allocations and frees leaks a block."""
import pytest
from hypothesis import given, settings, strategies as st

from pdserve.engine.block_allocator import BlockAllocator, OutOfBlocksError


def test_allocate_takes_whole_blocks_and_free_returns_them():
    allocator = BlockAllocator(num_blocks=8, block_size=4)
    table = allocator.allocate("a", 5)
    assert len(table) == 2 and allocator.num_free_blocks == 6
    assert allocator.allocate("a", 8) == table  # still fits in two blocks
    assert len(allocator.allocate("a", 9)) == 3
    allocator.free("a")
    assert allocator.num_free_blocks == 8


def test_a_table_maps_positions_to_blocks_of_its_own():
    allocator = BlockAllocator(num_blocks=4, block_size=4)
    other = allocator.allocate("other", 4)  # so that "a" does not start at block 0
    table = allocator.allocate("a", 6)
    assert allocator.block_table("a") == table and len(table) == 2
    assert not set(table) & set(other)
    assert 0 not in table


def test_out_of_blocks_raises_and_changes_nothing():
    allocator = BlockAllocator(num_blocks=2, block_size=4)
    allocator.allocate("a", 4)
    assert not allocator.can_allocate("b", 8)
    with pytest.raises(OutOfBlocksError):
        allocator.allocate("b", 8)
    assert allocator.num_free_blocks == 1
    assert allocator.can_allocate("b", 4)


def test_free_of_unknown_request_is_a_no_op():
    allocator = BlockAllocator(num_blocks=2, block_size=4)
    allocator.free("never-seen")
    assert allocator.num_free_blocks == 2


operations = st.lists(
    st.tuples(st.sampled_from(["alloc", "grow", "free"]), st.integers(0, 5), st.integers(1, 40)),
    max_size=60)


@settings(max_examples=300, deadline=None)
@given(operations)
def test_no_sequence_of_operations_leaks_or_double_books_a_block(ops):
    allocator = BlockAllocator(num_blocks=16, block_size=4)
    sizes: dict[str, int] = {}
    for op, rid, num_tokens in ops:
        name = f"r{rid}"
        if op in ("alloc", "grow"):
            target = max(num_tokens, sizes.get(name, 0))
            if allocator.can_allocate(name, target):
                allocator.allocate(name, target)
                sizes[name] = target
            else:
                with pytest.raises(OutOfBlocksError):
                    allocator.allocate(name, target)
        elif op == "free":
            allocator.free(name)
            sizes.pop(name, None)
        tables = [allocator.block_table(r) for r in sizes]
        owned = [block_id for table in tables for block_id in table]
        assert len(owned) == len(set(owned))  # no block in two tables
        assert allocator.num_free_blocks + len(owned) == allocator.num_blocks
    for name in list(sizes):
        allocator.free(name)
    assert allocator.num_free_blocks == allocator.num_blocks
