"""The block allocator as a specification: tables grow by whole blocks, shared blocks are
reference-counted, and no sequence of allocations, forks and frees leaks a block."""
import pytest
from hypothesis import given, settings, strategies as st

from engine.block_allocator import BlockAllocator, OutOfBlocksError


def test_allocate_takes_whole_blocks_and_free_returns_them():
    allocator = BlockAllocator(num_blocks=8, block_size=4)
    table = allocator.allocate("a", 5)
    assert len(table) == 2 and allocator.num_free_blocks == 6
    assert allocator.allocate("a", 8) == table  # still fits in two blocks
    assert len(allocator.allocate("a", 9)) == 3
    allocator.free("a")
    assert allocator.num_free_blocks == 8


def test_append_slot_maps_position_through_the_table():
    allocator = BlockAllocator(num_blocks=4, block_size=4)
    allocator.allocate("other", 4)  # so that "a" does not start at block 0
    slots = [allocator.append_slot("a", pos) for pos in range(6)]
    table = allocator.block_table("a")
    assert slots == [table[pos // 4] * 4 + pos % 4 for pos in range(6)]
    assert table[0] != 0


def test_out_of_blocks_raises_and_changes_nothing():
    allocator = BlockAllocator(num_blocks=2, block_size=4)
    allocator.allocate("a", 4)
    assert not allocator.can_allocate("b", 8)
    with pytest.raises(OutOfBlocksError):
        allocator.allocate("b", 8)
    assert allocator.num_free_blocks == 1
    assert allocator.can_allocate("b", 4)


def test_forked_blocks_return_only_after_the_last_owner_frees():
    allocator = BlockAllocator(num_blocks=4, block_size=4)
    parent = allocator.allocate("parent", 8)
    child = allocator.fork("parent", "child", 5)
    assert child == parent
    allocator.free("parent")
    assert allocator.num_free_blocks == 2
    allocator.free("child")
    assert allocator.num_free_blocks == 4


def test_free_of_unknown_request_is_a_no_op():
    allocator = BlockAllocator(num_blocks=2, block_size=4)
    allocator.free("never-seen")
    assert allocator.num_free_blocks == 2


operations = st.lists(
    st.tuples(st.sampled_from(["alloc", "grow", "fork", "free"]), st.integers(0, 5), st.integers(1, 40)),
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
        elif op == "fork" and sizes and name not in sizes:
            parent = sorted(sizes)[0]
            allocator.fork(parent, name, min(num_tokens, sizes[parent]))
            sizes[name] = min(num_tokens, sizes[parent])
        elif op == "free":
            allocator.free(name)
            sizes.pop(name, None)
        referenced = {b for r in sizes for b in allocator.block_table(r)}
        assert allocator.num_free_blocks + len(referenced) == allocator.num_blocks
    for name in list(sizes):
        allocator.free(name)
    assert allocator.num_free_blocks == allocator.num_blocks
