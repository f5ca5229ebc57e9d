"""KV block ids: allocation, reference counts, the prefix cache, and the only writer of
sequences' block tables (and of their block hashes)."""

from __future__ import annotations

from collections import Counter, OrderedDict, deque

from bucketserve.engine.block_hash import extend_hashes, root_hash
from bucketserve.engine.sequence import Sequence


class OutOfBlocksError(RuntimeError):
    """Raised when an allocation asks for more blocks than are free."""


class BlockManager:
    """Reference-counted allocator over block ids [0, num_blocks), with an optional prefix cache.

    With `enable_caching`, a full block whose tokens are computed can be registered under its
    chained hash (`cache_blocks`); a later sequence with the same prefix (and salt) takes it
    instead of recomputing it (`find_cached` / `take_cached`). A block whose last reference
    goes stays cached but *evictable*: it counts as free, and is evicted (its hash forgotten)
    only when an allocation has no never-cached block left, least recently freed first.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = False,
                 namespace: str = "") -> None:  # fmt: skip
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size, self.enable_caching, self.namespace = block_size, enable_caching, namespace
        self._num_total = num_blocks
        self._free: deque[int] = deque(range(num_blocks))  # unreferenced, holding no hash
        self._ref = [0] * num_blocks
        self._evictable: OrderedDict[int, None] = OrderedDict()  # unreferenced, cached; LRU first
        self._hash_of: list[int | None] = [None] * num_blocks
        self._block_of: dict[int, int] = {}  # block hash -> block id
        self.num_queried_tokens = self.num_hit_tokens = self.num_evictions = 0

    @property
    def num_total_blocks(self) -> int:
        """Pool size in blocks."""
        return self._num_total

    @property
    def num_free_blocks(self) -> int:
        """Blocks not held by anyone (cached-but-evictable ones included: they are allocatable)."""
        return len(self._free) + len(self._evictable)

    @property
    def num_evictable_blocks(self) -> int:
        """Free blocks that still hold a cached prefix."""
        return len(self._evictable)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks registered in the prefix cache, referenced or not."""
        return len(self._block_of)

    def blocks_needed(self, num_tokens: int) -> int:
        """Blocks that hold `num_tokens` tokens."""
        return -(-num_tokens // self.block_size)

    def can_allocate(self, num_blocks: int) -> bool:
        """Enough free blocks for `num_blocks`."""
        return num_blocks <= self.num_free_blocks

    def allocate(self, num_blocks: int) -> list[int]:
        """Take `num_blocks` free block ids."""
        if num_blocks < 0:
            raise ValueError(f"num_blocks must be >= 0, got {num_blocks}")
        if not self.can_allocate(num_blocks):
            raise OutOfBlocksError(f"asked for {num_blocks} blocks, {self.num_free_blocks} free")
        ids = [self._pop_free() for _ in range(num_blocks)]
        for i in ids:
            self._ref[i] = 1
        return ids

    def _pop_free(self) -> int:
        """A never-cached free block, else evict the least recently freed cached one."""
        if self._free:
            return self._free.popleft()
        block, _ = self._evictable.popitem(last=False)
        del self._block_of[self._hash_of[block]]
        self._hash_of[block] = None
        self.num_evictions += 1
        return block

    def free(self, block_ids) -> None:
        """Drop one reference to each block id; a block nobody holds returns to the pool (a
        cached one stays cached, evictable). Freeing a free or unknown id is an error."""
        block_ids = list(block_ids)
        for i, n in Counter(block_ids).items():
            if not 0 <= i < self._num_total:
                raise ValueError(f"block id must be in [0, {self._num_total}), got {i}")
            if self._ref[i] < n:
                raise ValueError(f"block {i} is already free")
        for i in block_ids:
            self._ref[i] -= 1
            if self._ref[i]:
                continue
            if self._hash_of[i] is None:
                self._free.append(i)
            else:
                self._evictable[i] = None  # most recently freed: evicted last

    def blocks_to_grow(self, seq: Sequence, num_tokens: int) -> int:
        """Extra blocks `seq` needs so its table covers `num_tokens` tokens."""
        return max(0, self.blocks_needed(num_tokens) - len(seq.block_table))

    def allocate_for(self, seq: Sequence, num_tokens: int | None = None) -> list[int]:
        """Grow seq.block_table to cover `num_tokens` (default: all its tokens); new ids."""
        count = seq.num_tokens if num_tokens is None else num_tokens
        grow = self.blocks_to_grow(seq, count)
        if not grow:  # the common decode step: its newest token fits the last block
            return []
        new_ids = self.allocate(grow)
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

    def num_exclusive(self, seq: Sequence) -> int:
        """Blocks of `seq` that nobody else holds: what releasing it frees."""
        return sum(1 for i in seq.block_table if self._ref[i] == 1)

    def release(self, seq: Sequence) -> None:
        """Free all blocks of `seq` and clear its table. Tail first: its later blocks are the
        least likely to be shared, so they are evicted before its prefix."""
        self.free(reversed(seq.block_table))
        seq.block_table.clear()

    # ---- prefix cache ---------------------------------------------------------------------
    def find_cached(self, seq: Sequence) -> list[int]:
        """Block ids of the longest cached prefix of `seq` in full blocks (nothing is taken).
        It stops short of the last token, which must be computed so a token is sampled."""
        if not self.enable_caching:
            return []
        hashes = self._hashes(seq, (seq.num_tokens - 1) // self.block_size)
        hits = []
        for h in hashes[: (seq.num_tokens - 1) // self.block_size]:
            block = self._block_of.get(h)
            if block is None:
                break
            hits.append(block)
        return hits

    def num_unreferenced(self, block_ids) -> int:
        """Of `block_ids`, those nobody holds: taking them uses up free blocks."""
        return sum(1 for i in block_ids if not self._ref[i])

    def take_cached(self, seq: Sequence, block_ids: list[int]) -> int:
        """Start the empty table of `seq` with the cached prefix `block_ids` (from
        `find_cached`); returns the cached tokens. Counts one query of the sequence's tokens."""
        if seq.block_table:
            raise ValueError(f"sequence {seq.seq_id} already holds blocks")
        for i in block_ids:
            if not self._ref[i]:
                del self._evictable[i]
            self._ref[i] += 1
        seq.block_table.extend(block_ids)
        if self.enable_caching:
            self.num_queried_tokens += seq.num_tokens
            self.num_hit_tokens += len(block_ids) * self.block_size
        return len(block_ids) * self.block_size

    def cache_blocks(self, seq: Sequence, start: int, end: int) -> None:
        """Register the blocks of `seq` that tokens [start, end) (just computed) filled. A block
        whose content another block already holds stays uncached (freed as a plain block)."""
        if not self.enable_caching:
            return
        first, stop = start // self.block_size, min(end // self.block_size, len(seq.block_table))
        hashes = self._hashes(seq, stop)
        for i in range(first, stop):
            block, h = seq.block_table[i], hashes[i]
            if self._hash_of[block] is None and h not in self._block_of:
                self._hash_of[block], self._block_of[h] = h, block

    def _hashes(self, seq: Sequence, num_blocks: int) -> list[int]:
        """seq.block_hashes grown to `num_blocks` full blocks (computed once per block)."""
        root = root_hash(self.namespace, seq.cache_salt) if not seq.block_hashes else 0
        return extend_hashes(seq.block_hashes, seq.token_ids, self.block_size, root, num_blocks)
