"""Run one server configuration (a policy or an ablation) over a sweep of request rates."""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bucketserve.bench import aio, prom
from bucketserve.bench.loadgen import LoadConfig, run_open_loop, warm_up
from bucketserve.bench.metrics import RunSummary, summarize
from bucketserve.bench.records import RequestRecord, write_jsonl
from bucketserve.bench.workloads import BenchRequest
from bucketserve.serving.front.local import LocalEdge
from bucketserve.serving.launch.ports import free_port

IDLE_TIMEOUT_S = 60.0  # after each rate: wait for the server to drain before the next one
WARMUP_TIMEOUT_S = 90.0


@dataclass(slots=True)
class SweepPlan:
    """What every configuration is measured on: the same requests and send-time shape."""

    rates: tuple[float, ...]
    duration_s: float
    drain_s: float
    max_requests: int
    warmup_requests: int = 2
    kv_cache_gb: float = 0.5
    temperature: float = 0.0
    seed: int = 0


@dataclass(slots=True)
class Target:
    """A server configuration to measure: a label, its policy and ServeConfig overrides."""

    label: str
    policy: str
    overrides: dict = field(default_factory=dict)


@dataclass(slots=True)
class SweepResult:
    target: Target
    summaries: list[RunSummary]
    records: dict[float, list[RequestRecord]]
    start_s: float
    extra: object = None  # what the `after` hook of run_sweep returned
    error: str = ""  # why the sweep stopped early (server start, warm-up), "" when complete


def server_for(target: Target, plan: SweepPlan, run_root: Path):
    """A TritonServer on free ports for `target` (started by the caller's `with`)."""
    from bucketserve.serving.config import ServeConfig
    from bucketserve.serving.launch.launcher import TritonServer

    cfg = ServeConfig(
        policy=target.policy,
        http_port=free_port(),
        grpc_port=free_port(),
        metrics_port=free_port(),
        openai_port=free_port(),
        run_dir=str(run_root / target.label.replace("+", "plus")),
        kv_cache_gb=plan.kv_cache_gb,
        **target.overrides,
    )
    return TritonServer(cfg)


def measure_rate(
    srv, reqs: list[BenchRequest], send_times: np.ndarray, rate: float, plan: SweepPlan, label: str
) -> tuple[RunSummary, list[RequestRecord]]:
    """One open-loop run at `rate` with a metrics scrape before and after."""
    cfg = LoadConfig(
        url=srv.grpc_url,
        duration_s=plan.duration_s,
        drain_s=plan.drain_s,
        max_requests=plan.max_requests,
        temperature=plan.temperature,
        seed=plan.seed,
        # every rate resends the same prompts to this server: a fresh salt keeps the previous
        # rate's cached prefixes from serving this one (sharing within the run stays)
        cache_salt=f"sweep-{secrets.token_hex(6)}",
    )
    before = prom.scrape(srv.metrics_url)
    load_before = os.getloadavg()[0]
    records = aio.run(run_open_loop(reqs, send_times / rate, rate, cfg))
    server = prom.delta(before, prom.scrape(srv.metrics_url))
    s = summarize(label, rate, records, window_s=plan.duration_s)
    s.sched_ms_per_request = (
        None if server.sched_s_per_request is None else server.sched_s_per_request * 1e3
    )
    s.sched_share = server.sched_share
    s.mean_prefill_batch = server.mean_prefill_batch
    s.prefill_batches, s.prefill_busy_s = server.prefill_batches, server.prefill_batch_s_sum
    s.load_avg = (load_before + os.getloadavg()[0]) / 2
    s.role_changes, s.migrations = server.role_changes, server.migrations
    s.idle_wait_s = prom.wait_idle(srv.metrics_url, IDLE_TIMEOUT_S)
    return s, records


def warm_up_requests(reqs: list[BenchRequest], n: int) -> list[BenchRequest]:
    """The n cheapest requests: warm-up touches every code path without a long prefill."""
    return sorted(reqs, key=lambda r: (r.input_tokens + 8 * r.output_tokens, r.idx))[:n]


def run_sweep(
    target: Target,
    reqs: list[BenchRequest],
    unit_times: np.ndarray,
    plan: SweepPlan,
    out: Path,
    after: Callable[[object], object] | None = None,
    auto_rates: Callable[[str, str], tuple[float, ...]] | None = None,
) -> SweepResult:
    """Start the server, warm up untimed, measure each rate, run `after(server)`, stop.

    Rates are plan.rates, or when that is empty auto_rates(grpc_url, label).

    A failure (server start, warm-up, a run) ends this target's sweep and is recorded in
    `error`; the comparison goes on with the next target.
    """
    t_start = time.perf_counter()
    result = SweepResult(target, [], {}, 0.0)
    try:
        with server_for(target, plan, out / "run") as raw:
            srv = LocalEdge(raw)  # the HTTP edge (v2 and OpenAI routes) as users reach it
            try:
                result.start_s = time.perf_counter() - t_start
                print(f"[{target.label}] server ready in {result.start_s:.0f} s", flush=True)
                warm = warm_up_requests(reqs, plan.warmup_requests)
                warm_up(warm, LoadConfig(url=srv.grpc_url, drain_s=WARMUP_TIMEOUT_S), n=len(warm))
                rates = plan.rates or auto_rates(srv.grpc_url, target.label)
                _measure_rates(srv, result, reqs, unit_times, rates, plan, out)
                if after is not None:
                    result.extra = after(srv)
            finally:
                srv.web.stop()
    except Exception as e:
        result.error = f"{type(e).__name__}: {str(e)[-600:]}"
        print(f"[{target.label}] FAILED: {result.error}", flush=True)
    return result


def _measure_rates(srv, result: SweepResult, reqs, unit_times, rates, plan, out: Path) -> None:
    label = result.target.label
    for rate in rates:
        s, records = measure_rate(srv, reqs, unit_times, rate, plan, label)
        write_jsonl(records, out / "requests" / f"{label}_rate{rate:g}.jsonl")
        result.summaries.append(s)
        result.records[rate] = records
        print(
            f"[{label}] rate {rate:g}/s: sent {s.sent}, ok {s.ok}, attain "
            f"{_fmt(s.attainment)}, served {s.served_rate:.2f}/s, TTFT p50 "
            f"{_fmt(s.ttft_p50)} s, TPOT p50 {_fmt(s.tpot_p50)} s, idle after "
            f"{_fmt(s.idle_wait_s)} s",
            flush=True,
        )


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"
