"""BlockManager: tables, the free list, prefix hits by block hash, copy-on-write, release."""
import pytest

from scratchllm.serve import BlockManager, OutOfBlocks


def test_tables_slots_and_the_free_list():
    bm = BlockManager(n_blocks=5, block_size=4)
    assert bm.add("a", list(range(6))) == 0 and bm.reserve("a", 6) == []
    assert len(bm.tables["a"]) == 2 and bm.n_free == 3
    bm.commit("a", list(range(6)))
    assert bm.slots("a", 3, 3) == [(bm.tables["a"][0], 3), (bm.tables["a"][1], 0),
                                   (bm.tables["a"][1], 1)]
    with pytest.raises(OutOfBlocks):
        bm.reserve("a", 15)  # 21 tokens need 6 blocks
    assert len(bm.tables["a"]) == 2 and bm.n_free == 3  # nothing changed
    bm.release("a")
    assert bm.n_free == 5 and bm.blocks_in_use() == 0


def test_prefix_hits_share_full_blocks_only():
    bm = BlockManager(n_blocks=8, block_size=4)
    system = [7, 7, 1, 2, 3, 4, 5, 6]
    a = system + [9, 9, 9]
    bm.add("a", a), bm.reserve("a", len(a)), bm.commit("a", a)
    b = system + [1]
    assert bm.add("b", b) == 8  # both full blocks of the system prompt
    assert bm.tables["b"] == bm.tables["a"][:2] and bm.refs[bm.tables["a"][0]] == 2
    c = system  # its last token must be computed: only the first block is shared
    assert bm.add("c", c) == 4
    assert bm.add("d", [7, 7, 1, 0, 3]) == 0  # a different first block: no hit
    assert (bm.hits, bm.lookups) == (3, 2 + 2 + 1 + 1)


def test_freed_blocks_keep_their_hash_until_reused():
    bm = BlockManager(n_blocks=3, block_size=2)
    a = [1, 2, 3, 4, 5]
    bm.add("a", a), bm.reserve("a", 5), bm.commit("a", a)
    bm.release("a")
    assert bm.n_free == 3 and bm.fits([1, 2, 3, 4, 9], extra=1)
    assert bm.add("b", [1, 2, 3, 4, 9]) == 4  # hit on freed blocks
    assert bm.n_free == 1
    bm.reserve("b", 2)  # takes the last free block (a's tail): its hash is gone
    assert bm.add("c", [1, 2, 3, 4, 5, 6]) == 4


def test_copy_on_write_of_a_shared_partial_block():
    bm = BlockManager(n_blocks=4, block_size=4)
    bm.add("a", [1, 2, 3, 4, 5, 6]), bm.reserve("a", 6), bm.commit("a", [1, 2, 3, 4, 5, 6])
    bm.fork("a", "b")
    last = bm.tables["a"][1]
    assert bm.refs[last] == 2
    copies = bm.reserve("b", 1)  # b writes slot 2 of the shared block: copy it first
    assert copies == [(last, bm.tables["b"][1])] and bm.tables["b"][1] != last
    assert bm.refs[last] == 1 and bm.tables["a"][1] == last
    assert bm.reserve("a", 1) == []  # a owns its block alone now: no copy
    assert bm.tables["a"][0] == bm.tables["b"][0] and bm.refs[bm.tables["a"][0]] == 2
