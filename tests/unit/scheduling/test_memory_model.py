"""DecodeMemory: the one decode memory model (admission, growth, tail preemption)."""

from __future__ import annotations

import pytest
from bucketserve.scheduling.memory import DecodeMemory


def test_admission_counts_the_next_token_and_keeps_the_watermark():
    mem = DecodeMemory(total_blocks=100, block_size=16, watermark=0.05)
    assert mem.admit_blocks(16) == 2  # 16 stored tokens + the next token's slot
    assert mem.can_admit(16, free_blocks=7, num_running=1)  # 2 <= 7 - 5
    assert not mem.can_admit(16, free_blocks=6, num_running=1)
    assert mem.can_admit(16, free_blocks=2, num_running=0)  # an idle instance admits what fits


def test_fits_ever_is_the_pool_size():
    mem = DecodeMemory(total_blocks=10, block_size=4)
    assert mem.fits_ever(40) and not mem.fits_ever(41)
    with pytest.raises(ValueError, match="total_blocks"):
        DecodeMemory(total_blocks=0, block_size=4)


def test_preemptions_free_the_tail_until_the_rest_can_grow():
    mem = DecodeMemory(total_blocks=10, block_size=4)
    # three sequences each at a block boundary: each needs one more block
    running = [(3, 13), (3, 13), (3, 13)]
    assert mem.preemptions(running, free_blocks=3) == 0
    assert mem.preemptions(running, free_blocks=1) == 1  # the tail's 3 blocks cover the others
    assert mem.preemptions(running, free_blocks=0) == 1
    assert mem.preemptions([(3, 12), (2, 8)], free_blocks=0) == 0  # no growth needed


def test_growth_is_what_the_running_batch_needs_next_step():
    mem = DecodeMemory(total_blocks=10, block_size=4)
    assert mem.growth([(3, 13), (3, 12), (1, 9)]) == 1 + 0 + 2
