"""Which engine instance probably holds which prompt prefix, and the placement rule that
weighs that cached overlap against load (pure Python, no torch).

The index is approximate, like Dynamo's ApproxKvIndexer: built from the scheduler's own
placements (the chained full-block hashes of each request it sent), not from engine events;
an entry expires after `ttl_s`, since the engine may have evicted the blocks by then, and the
index keeps at most `max_entries` hashes (least recently sent dropped first).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

BALANCE_TOKENS = 2048.0  # load gap (tokens) beyond which placement goes by load alone
MAX_HOLD_S = 0.25  # longest a request waits for the busy instance that holds its prefix
MIN_HOLD_TOKENS = 256  # ... and only for at least this many more cached tokens than elsewhere


@dataclass(slots=True)
class PrefixIndex:
    """block hash -> {instance id: when a request with that block was last sent there}."""

    ttl_s: float = 120.0
    max_entries: int = 1 << 16
    clock: Callable[[], float] = time.monotonic
    _where: OrderedDict[int, dict[str, float]] = field(default_factory=OrderedDict)

    def __post_init__(self) -> None:
        if not self.ttl_s > 0 or self.max_entries < 1:
            raise ValueError(
                f"ttl_s must be > 0 and max_entries >= 1, got {self.ttl_s}, {self.max_entries}"
            )

    def record(self, instance_id: str, hashes: Sequence[int]) -> None:
        """A request whose full blocks have `hashes` was sent to `instance_id`."""
        now = self.clock()
        for h in hashes:
            self._where.setdefault(h, {})[instance_id] = now
            self._where.move_to_end(h)
        while len(self._where) > self.max_entries:
            self._where.popitem(last=False)

    def overlap(self, hashes: Sequence[int]) -> dict[str, int]:
        """Leading blocks of `hashes` each instance probably still holds (absent: none)."""
        now, out = self.clock(), {}
        alive: set[str] | None = None
        for i, h in enumerate(hashes):
            held = {k for k, t in self._where.get(h, {}).items() if now - t < self.ttl_s}
            alive = held if alive is None else alive & held
            if not alive:
                break
            for k in alive:
                out[k] = i + 1
        return out

    def forget(self, instance_id: str) -> None:
        """The instance restarted: it holds nothing."""
        for where in self._where.values():
            where.pop(instance_id, None)


def by_affinity(instance_ids: Sequence[str], overlap: dict[str, int], load: dict[str, float],
                prompt_tokens: int, block_size: int, balance_tokens: float) -> list[str]:  # fmt: skip
    """Instance ids best first for one request: the lowest cost, tokens to prefill there
    (prompt minus its probable cached prefix) plus the instance's load in tokens (Dynamo's
    cost), unless the loads differ by more than `balance_tokens`; then least loaded first
    (SGLang cache_aware's fallback, so a hot prefix does not pile onto one instance)."""
    loads = [load.get(i, 0.0) for i in instance_ids]
    if not instance_ids or max(loads) - min(loads) > balance_tokens:
        return sorted(instance_ids, key=lambda i: (load.get(i, 0.0), i))

    def cost(i: str) -> tuple[float, str]:
        uncached = max(1, prompt_tokens - overlap.get(i, 0) * block_size)
        return uncached + load.get(i, 0.0), i

    return sorted(instance_ids, key=cost)


def order_instances(index: PrefixIndex | None, instances: list, hashes: Sequence[int],
                    prompt_tokens: int, balance_tokens: float = BALANCE_TOKENS) -> list:  # fmt: skip
    """`instances` (InstanceStats, least loaded first) ordered for a request whose full blocks
    have `hashes`: `by_affinity` with each instance's load in tokens (its prompt backlog plus
    its running sequences). Unchanged without an index or with fewer than two instances."""
    if index is None or len(instances) < 2:
        return instances
    overlap = index.overlap(hashes)
    load = {s.instance_id: float(s.prefill_backlog + s.running) for s in instances}
    ids = [s.instance_id for s in instances]
    order = by_affinity(ids, overlap, load, prompt_tokens, instances[0].block_size, balance_tokens)
    return sorted(instances, key=lambda s: order.index(s.instance_id))


def probably_cached(index: PrefixIndex | None, hashes: Sequence[int], prompt_tokens: int,
                    block_size: int) -> int:  # fmt: skip
    """Prompt tokens some instance probably caches, in full blocks (the engine always
    computes the last prompt token, so never all of them)."""
    if index is None:
        return 0
    blocks = max(index.overlap(hashes).values(), default=0)
    return min(blocks * block_size, (prompt_tokens - 1) // block_size * block_size)


@dataclass(slots=True)
class ColocatedPlacement:
    """Which colocated instances to offer the policy for the oldest waiting request: those
    whose intake is open, in `order_instances`'s order. While the instance it would go to
    (probably holding at least `min_hold_tokens` more of its prefix than any open one, loads
    within `balance_tokens`) has its intake closed, none, for up to `max_hold_s`: that intake reopens within an
    iteration or two, and placing the request elsewhere costs a whole prefill and a second
    copy of the prefix in another pool (which, under load, evicts what that pool's own
    requests share: misses spread)."""

    index: PrefixIndex | None
    balance_tokens: float = BALANCE_TOKENS
    max_hold_s: float = MAX_HOLD_S
    min_hold_tokens: int = MIN_HOLD_TOKENS
    clock: Callable[[], float] = time.monotonic
    num_holds: int = 0  # times a request was held (a metric, and for tests)
    _held: tuple[str, float] | None = None  # (request key, since)

    def offer(self, key: str, instances: list, is_open: Callable[[object], bool],
              hashes: Sequence[int], prompt_tokens: int) -> list:  # fmt: skip
        order = order_instances(self.index, instances, hashes, prompt_tokens, self.balance_tokens)
        is_open_ = {s.instance_id: is_open(s) for s in order}  # once each: it may have effects
        open_ = [s for s in order if is_open_[s.instance_id]]
        if self.index is None or not order or is_open_[order[0].instance_id]:
            return open_
        overlap = self.index.overlap(hashes)
        loads = [s.prefill_backlog + s.running for s in order]
        best_open = max((overlap.get(s.instance_id, 0) for s in open_), default=0)
        gain = (overlap.get(order[0].instance_id, 0) - best_open) * order[0].block_size
        if gain < self.min_hold_tokens:  # a few blocks are not worth a wait
            return open_
        if max(loads) - min(loads) > self.balance_tokens:
            return open_
        now = self.clock()
        if self._held is None or self._held[0] != key:
            self._held = (key, now)
            self.num_holds += 1
        return [] if now - self._held[1] < self.max_hold_s else open_
