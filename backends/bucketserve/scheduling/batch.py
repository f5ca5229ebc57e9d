"""PrefillBatch: what the scheduler hands to a prefill instance."""

from __future__ import annotations

from dataclasses import dataclass, field

from bucketserve.scheduling.request import RequestMeta


@dataclass(slots=True)
class PrefillBatch:
    """One prefill batch: requests (in execution order), source bucket and target instances.

    `num_tokens` is the packed prompt-token count; `padded_tokens` = N x longest prompt, what a
    padding backend computes; `padding_ratio` = 1 - num_tokens / padded_tokens (Eq. 2 over the
    batch). `decode_id` is where its KV must go; it equals `prefill_id` on an aggregated instance.
    """

    batch_id: int
    requests: list[RequestMeta]
    bucket: tuple[int, int]
    prefill_id: str
    decode_id: str
    created_s: float
    num_tokens: int = field(init=False)
    padded_tokens: int = field(init=False)
    padding_ratio: float = field(init=False)

    def __post_init__(self) -> None:
        if not self.requests:
            raise ValueError("requests must be non-empty")
        lengths = [r.prompt_len for r in self.requests]
        self.num_tokens = sum(lengths)
        self.padded_tokens = len(lengths) * max(lengths)
        self.padding_ratio = 1.0 - self.num_tokens / self.padded_tokens

    @property
    def size(self) -> int:
        return len(self.requests)

    @property
    def max_len(self) -> int:
        return max(r.prompt_len for r in self.requests)

    @property
    def request_ids(self) -> list[str]:
        return [r.request_id for r in self.requests]
