"""Run metrics: SLO attainment, throughput, served rate, goodput, scheduler cost."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from bucketserve.sim.outcome import SimOutcome
from bucketserve.sim.steady import detect
from bucketserve.sim.workload import SimRequest


def tpot(req: SimRequest) -> float:
    """Mean time per output token after the first (0 for single-token outputs)."""
    if req.output_len <= 1:
        return 0.0
    return (req.finish_s - req.first_token_s) / (req.output_len - 1)


def meets_slo(req: SimRequest) -> bool:
    """Both TTFT and TPOT within the request's SLOs (DistServe's attainment definition)."""
    if math.isnan(req.finish_s):
        return False
    ttft = req.first_token_s - req.meta.arrival_s
    return ttft <= req.meta.ttft_slo_s and tpot(req) <= req.meta.tpot_slo_s


def meets_tail_slo(req: SimRequest) -> bool:
    """TTFT within its SLO and the request's p90 time between tokens within the TPOT SLO
    (a per-token tail SLO: stalls count even when the mean hides them)."""
    return meets_slo(req) and req.tail_gap_ok(0.9)


@dataclass(slots=True)
class RunMetrics:
    """One row of the results table."""

    policy: str
    workload: str
    rate: float
    num_requests: int
    finished: int
    attainment: float
    long_attainment: float  # among LongBench-like ("summarization") requests; nan if none
    online_attainment: float  # among online requests; nan if none
    ttft_attainment: float
    tpot_attainment: float
    throughput_tok_s: float
    served_rate: float
    completion_rate: float
    mean_ttft_s: float
    p90_ttft_s: float
    mean_tpot_s: float
    p90_tpot_s: float
    preemptions: int
    batches: int
    mean_batch_size: float
    padding_ratio: float
    decisions: int
    mean_decision_us: float
    mean_batch_decision_us: float
    decision_share: float
    num_gpus: int
    max_buckets: int
    attainment_tail: float = math.nan  # TTFT and p90 per-request TBT (meets_tail_slo)
    slow_token_share: float = math.nan  # gaps between tokens longer than the TPOT SLO
    max_gap_s: float = math.nan  # longest stall between two tokens of any request
    growing: bool = False  # steady.detect failed it: the backlog grew, or the last third collapsed
    backlog_slope: float = 0.0
    final_backlog: int = 0
    late_attainment: float = math.nan  # requests arriving in the last third
    late_attainment_tail: float = math.nan
    seed: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


def _share(flags) -> float:
    flags = list(flags)
    return sum(flags) / len(flags) if flags else math.nan


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else math.nan


def served_rate(reqs: list[SimRequest], warmup: float = 0.2) -> float:
    """Completions per second while requests still arrive (after a warm-up share of that span).

    Equals the offered rate when the system keeps up and its capacity when it does not; it
    ignores the drain after the last arrival, which flatters overloaded finite runs.
    """
    first = min(r.meta.arrival_s for r in reqs)
    last = max(r.meta.arrival_s for r in reqs)
    start = first + warmup * (last - first)
    if last - start < 1e-9:
        return math.nan
    return sum(1 for r in reqs if start <= r.finish_s <= last) / (last - start)


def summarize(out: SimOutcome, workload: str, rate: float) -> RunMetrics:
    reqs = out.requests
    done = [r for r in reqs if not math.isnan(r.finish_s)]
    start = min(r.meta.arrival_s for r in reqs)
    end = max((r.finish_s for r in done), default=start)
    span = max(end - start, 1e-9)
    ttfts = [r.first_token_s - r.meta.arrival_s for r in done]
    tpots = [tpot(r) for r in done]
    n = len(reqs)
    sizes = [b.size for b in out.batches]
    pad = sum(b.padded_tokens - b.num_tokens for b in out.batches) / max(
        sum(b.padded_tokens for b in out.batches), 1
    )
    busy = out.prefill_busy_s + out.decode_busy_s
    m = RunMetrics(
        policy=out.policy, workload=workload, rate=rate, num_requests=n, finished=len(done),
        attainment=sum(meets_slo(r) for r in reqs) / n,
        long_attainment=_share(meets_slo(r) for r in reqs if r.meta.task_type == "summarization"),
        online_attainment=_share(meets_slo(r) for r in reqs if r.meta.is_online),
        ttft_attainment=sum(t <= r.meta.ttft_slo_s for t, r in zip(ttfts, done, strict=True)) / n,
        tpot_attainment=sum(t <= r.meta.tpot_slo_s for t, r in zip(tpots, done, strict=True)) / n,
        throughput_tok_s=sum(r.output_len for r in done) / span, served_rate=served_rate(reqs),
        completion_rate=len(done) / span,
        mean_ttft_s=float(np.mean(ttfts)) if ttfts else math.nan, p90_ttft_s=_pct(ttfts, 90),
        mean_tpot_s=float(np.mean(tpots)) if tpots else math.nan, p90_tpot_s=_pct(tpots, 90),
        preemptions=out.preemptions, batches=len(sizes), mean_batch_size=float(np.mean(sizes)) if sizes else 0.0,
        padding_ratio=pad, decisions=len(out.decision_s),
        mean_decision_us=1e6 * float(np.mean(out.decision_s)) if out.decision_s else 0.0,
        mean_batch_decision_us=1e6 * float(np.mean(out.batch_decision_s)) if out.batch_decision_s else 0.0,
        decision_share=sum(out.decision_s) / busy if busy else 0.0, num_gpus=out.num_gpus,
        max_buckets=out.max_buckets,
    )  # fmt: skip
    _add_tail_and_steady(m, reqs)
    return m


def _add_tail_and_steady(m: RunMetrics, reqs: list[SimRequest]) -> None:
    tail_ok = {id(r): meets_tail_slo(r) for r in reqs}
    m.attainment_tail = sum(tail_ok.values()) / len(reqs)
    gaps = sum(r.num_gaps for r in reqs)
    m.slow_token_share = sum(r.num_slow_gaps for r in reqs) / gaps if gaps else math.nan
    m.max_gap_s = max((r.max_gap_s for r in reqs), default=math.nan)
    st = detect(reqs, meets_slo)
    m.growing = not st.steady  # the backlog grew or the last third collapsed
    m.backlog_slope, m.final_backlog = st.slope_rps, st.final_backlog
    m.late_attainment = st.late_attainment
    m.late_attainment_tail = detect(reqs, lambda r: tail_ok[id(r)]).late_attainment


def effective_attainment(m: RunMetrics, tail: bool = False) -> float:
    """What goodput counts for a run: 0 when its backlog grew (it did not sustain the rate),
    else the worse of the whole run's attainment and that of its last third (steady.py)."""
    if m.growing:
        return 0.0
    att, late = (
        (m.attainment_tail, m.late_attainment_tail) if tail else (m.attainment, m.late_attainment)
    )
    return att if math.isnan(late) else min(att, late)


def goodput(rates: list[float], attainments: list[float], target: float) -> float:
    """Highest rate with attainment >= target, interpolating linearly where the curve crosses.

    Scans rates upward; returns 0 when even the lowest rate misses the target and the highest
    rate when none of them does. Pass effective_attainment values to discount overload.
    """
    pairs = sorted(zip(rates, attainments, strict=True))
    if not pairs or pairs[0][1] < target:
        return 0.0
    for (r0, a0), (r1, a1) in zip(pairs, pairs[1:], strict=False):
        if a1 < target:
            return r0 + (r1 - r0) * (a0 - target) / (a0 - a1)
    return pairs[-1][0]
