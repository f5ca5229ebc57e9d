"""Decode placement: which decode instance takes the next prefill batch (SCLS max–min balancing).

One small API, shared by the server's scheduler and the simulator:

    placer = DecodePlacer("maxmin")          # or "least_loaded", "round_robin"
    chosen = placer.choose([
        DecodeCandidate("decode0", headroom_blocks=120, num_requests=7, predicted_load=9.1e4),
        DecodeCandidate("decode1", headroom_blocks=300, num_requests=3, predicted_load=2.0e4),
    ])                                       # -> the decode1 candidate, or None if none has room

* `headroom_blocks`: KV blocks a new batch may still claim there (memory.decode_headroom);
  an instance with none is never chosen.
* `num_requests`: requests running there or on their way (placed, not yet finished).
* `predicted_load`: the SCLS slice view of decode work, sum over its requests of
  remaining output tokens x context (`request_load`); the scheduler keeps it per instance
  in its ledger, adding a request's load when it places it and removing it when it finishes.

Policies: "maxmin" (default) puts the batch where the predicted load is smallest, which is the
choice that minimises the largest load after placement (the max–min objective of SCLS's
offloader, arXiv 2406.13511); "least_loaded" takes the fewest requests; "round_robin" cycles
through instance ids. Ties go to the most headroom, then the lowest id.
"""

from __future__ import annotations

from dataclasses import dataclass

DECODE_BALANCES = ("maxmin", "least_loaded", "round_robin")


def request_load(prompt_len: int, output_tokens: float) -> float:
    """Predicted decode work of one request: each remaining step reads its whole context, so
    sum_{k=1..out} (prompt + k) = out x (prompt + (out + 1) / 2) token-reads."""
    out = max(0.0, output_tokens)
    return out * (prompt_len + (out + 1) / 2)


@dataclass(slots=True, frozen=True)
class DecodeCandidate:
    """One decode instance as the placer sees it."""

    instance_id: str
    headroom_blocks: int
    num_requests: int = 0
    predicted_load: float = 0.0


class DecodePlacer:
    """Chooses a decode instance by policy; round-robin keeps its position between calls."""

    def __init__(self, policy: str = "maxmin") -> None:
        if policy not in DECODE_BALANCES:
            raise ValueError(f"decode_balance must be one of {DECODE_BALANCES}, got {policy!r}")
        self.policy = policy
        self._last: str | None = None

    def choose(self, candidates: list[DecodeCandidate]) -> DecodeCandidate | None:
        """The candidate the policy prefers among those with headroom, or None."""
        fits = [c for c in candidates if c.headroom_blocks > 0]
        if not fits:
            return None
        if self.policy == "round_robin":
            chosen = self._next_in_turn(fits)
        elif self.policy == "least_loaded":
            chosen = min(fits, key=lambda c: (c.num_requests, -c.headroom_blocks, c.instance_id))
        else:
            chosen = min(fits, key=lambda c: (c.predicted_load, -c.headroom_blocks, c.instance_id))
        return chosen

    def placed(self, instance_id: str) -> None:
        """Record that a batch went to instance_id (round-robin moves past it)."""
        self._last = instance_id

    def _next_in_turn(self, fits: list[DecodeCandidate]) -> DecodeCandidate:
        ordered = sorted(fits, key=lambda c: c.instance_id)
        if self._last is None:
            return ordered[0]
        after = [c for c in ordered if c.instance_id > self._last]
        return after[0] if after else ordered[0]
