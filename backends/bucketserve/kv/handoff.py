"""Prefill->decode block ownership: blocks stay pending until decode acks, or a timeout expires.

A block may be pending in several hand-offs at once when prefix caching shares it (a cached
prefix); each hand-off then holds its own reference, and the caller frees what `reclaim`
returns once per hand-off."""

from __future__ import annotations

import mmap
import threading
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass
from multiprocessing.shared_memory import SharedMemory

import numpy as np

from bucketserve.kv import shm

_MAGIC = 0x42534B5648414E44  # "BSKVHAND"
_VERSION = 1
_HEADER_WORDS = 4  # magic, version, num_slots, reserved
# Table layout, int64 words: header, then three columns of num_slots words each:
#   pub_gen     (producer writes) generation last published in the slot
#   expired_gen (producer writes) last generation the producer declared expired
#   ack_gen     (consumers write) last generation a consumer acknowledged
# handoff_id = gen * num_slots + slot with gen >= 1 growing per slot, so a late ack of an old
# hand-off can never be mistaken for the slot's current one (no ABA).


@dataclass(slots=True)
class _Pending:
    gen: int
    block_ids: list[int]
    deadline: float


class HandoffTable:
    """Shared-memory ack table owned by one prefill instance and opened by decode instances."""

    __slots__ = (
        "name", "num_slots", "timeout_s", "num_acked", "num_expired",
        "_owner", "_pub", "_expired", "_ack", "_pending", "_free", "_busy", "_lock",
    )  # fmt: skip

    def __init__(self, name: str, mm: mmap.mmap, owner: SharedMemory | None, timeout_s: float):
        words = np.frombuffer(mm, dtype=np.int64)  # views keep the mapping alive
        self.name, self.num_slots, self.timeout_s = name, int(words[2]), timeout_s
        self.num_acked = self.num_expired = 0
        self._owner = owner
        n, h = self.num_slots, _HEADER_WORDS
        self._pub, self._expired, self._ack = (
            words[h : h + n],
            words[h + n : h + 2 * n],
            words[h + 2 * n :],
        )
        self._pending: dict[int, _Pending] = {}  # slot -> hand-off (producer only)
        self._free: deque[int] = deque(range(n))  # FIFO: a slot is reused as late as possible
        self._busy: Counter[int] = Counter()  # block id -> pending hand-offs holding it
        self._lock = threading.Lock()  # producer threads (execute, reclaim loop) may overlap

    @classmethod
    def create(cls, name: str, num_blocks: int, timeout_s: float) -> HandoffTable:
        """Create the table (producer side); one slot per block bounds the pending hand-offs."""
        if num_blocks < 1:
            raise ValueError(f"num_blocks={num_blocks} must be >= 1")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s={timeout_s} must be > 0")
        nbytes = 8 * (_HEADER_WORDS + 3 * num_blocks)
        owner = shm.create_segment(name, nbytes, f"hand-off table {name!r}")
        mm = shm.map_segment(name, nbytes)
        words = np.frombuffer(mm, dtype=np.int64)
        words[1:3] = (_VERSION, num_blocks)
        shm.full_fence()
        words[0] = _MAGIC  # last: openers treat a table without magic as not yet created
        return cls(name, mm, owner, timeout_s)

    @classmethod
    def open(cls, name: str) -> HandoffTable:
        """Open a producer's table by name (consumer side)."""
        mm = shm.map_segment(name)
        words = np.frombuffer(mm, dtype=np.int64)
        if words.size < _HEADER_WORDS or int(words[0]) != _MAGIC:
            raise FileNotFoundError(f"hand-off table {name!r} exists but is not initialised yet")
        if int(words[1]) != _VERSION or words.size != _HEADER_WORDS + 3 * int(words[2]):
            raise ValueError(
                f"hand-off table {name!r}: version {int(words[1])} (need {_VERSION}) or size "
                f"{words.size} words does not match {int(words[2])} slots"
            )
        return cls(name, mm, None, timeout_s=0.0)

    @property
    def num_pending(self) -> int:
        """Hand-offs published and not yet reclaimed (producer side)."""
        return len(self._pending)

    @property
    def num_pending_blocks(self) -> int:
        """Blocks held by pending hand-offs (producer side)."""
        return len(self._busy)

    def publish(self, block_ids: Iterable[int], now: float, num_shared: int = 0) -> int:
        """Mark blocks pending for decode and return the hand-off id to send with them. The
        first `num_shared` (a cached prefix) may be pending in other hand-offs already."""
        # The blocks' KV must be complete on the device (e.g. the first token was read back).
        self._require_owner("publish")
        ids = [int(b) for b in block_ids]
        if not ids:
            raise ValueError("block_ids must not be empty")
        for b in ids:
            if not 0 <= b < self.num_slots:
                raise ValueError(f"block_ids contains {b}, must be in [0, {self.num_slots})")
        with self._lock:
            if len(set(ids)) != len(ids) or any(self._busy[b] for b in ids[num_shared:]):
                raise ValueError("block_ids repeats a block or names one already pending")
            # Never empty: every pending hand-off holds >= 1 unshared block (a cached prefix
            # stops short of the last token) of the num_slots blocks, so one slot is free.
            slot = self._free.popleft()
            gen = int(self._pub[slot]) + 1
            self._pub[slot] = gen
            self._pending[slot] = _Pending(gen, ids, now + self.timeout_s)
            self._busy.update(ids)
        return gen * self.num_slots + slot

    def reclaim(self, now: float) -> list[int]:
        """Return the block ids of acked or expired hand-offs; the caller frees them (once)."""
        self._require_owner("reclaim")
        freed: list[int] = []
        with self._lock:
            for slot, p in list(self._pending.items()):
                if int(self._ack[slot]) != p.gen:
                    if now < p.deadline:
                        continue
                    # Announce the expiry, then look again for an ack that raced with it
                    # (Dekker): a consumer acking after this reads expired_gen and discards.
                    self._expired[slot] = p.gen
                    shm.full_fence()
                if int(self._ack[slot]) == p.gen:
                    self.num_acked += 1
                else:
                    self.num_expired += 1
                del self._pending[slot]
                self._free.append(slot)
                for b in p.block_ids:
                    self._busy[b] -= 1
                    if not self._busy[b]:
                        del self._busy[b]
                freed.extend(p.block_ids)
        return freed

    def ack(self, handoff_id: int) -> bool:
        """Acknowledge a finished copy (synchronise the device first); False: expired, discard it."""
        slot, gen = handoff_id % self.num_slots, handoff_id // self.num_slots
        pub = int(self._pub[slot])
        if gen < 1 or gen > pub:
            raise ValueError(f"handoff_id={handoff_id} was never published in table {self.name!r}")
        if gen == pub:
            self._ack[slot] = gen
            shm.full_fence()
        # For an id whose slot was already reused this is conservative: False if any later
        # hand-off in the slot expired. True means the producer cannot have reclaimed the blocks
        # before this ack, so a copy finished before calling ack() is intact.
        return int(self._expired[slot]) < gen

    def close(self) -> None:
        """Drop this process's mapping (the table stays for other processes)."""
        self._pub = self._expired = self._ack = None  # the last view gone unmaps the table

    def unlink(self) -> None:
        """Remove the table's name (producer, at shutdown)."""
        self._require_owner("unlink")
        self._owner.unlink()

    def _require_owner(self, what: str) -> None:
        if self._owner is None:
            raise RuntimeError(f"{what}() is for the producer that created table {self.name!r}")
