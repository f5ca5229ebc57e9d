"""The decode worker's per-request state and the text deltas it hands to the sender thread."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from bucketserve.serving.core.detok import TextStream
from bucketserve.serving.core.messages import Handoff


@dataclass(slots=True)
class Delta:
    """Text produced for one request since the last delta; `finish_reason` set on the last."""

    key: int
    text: str
    num_output_tokens: int
    finish_reason: str = ""
    error: str = ""
    first_token_s: float = 0.0  # wall time of the first token (set on the first delta)
    admitted_s: float = 0.0  # wall time the KV was pulled
    busy: bool = False  # the error is about capacity (server busy), not the request
    logprobs: list[dict] = field(default_factory=list)  # per token, when the request asked
    num_cached_tokens: int = 0  # prompt tokens served from a prefix cache (set on the last)
    handoff: Handoff | None = None  # finish_reason MIGRATED: where the request continues


@dataclass(slots=True, eq=False)
class Stream:
    """Decode-side state of one request: its engine Sequence (the Scheduler's), its text
    stream, and whether its KV still waits in a prefill pool (`kv_pending`: not yet copied
    and acknowledged)."""

    key: int
    handoff: Handoff
    seq: object = None
    text: TextStream | None = None
    queued_s: float = field(default_factory=time.monotonic)
    kv_pending: bool = False
    first_sent: bool = False
    first_token_s: float = 0.0  # wall time of its first token (a moved decode's slack)
    done: bool = False
    logprobs: list[dict] = field(default_factory=list)  # not yet handed to the sender

    def take_logprobs(self) -> list[dict]:
        out, self.logprobs = self.logprobs, []
        return out
