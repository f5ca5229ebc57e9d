"""KV block ids: allocation, freeing and the only writer of sequences' block tables."""

from __future__ import annotations

from collections import deque

from bucketserve.engine.sequence import Sequence


class OutOfBlocksError(RuntimeError):
    """Raised when an allocation asks for more blocks than are free."""


class BlockManager:
    """Free-list allocator over block ids [0, num_blocks)."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self._num_total = num_blocks
        self._free: deque[int] = deque(range(num_blocks))
        self._is_free = [True] * num_blocks

    @property
    def num_total_blocks(self) -> int:
        """Pool size in blocks."""
        return self._num_total

    @property
    def num_free_blocks(self) -> int:
        """Blocks not held by anyone."""
        return len(self._free)

    def blocks_needed(self, num_tokens: int) -> int:
        """Blocks that hold `num_tokens` tokens."""
        return -(-num_tokens // self.block_size)

    def can_allocate(self, num_blocks: int) -> bool:
        """Enough free blocks for `num_blocks`."""
        return num_blocks <= len(self._free)

    def allocate(self, num_blocks: int) -> list[int]:
        """Take `num_blocks` free block ids."""
        if num_blocks < 0:
            raise ValueError(f"num_blocks must be >= 0, got {num_blocks}")
        if not self.can_allocate(num_blocks):
            raise OutOfBlocksError(f"asked for {num_blocks} blocks, {len(self._free)} free")
        ids = [self._free.popleft() for _ in range(num_blocks)]
        for i in ids:
            self._is_free[i] = False
        return ids

    def free(self, block_ids) -> None:
        """Return block ids to the pool; freeing a free or unknown id is an error."""
        block_ids = list(block_ids)
        for i in block_ids:
            if not 0 <= i < self._num_total:
                raise ValueError(f"block id must be in [0, {self._num_total}), got {i}")
            if self._is_free[i]:
                raise ValueError(f"block {i} is already free")
        for i in block_ids:
            self._is_free[i] = True
            self._free.append(i)

    def blocks_to_grow(self, seq: Sequence, num_tokens: int) -> int:
        """Extra blocks `seq` needs so its table covers `num_tokens` tokens."""
        return max(0, self.blocks_needed(num_tokens) - len(seq.block_table))

    def allocate_for(self, seq: Sequence, num_tokens: int | None = None) -> list[int]:
        """Grow seq.block_table to cover `num_tokens` (default: all its tokens); new ids."""
        count = seq.num_tokens if num_tokens is None else num_tokens
        new_ids = self.allocate(self.blocks_to_grow(seq, count))
        seq.block_table.extend(new_ids)
        return new_ids

    def can_ensure_slot(self, seq: Sequence) -> bool:
        """A decode step for `seq` (its newest token needs a slot) can be allocated."""
        return self.can_allocate(self.blocks_to_grow(seq, seq.num_tokens))

    def ensure_slot(self, seq: Sequence) -> None:
        """Make room for the newest token's KV before a decode step."""
        self.allocate_for(seq, seq.num_tokens)

    def detach(self, seq: Sequence) -> list[int]:
        """Clear seq.block_table without freeing: the ids now belong to the caller (e.g. a
        pending prefill->decode hand-off), who frees them later."""
        ids = list(seq.block_table)
        seq.block_table.clear()
        return ids

    def release(self, seq: Sequence) -> None:
        """Free all blocks of `seq` and clear its table."""
        self.free(seq.block_table)
        seq.block_table.clear()
