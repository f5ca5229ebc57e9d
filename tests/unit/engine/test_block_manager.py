"""BlockManager: allocation, freeing, and block-table growth."""

from __future__ import annotations

import pytest
from bucketserve.engine.block_manager import BlockManager, OutOfBlocksError
from bucketserve.engine.sequence import Sequence
from hypothesis import given, settings
from hypothesis import strategies as st


def test_allocate_and_free_round_trip():
    bm = BlockManager(num_blocks=8, block_size=4)
    ids = bm.allocate(3)
    assert len(set(ids)) == 3 and bm.num_free_blocks == 5 and bm.num_total_blocks == 8
    bm.free(ids)
    assert bm.num_free_blocks == 8


def test_allocate_too_many_raises_and_keeps_state():
    bm = BlockManager(4, 4)
    assert not bm.can_allocate(5)
    with pytest.raises(OutOfBlocksError):
        bm.allocate(5)
    assert bm.num_free_blocks == 4


def test_double_free_and_unknown_ids_rejected():
    bm = BlockManager(4, 4)
    ids = bm.allocate(2)
    bm.free(ids)
    with pytest.raises(ValueError, match="already free"):
        bm.free(ids[:1])
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        bm.free([9])


@pytest.mark.parametrize(("tokens", "blocks"), [(0, 0), (1, 1), (4, 1), (5, 2), (16, 4)])
def test_blocks_needed(tokens, blocks):
    assert BlockManager(8, 4).blocks_needed(tokens) == blocks


def test_constructor_validation_names_field():
    with pytest.raises(ValueError, match="num_blocks must be >= 1, got 0"):
        BlockManager(0, 4)
    with pytest.raises(ValueError, match="block_size must be >= 1, got 0"):
        BlockManager(4, 0)


def test_allocate_for_ensure_slot_release():
    bm = BlockManager(8, 4)
    seq = Sequence(list(range(6)))
    assert bm.allocate_for(seq) == seq.block_table and len(seq.block_table) == 2
    for _ in range(2):  # positions 6, 7 fit the second block
        seq.append_token(1)
        bm.ensure_slot(seq)
    assert len(seq.block_table) == 2
    seq.append_token(1)  # position 8 crosses into a third block
    assert bm.can_ensure_slot(seq)
    bm.ensure_slot(seq)
    assert len(seq.block_table) == 3 and bm.num_free_blocks == 5
    bm.release(seq)
    assert seq.block_table == [] and bm.num_free_blocks == 8


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 6)), max_size=40))
def test_random_ops_never_leak_or_duplicate(ops):
    bm, held = BlockManager(16, 2), []
    for is_alloc, n in ops:
        if is_alloc and bm.can_allocate(n):
            held.append(bm.allocate(n))
        elif held:
            bm.free(held.pop(n % len(held)))
        flat = [i for ids in held for i in ids]
        assert len(flat) == len(set(flat))
        assert bm.num_free_blocks + len(flat) == 16
