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
