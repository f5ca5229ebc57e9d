"""Scrape the server's Prometheus endpoint and turn before/after snapshots into per-run deltas."""

from __future__ import annotations

import re
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

SAMPLE_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
LABEL_RE = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse(text: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """{metric name: {sorted label pairs: value}} from the text exposition format."""
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SAMPLE_RE.match(line)
        if not m:
            continue
        labels = tuple(sorted(LABEL_RE.findall(m.group(2) or "")))
        try:
            out.setdefault(m.group(1), {})[labels] = float(m.group(3))
        except ValueError:
            continue
    return out


def scrape(url: str, timeout_s: float = 5.0) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        return parse(resp.read().decode("utf-8", errors="replace"))


def total(snapshot: dict, name: str) -> float:
    """The sum of every series of `name` (0 when the metric is absent)."""
    return float(sum(snapshot.get(name, {}).values()))


@dataclass(slots=True)
class ServerDelta:
    """What the server itself measured between two scrapes (counters and histogram sums)."""

    requests: float
    e2e_sum_s: float
    decision_s: float
    decisions: float
    prefill_batches: float
    prefill_batch_size_sum: float
    prefill_batch_s_sum: float
    generation_tokens: float
    role_changes: float = 0.0  # hybrid
    migrations: float = 0.0  # hybrid

    @property
    def sched_s_per_request(self) -> float | None:
        return self.decision_s / self.requests if self.requests else None

    @property
    def sched_share(self) -> float | None:
        """Scheduler decision time as a share of the requests' execution (end-to-end) time."""
        return self.decision_s / self.e2e_sum_s if self.e2e_sum_s > 0 else None

    @property
    def mean_prefill_batch(self) -> float | None:
        return self.prefill_batch_size_sum / self.prefill_batches if self.prefill_batches else None


def delta(before: dict, after: dict) -> ServerDelta:
    def d(name: str) -> float:
        return total(after, name) - total(before, name)

    return ServerDelta(
        requests=d("bucketserve_e2e_request_latency_seconds_count"),
        e2e_sum_s=d("bucketserve_e2e_request_latency_seconds_sum"),
        decision_s=d("bucketserve_scheduler_decision_seconds_total"),
        decisions=d("bucketserve_scheduler_decisions_total"),
        prefill_batches=d("bucketserve_prefill_batch_size_count"),
        prefill_batch_size_sum=d("bucketserve_prefill_batch_size_sum"),
        prefill_batch_s_sum=d("bucketserve_prefill_batch_seconds_sum"),
        generation_tokens=d("bucketserve_generation_tokens_total"),
        role_changes=d("bucketserve_role_changes_total"),
        migrations=d("bucketserve_migrations_out_total"),
    )


def is_idle(snapshot: dict) -> bool:
    """No request queued for prefill and every KV block of every instance free."""
    free = snapshot.get("bucketserve_kv_blocks_free", {})
    blocks = snapshot.get("bucketserve_kv_blocks_total", {})
    queued = total(snapshot, "bucketserve_queue_length_total")
    return bool(blocks) and queued == 0 and all(free.get(k) == v for k, v in blocks.items())


def wait_idle(url: str, timeout_s: float, poll_s: float = 0.5) -> float | None:
    """Seconds until two consecutive idle scrapes, or None if not idle within timeout_s."""
    start = time.perf_counter()
    streak = 0
    while time.perf_counter() - start < timeout_s:
        try:
            streak = streak + 1 if is_idle(scrape(url)) else 0
        except (urllib.error.URLError, OSError):
            streak = 0
        if streak >= 2:
            return time.perf_counter() - start
        time.sleep(poll_s)
    return None
