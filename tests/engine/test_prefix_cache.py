"""Prefix caching in the block allocator, as a specification: a table may start with the blocks of
a cached prefix, shares them, never writes them, and no sequence of operations leaks a block or
serves a prefix from a block that holds other tokens."""
from hypothesis import given, settings, strategies as st

from pdserve.engine.block_allocator import BlockAllocator
from pdserve.protocol.kv_blocks import block_hashes, hash_block

BLOCK_SIZE = 4


def computed(allocator: BlockAllocator, request_id: str, tokens: list[int]) -> list[int]:
    """Allocates `tokens` for a new request from its longest cached prefix and registers its full
    blocks, as the scheduler does once their KV is computed; returns the table."""
    hashes = block_hashes(tokens, BLOCK_SIZE)
    prefix = allocator.lookup(block_hashes(tokens[:-1], BLOCK_SIZE))
    table = allocator.allocate(request_id, len(tokens), prefix)
    allocator.cache_blocks(request_id, hashes)
    return table


def test_block_hashes_chain_so_equal_blocks_after_different_prefixes_differ():
    first = block_hashes([1, 2, 3, 4, 5, 6, 7, 8], BLOCK_SIZE)
    second = block_hashes([9, 2, 3, 4, 5, 6, 7, 8], BLOCK_SIZE)
    assert first[0] != second[0] and first[1] != second[1]
    assert first[1] == hash_block(first[0], [5, 6, 7, 8])
    assert block_hashes([1, 2, 3, 4, 5, 6, 7], BLOCK_SIZE) == first[:1]  # partial blocks get none


def test_a_new_table_shares_the_blocks_of_a_cached_prefix():
    allocator = BlockAllocator(num_blocks=8, block_size=BLOCK_SIZE)
    first = computed(allocator, "a", list(range(10)))  # blocks: [0-3] [4-7] [8-9 partial]
    second = computed(allocator, "b", list(range(8)) + [50, 51, 52])
    assert second[:2] == first[:2] and second[2] != first[2]
    assert allocator.num_free_blocks == 8 - 4


def test_freed_blocks_stay_cached_until_the_pool_needs_them_least_recently_freed_first():
    allocator = BlockAllocator(num_blocks=4, block_size=BLOCK_SIZE)
    old = computed(allocator, "old", [1] * 8)
    allocator.free("old")
    recent = computed(allocator, "recent", [2] * 8)
    allocator.free("recent")
    assert allocator.num_free_blocks == 4 and allocator.num_cached_blocks == 4
    assert allocator.lookup(block_hashes([1] * 8, BLOCK_SIZE)) == old

    computed(allocator, "new", [3] * 8)  # takes two blocks: the least recently freed ones
    assert allocator.lookup(block_hashes([1] * 8, BLOCK_SIZE)) == []
    assert allocator.lookup(block_hashes([2] * 8, BLOCK_SIZE)) == recent


def test_a_hit_on_free_cached_blocks_counts_them_as_taken():
    allocator = BlockAllocator(num_blocks=3, block_size=BLOCK_SIZE)
    computed(allocator, "a", [1] * 8)
    allocator.free("a")
    prefix = allocator.lookup(block_hashes([1] * 8, BLOCK_SIZE))
    assert allocator.num_new_blocks("b", 12, prefix) == 3  # two reclaimed from the cache, one new
    assert allocator.can_allocate("b", 12, prefix) and not allocator.can_allocate("b", 16, prefix)


def test_with_caching_disabled_nothing_is_shared():
    allocator = BlockAllocator(num_blocks=8, block_size=BLOCK_SIZE, enable_caching=False)
    first = computed(allocator, "a", list(range(9)))
    second = computed(allocator, "b", list(range(9)))
    assert not set(first) & set(second) and allocator.num_cached_blocks == 0


def test_a_hash_already_cached_in_another_block_leaves_this_block_private():
    allocator = BlockAllocator(num_blocks=8, block_size=BLOCK_SIZE)
    tokens = [7] * 5
    first = allocator.allocate("a", 5)
    second = allocator.allocate("b", 5)  # computed side by side, before either registered
    allocator.cache_blocks("a", block_hashes(tokens, BLOCK_SIZE))
    allocator.cache_blocks("b", block_hashes(tokens, BLOCK_SIZE))
    assert allocator.lookup(block_hashes(tokens, BLOCK_SIZE)) == first[:1] != second[:1]
    allocator.free("a")
    allocator.free("b")
    assert allocator.num_free_blocks == 8 and allocator.num_cached_blocks == 1


requests = st.lists(
    st.tuples(st.sampled_from(["run", "free"]), st.integers(0, 5),
              st.lists(st.integers(0, 2), min_size=1, max_size=20)),  # few token values: many shared prefixes
    max_size=60)


@settings(max_examples=300, deadline=None)
@given(requests)
def test_no_sequence_of_operations_leaks_a_block_writes_a_shared_one_or_serves_wrong_kv(ops):
    """Models each block's KV as the tokens last written into it; a request writes the positions
    past its cached prefix. Writing a shared block, or reusing a cached one under its old hash,
    would make some table read back tokens that are not its own."""
    allocator = BlockAllocator(num_blocks=8, block_size=BLOCK_SIZE)  # tight: cached blocks get reused
    contents: dict[int, list[int | None]] = {block: [None] * BLOCK_SIZE for block in range(8)}
    tokens_of: dict[str, list[int]] = {}
    for op, index, tokens in ops:
        name = f"r{index}"
        if op == "free" or name in tokens_of:
            allocator.free(name)
            tokens_of.pop(name, None)
            continue
        prefix = allocator.lookup(block_hashes(tokens[:-1], BLOCK_SIZE))
        if not allocator.can_allocate(name, len(tokens), prefix):
            continue
        table = allocator.allocate(name, len(tokens), prefix)
        for pos in range(len(prefix) * BLOCK_SIZE, len(tokens)):
            block = table[pos // BLOCK_SIZE]
            contents[block][pos % BLOCK_SIZE] = tokens[pos]
        allocator.cache_blocks(name, block_hashes(tokens, BLOCK_SIZE))
        tokens_of[name] = tokens

        owned = {block for request_id in tokens_of for block in allocator.block_table(request_id)}
        assert allocator.num_free_blocks + len(owned) == allocator.num_blocks
        for request_id, request_tokens in tokens_of.items():  # every table reads back its own tokens
            table = allocator.block_table(request_id)
            assert [contents[table[pos // BLOCK_SIZE]][pos % BLOCK_SIZE]
                    for pos in range(len(request_tokens))] == request_tokens
    for name in list(tokens_of):
        allocator.free(name)
    assert allocator.num_free_blocks == allocator.num_blocks
