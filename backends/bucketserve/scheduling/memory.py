"""Block-granular KV memory: what each batch may take from the prefill and decode KV pools, and
the one decode memory model (on-demand growth, watermark admission, tail preemption) that the
scheduler, the decode worker, the offline LLMEngine and the simulator all use."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace

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


def watermark_blocks(total_blocks: int, watermark: float) -> int:
    """Blocks admission keeps free on a pool of total_blocks (vLLM's watermark, rounded up)."""
    return int(watermark * total_blocks + 0.999999)


def capacity_message(prompt_len: int, max_tokens: int, capacity_tokens: int) -> str:
    """The error of a request that can never fit a decode pool (a busy error, not a 400)."""
    return (
        f"server busy: prompt ({prompt_len} tokens) + max_tokens ({max_tokens}) exceeds the "
        f"decode KV cache ({capacity_tokens} tokens); lower max_tokens"
    )


@dataclass(slots=True)
class DecodeMemory:
    """The decode memory model: one pool of `total_blocks` blocks of `block_size` tokens.

    * A sequence holds blocks for the tokens whose KV is stored, and grows one block at a time
      as it decodes (no up-front reservation of max_tokens).
    * Admission (a hand-off, or a preempted sequence coming back) needs the blocks of its
      tokens plus the next token's slot, and leaves free the running batch's next-step growth
      and the watermark.
    * When the running batch cannot grow, the lowest-ranked sequences (the tail of the running
      list: the newest admitted) are preempted and recomputed later, never failed.
    * A request fails for capacity only when prompt + max_tokens can never fit the pool.
    """

    total_blocks: int
    block_size: int
    watermark: float = 0.01

    def __post_init__(self) -> None:
        if self.total_blocks < 1 or self.block_size < 1:
            raise ValueError(
                f"total_blocks and block_size must be >= 1, got {self.total_blocks}, "
                f"{self.block_size}"
            )
        if not 0.0 <= self.watermark <= 0.5:
            raise ValueError(f"watermark must be in [0, 0.5], got {self.watermark}")

    @property
    def capacity_tokens(self) -> int:
        return self.total_blocks * self.block_size

    def fits_ever(self, num_tokens: int) -> bool:
        """Whether a sequence of num_tokens tokens fits this pool at all."""
        return num_tokens <= self.capacity_tokens

    def admit_blocks(self, num_tokens: int) -> int:
        """Blocks a sequence with num_tokens stored tokens needs to be admitted (plus one slot)."""
        return blocks_for(num_tokens + 1, self.block_size)

    def can_admit(self, num_tokens: int, free_blocks: int, num_running: int = 0) -> bool:
        """Admission: its blocks fit and the watermark stays free (an empty instance always
        admits what fits, so a large request cannot starve behind the watermark)."""
        need = self.admit_blocks(num_tokens)
        keep = watermark_blocks(self.total_blocks, self.watermark) if num_running else 0
        return need <= free_blocks - keep

    def growth(self, running: list[tuple[int, int]]) -> int:
        """Blocks the running batch needs for its next step; admission leaves them free so a
        request it admits is not preempted at once (recompute thrash).
        `running` holds (blocks held, tokens to store after the step) per sequence."""
        return sum(max(0, blocks_for(t, self.block_size) - held) for held, t in running)

    def preemptions(self, running: list[tuple[int, int]], free_blocks: int,
                    freed: Callable[[int], int] | None = None) -> int:  # fmt: skip
        """How many sequences to preempt from the tail so the others can grow this step.

        `running` holds (blocks held, tokens to store after this step) per sequence, highest
        rank first; a preempted sequence needs no growth and returns `freed(i)` blocks (default:
        all it holds; fewer when it shares a cached prefix, whose blocks others still hold).
        `freed` is called only for the sequences considered, i.e. never when all fit."""
        need = [max(0, blocks_for(t, self.block_size) - held) for held, t in running]
        total, k = sum(need), len(running)
        while k > 0 and total > free_blocks:
            k -= 1
            free_blocks += running[k][0] if freed is None else freed(k)
            total -= need[k]
        return len(running) - k


@dataclass(slots=True)
class Reservation:
    """Blocks promised to one request on one decode instance, until it finishes."""

    request_id: str
    decode_id: str
    prompt_blocks: int
    blocks: int
    batch_id: int
    load: float = 0.0  # predicted decode work (placement.request_load)


class DecodeLedger:
    """The scheduler's own account of what it sent to each decode instance."""

    def __init__(self) -> None:
        self._by_request: dict[str, Reservation] = {}
        self._reserved: dict[str, int] = {}
        self._count: dict[str, int] = {}
        self._load: dict[str, float] = {}
        self._order: dict[str, deque[str]] = {}

    def reserve(self, res: Reservation) -> None:
        self._by_request[res.request_id] = res
        self._reserved[res.decode_id] = self._reserved.get(res.decode_id, 0) + res.blocks
        self._count[res.decode_id] = self._count.get(res.decode_id, 0) + 1
        self._load[res.decode_id] = self._load.get(res.decode_id, 0.0) + res.load
        self._order.setdefault(res.decode_id, deque()).append(res.request_id)

    def release(self, request_id: str) -> Reservation | None:
        res = self._by_request.pop(request_id, None)
        if res is not None:
            self._reserved[res.decode_id] -= res.blocks
            self._count[res.decode_id] -= 1
            self._load[res.decode_id] -= res.load
            if not self._count[res.decode_id]:
                self._load[res.decode_id] = 0.0  # no float residue on an empty instance
            order = self._order[res.decode_id]
            while order and order[0] not in self._by_request:
                order.popleft()
        return res

    def move(self, request_id: str, decode_id: str) -> None:
        """The request's decode moved to `decode_id` (hybrid): its reservation goes along."""
        res = self.release(request_id)
        if res is not None:
            order = self._order[res.decode_id]
            if request_id in order:
                order.remove(request_id)
            self.reserve(replace(res, decode_id=decode_id))

    def clear(self, decode_id: str) -> None:
        for request_id in list(self._order.get(decode_id, ())):
            self.release(request_id)

    def reserved(self, decode_id: str) -> int:
        return self._reserved.get(decode_id, 0)

    def count(self, decode_id: str) -> int:
        return self._count.get(decode_id, 0)

    def load(self, decode_id: str) -> float:
        """Predicted decode work of the requests placed on decode_id and not yet finished."""
        return self._load.get(decode_id, 0.0)

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
    keep = watermark_blocks(stats.total_blocks, watermark)
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
    tokens: int | None = None  # prefill token cap of the batch (None: no cap)
    num_taken: int = 0
    colocated: bool = False  # one instance prefills and decodes: a cached prefix is shared

    def try_take(self, prompt_blocks: int, decode_blocks: int, prompt_tokens: int = 0) -> bool:
        """Claim the blocks of one more request if they fit; False (and no change) if not.

        The token cap never refuses the first request: a prompt longer than the cap still has
        to run somewhere, alone (the context limit bounds it)."""
        over_cap = self.tokens is not None and self.num_taken > 0 and prompt_tokens > self.tokens
        if (
            prompt_blocks > self.prefill_blocks
            or decode_blocks > self.decode_blocks
            or self.seqs < 1
            or over_cap
        ):
            return False
        self.prefill_blocks -= prompt_blocks
        self.decode_blocks -= decode_blocks
        self.seqs -= 1
        self.num_taken += 1
        if self.tokens is not None:
            self.tokens -= prompt_tokens
        return True
