"""Block-granular admission: what each batch may take from the prefill and decode KV pools."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from bucketserve.scheduling.cluster import InstanceStats
from bucketserve.scheduling.request import RequestMeta


def blocks_for(tokens: int, block_size: int) -> int:
    """KV blocks holding `tokens` tokens."""
    return -(-tokens // block_size)


def reserve_tokens(meta: RequestMeta, mode: str, expected_output: float) -> int:
    """Output tokens admission reserves on the decode side for one request."""
    if mode == "max":
        return meta.max_tokens
    if mode == "expected":
        return max(1, min(meta.max_tokens, int(round(expected_output))))
    return 1


@dataclass(slots=True)
class Reservation:
    """Blocks promised to one request on one decode instance, until it finishes."""

    request_id: str
    decode_id: str
    prompt_blocks: int
    blocks: int
    batch_id: int


class DecodeLedger:
    """The scheduler's own account of what it sent to each decode instance."""

    def __init__(self) -> None:
        self._by_request: dict[str, Reservation] = {}
        self._reserved: dict[str, int] = {}
        self._count: dict[str, int] = {}
        self._order: dict[str, deque[str]] = {}

    def reserve(self, res: Reservation) -> None:
        self._by_request[res.request_id] = res
        self._reserved[res.decode_id] = self._reserved.get(res.decode_id, 0) + res.blocks
        self._count[res.decode_id] = self._count.get(res.decode_id, 0) + 1
        self._order.setdefault(res.decode_id, deque()).append(res.request_id)

    def release(self, request_id: str) -> Reservation | None:
        res = self._by_request.pop(request_id, None)
        if res is not None:
            self._reserved[res.decode_id] -= res.blocks
            self._count[res.decode_id] -= 1
            order = self._order[res.decode_id]
            while order and order[0] not in self._by_request:
                order.popleft()
        return res

    def clear(self, decode_id: str) -> None:
        for request_id in list(self._order.get(decode_id, ())):
            self.release(request_id)

    def reserved(self, decode_id: str) -> int:
        return self._reserved.get(decode_id, 0)

    def count(self, decode_id: str) -> int:
        return self._count.get(decode_id, 0)

    def batch_ids(self, decode_id: str) -> set[int]:
        return {
            self._by_request[r].batch_id
            for r in self._order.get(decode_id, ())
            if r in self._by_request
        }

    def pending_prompt_blocks(self, decode_id: str, pending: int) -> int:
        """Prompt blocks of the `pending` newest requests sent to decode_id (not yet admitted)."""
        total = 0
        for request_id in reversed(self._order.get(decode_id, ())):
            if pending <= 0:
                break
            res = self._by_request.get(request_id)
            if res is not None:
                total += res.prompt_blocks
                pending -= 1
        return total

    def __len__(self) -> int:
        return len(self._by_request)


def decode_headroom(stats: InstanceStats, ledger: DecodeLedger, watermark: float) -> int:
    """Blocks a new batch may still claim on a decode instance.

    The smaller of two views: the ledger (total minus everything promised and not finished,
    exact when reservations cover the whole output) and the live pool (free minus hand-offs
    queued there whose prompt blocks are not yet allocated), less the watermark.
    """
    keep = int(watermark * stats.total_blocks + 0.999999)
    by_ledger = stats.total_blocks - ledger.reserved(stats.instance_id)
    live = stats.free_blocks - ledger.pending_prompt_blocks(
        stats.instance_id, stats.pending_handoffs
    )
    return min(by_ledger, live) - keep


@dataclass(slots=True)
class Budget:
    """What is left for the batch being formed, in blocks and sequences."""

    prefill_blocks: int
    decode_blocks: int
    seqs: int
    block_size: int

    def try_take(self, prompt_blocks: int, decode_blocks: int) -> bool:
        """Claim the blocks of one more request if they fit; False (and no change) if not."""
        if (
            prompt_blocks > self.prefill_blocks
            or decode_blocks > self.decode_blocks
            or self.seqs < 1
        ):
            return False
        self.prefill_blocks -= prompt_blocks
        self.decode_blocks -= decode_blocks
        self.seqs -= 1
        return True
