"""One measured request (what the load generator writes, one JSON line each) and its I/O."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path


@dataclass(slots=True)
class RequestRecord:
    """Client-side timings of one streamed request. Times in seconds.

    `t_send_s` is from the start of the run; `ttft_s`, `e2e_s` and `chunk_s` are from the send.
    A response may carry several tokens when the server coalesces; `itl_s` spreads each gap
    evenly over the tokens it delivered, so len(itl_s) == output_tokens - 1 on success.
    """

    idx: int
    source: str
    offered_rate: float
    t_send_s: float
    input_tokens: int
    max_tokens: int
    ttft_slo_s: float
    tpot_slo_s: float
    server_input_tokens: int = 0
    output_tokens: int = 0
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    chunk_s: list[float] = field(default_factory=list)
    finish_reason: str = ""
    error: str = ""
    request_id: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and self.e2e_s is not None and self.output_tokens > 0

    @property
    def t_done_s(self) -> float | None:
        return None if self.e2e_s is None else self.t_send_s + self.e2e_s

    def meets_slo(self, scale: float = 1.0) -> bool:
        """TTFT and TPOT both within `scale` x their SLOs (a single-token answer has no TPOT)."""
        if not self.ok or self.ttft_s is None:
            return False
        tpot_ok = self.tpot_s is None or self.tpot_s <= self.tpot_slo_s * scale
        return self.ttft_s <= self.ttft_slo_s * scale and tpot_ok

    def add_chunk(self, t_s: float, cumulative_tokens: int) -> None:
        """A response arrived `t_s` after the send carrying tokens up to `cumulative_tokens`."""
        new = cumulative_tokens - self.output_tokens
        if new <= 0:
            return
        if self.ttft_s is None:
            self.ttft_s = t_s
            new -= 1  # the first token closes TTFT; the rest of this chunk arrived with it
            self.itl_s.extend([0.0] * new)
        else:
            gap = t_s - self.chunk_s[-1]
            self.itl_s.extend([gap / new] * new)
        self.chunk_s.append(t_s)
        self.output_tokens = cumulative_tokens

    def finish(self, t_s: float) -> None:
        self.e2e_s = t_s
        if self.ttft_s is not None and self.output_tokens > 1:
            self.tpot_s = (self.chunk_s[-1] - self.ttft_s) / (self.output_tokens - 1)


def write_jsonl(records: list[RequestRecord], path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(asdict(r)) + "\n")


def read_jsonl(path: str | Path) -> list[RequestRecord]:
    names = {f.name for f in fields(RequestRecord)}
    out = []
    with open(path) as f:
        for line in f:
            if line.strip():
                obj = json.loads(line)
                out.append(RequestRecord(**{k: v for k, v in obj.items() if k in names}))
    return out
