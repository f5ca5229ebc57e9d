"""Bounded admission: beyond a fixed number of queued requests, answer "server busy" at once.

Without a bound every request that arrives is held (its prompt ids, its Triton request, a
sender) until prefill gets to it: 100,000 of them exhaust memory long before they are served.
Rejecting early is also what a load balancer wants: a fast 503 it can retry elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass

BUSY_PREFIX = "server busy"  # the front maps errors carrying this to HTTP 503 (front/app.py)
BYTES_PER_TOKEN = 48  # a queued prompt id: a Python int in a list, plus its numpy copies
BYTES_PER_REQUEST = 64 * 1024  # Triton request, response sender, params, text
MEMORY_SHARE = 0.05  # of the memory available at start, for the queue
MIN_LIMIT, MAX_LIMIT = 64, 16384


def default_queue_limit(available_bytes: int, max_model_len: int) -> int:
    """How many worst-case (full-context) requests fit in MEMORY_SHARE of available memory."""
    per_request = BYTES_PER_REQUEST + max_model_len * BYTES_PER_TOKEN
    fits = int(available_bytes * MEMORY_SHARE) // per_request
    return max(MIN_LIMIT, min(MAX_LIMIT, fits))


@dataclass(slots=True)
class AdmissionGate:
    """Counts what it turns away; the caller owns the queue and passes its length."""

    limit: int
    rejected: int = 0

    def __post_init__(self) -> None:
        if self.limit < 1:
            raise ValueError(f"max_queued_requests must be >= 1, got {self.limit}")

    def admit(self, queued: int) -> bool:
        """May one more request join a queue that holds `queued` now?"""
        if queued < self.limit:
            return True
        self.rejected += 1
        return False

    def busy_message(self) -> str:
        return (
            f"{BUSY_PREFIX}: {self.limit} requests are already waiting"
            f" (max_queued_requests={self.limit}); retry later"
        )


def max_prompt_bytes(max_token_bytes: int, max_model_len: int) -> int:
    """Longest prompt (UTF-8 bytes) that could still fit the context, whatever its text.

    A token covers at most `max_token_bytes` bytes, so a longer prompt has more than
    `max_model_len` tokens for sure: refuse it before tokenizing (5 MB took 10-30 s of a
    preprocessing instance's CPU, and 50 MB got it OOM-killed at 11 GB). Triton caps no gRPC
    message size: docs/platform-notes.md#p28-no-grpc-message-size-cap
    """
    return max_token_bytes * max_model_len


def check_prompt_bytes(text: str, limit: int) -> None:
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > limit:
        raise ValueError(
            f"text_input is {size} bytes; no prompt over {limit} bytes fits the model's context"
        )
