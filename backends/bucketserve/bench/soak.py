"""Soak and fault suite for `bucketserve serve` (loopback only, bounded in time and count).

  perf/reliability/soak.py --duration 600             mixed load at 2x measured capacity, 10 % cancellations
  perf/reliability/soak.py --faults --duration 600    the same, killing decode, prefill, scheduler, tritonserver
  perf/reliability/soak.py --cycles 10                start/SIGTERM cycles, then kill -9 of everything

Reports sent / finished / errored by cause / cancelled / hung / lost, KV blocks leaked and RSS
growth per process after warm-up (report.json + report.md in --out; one row per request in
requests.jsonl, kept out of git).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path

import httpx

from bucketserve.bench import aio, prom
from bucketserve.bench.runinfo import cpu_model, git_commit, machine_name
from bucketserve.bench.soak_client import CANCELLED, FINISHED, Outcome, Target, run_one
from bucketserve.bench.soak_cycles import run_cycles
from bucketserve.bench.soak_report import (
    in_flight_at_kills,
    in_flight_peaks,
    rss_by_process,
    rss_growth,
    second_half_growth,
    write_report,
)
from bucketserve.serving.launch.serve_process import ServeProcess, free_port

KV_RE = re.compile(r'^bucketserve_kv_blocks_(free|total)\{instance="(\w+)"\} (\S+)$', re.M)
WORDS = "the quick brown fox jumps over a lazy dog while seven bright stars shine".split()
FAULTS = ("decode_0_0", "prefill_0_0", "scheduler_0_0", "tritonserver")


def payload(rng: random.Random) -> dict:
    """Mixed: short and long prompts, short and long outputs."""
    words = rng.choice([8, 32, 300]) if rng.random() < 0.9 else 900
    max_tokens = rng.choice([8, 24, 64, 128])
    text = " ".join(rng.choice(WORDS) for _ in range(words))
    p = {"text_input": text, "max_tokens": max_tokens, "seed": rng.randrange(2**31)}
    if rng.random() < 0.5:
        p["min_tokens"] = max_tokens
    return p


async def capacity(target: Target, seconds: float, concurrency: int, seed: int) -> float:
    """Finished requests per second at a fixed concurrency, after warm-up.

    The window opens once `concurrency` requests have finished (a cold server's first requests
    are slow) and closes after `seconds` with at least `concurrency` finished inside it (at most
    5x longer), so a slow machine gives a low rate, never a zero from too short a window.
    """
    rng, done = random.Random(seed), []
    stop = asyncio.Event()
    async with httpx.AsyncClient(timeout=None) as client:

        async def worker() -> None:
            while not stop.is_set():
                done.append(await run_one(client, target, payload(rng), 300.0, 0.0))

        def finished_since(t: float) -> int:
            return sum(1 for o in done if o.kind == FINISHED and o.end_s >= t)

        workers = [asyncio.create_task(worker()) for _ in range(concurrency)]
        start = time.monotonic()
        while finished_since(start) < concurrency and time.monotonic() - start < 600:
            await asyncio.sleep(0.2)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 5 * seconds and (
            time.monotonic() - t0 < seconds or finished_since(t0) < concurrency
        ):
            await asyncio.sleep(0.2)
        t1, n = time.monotonic(), finished_since(t0)
        stop.set()
        await asyncio.gather(*workers)
    if n == 0:
        causes = Counter(f"{o.kind} {o.cause}".strip() for o in done)
        raise RuntimeError(f"no request finished while measuring capacity ({dict(causes)})")
    return n / (t1 - t0)


async def sample_rss(sp: ServeProcess, every_s: float, timeline: list) -> None:
    """(seconds since the load began, RSS per process) every `every_s`, until cancelled."""
    start = time.monotonic()
    while True:
        rss, private = await asyncio.gather(
            asyncio.to_thread(rss_by_process, sp), asyncio.to_thread(rss_by_process, sp, True)
        )
        timeline.append((round(time.monotonic() - start, 1), {"rss": rss, "private": private}))
        await asyncio.sleep(every_s)


async def load(
    sp: ServeProcess, target: Target, a, rate: float, warm_cb, fault_cb, timeline: list
) -> list[Outcome]:
    """Open-loop Poisson arrivals at `rate` for a.duration seconds; 10 % cancelled early."""
    rng, tasks = random.Random(a.seed), []
    start = time.monotonic()
    limits = httpx.Limits(max_connections=None)
    sampler = asyncio.create_task(sample_rss(sp, a.rss_every_s, timeline))
    async with httpx.AsyncClient(timeout=None, limits=limits) as client:
        fault_task = asyncio.create_task(fault_cb(tasks)) if fault_cb else None
        warm_done = False

        def more() -> bool:  # with --faults, the load goes on until the last part is back
            running = fault_task is not None and not fault_task.done()
            return (time.monotonic() - start < a.duration or running) and len(
                tasks
            ) < a.max_requests

        while more():
            cancel = rng.uniform(0.2, 5.0) if rng.random() < a.cancel_frac else 0.0
            tasks.append(asyncio.create_task(
                run_one(client, target, payload(rng), a.deadline_s, cancel)))  # fmt: skip
            await asyncio.sleep(rng.expovariate(rate))
            if not warm_done and time.monotonic() - start > a.warmup_frac * a.duration:
                warm_done = True
                warm_cb()
        if fault_task:
            await fault_task
        outs = list(await asyncio.gather(*tasks))
        sampler.cancel()
        return outs


def kv_blocks(sp: ServeProcess) -> dict[str, tuple[int, int]]:
    found: dict[str, dict[str, int]] = {}
    try:
        text = httpx.get(sp.metrics_url, timeout=10).text
    except httpx.HTTPError:  # Triton restarting after a fault: no reading this time
        return {}
    for kind, inst, value in KV_RE.findall(text):
        found.setdefault(inst, {})[kind] = int(float(value))
    return {k: (v.get("free", -1), v.get("total", -2)) for k, v in found.items()}


def counter_total(sp: ServeProcess, name: str) -> float | None:
    """The sum of a counter over its label sets (prom.total); None when Triton is unreadable."""
    try:
        return prom.total(prom.scrape(sp.metrics_url, timeout_s=10), name)
    except OSError:  # URLError and timeouts: Triton restarting after a fault
        return None


def leaked_blocks(sp: ServeProcess, wait_s: float) -> tuple[int, dict]:
    """Blocks still held wait_s after the load ended (the hand-off timeout reclaims pending ones)."""
    sp.wait_ready(timeout_s=900)  # a fault near the end: read the restarted server's pools
    end = time.monotonic() + wait_s
    while True:
        blocks = kv_blocks(sp)
        leaked = sum(total - free for free, total in blocks.values())
        if (blocks and leaked == 0) or time.monotonic() > end:
            return leaked, blocks
        time.sleep(1.0)


def make_fault_cb(sp: ServeProcess, a, faults_out: list):
    async def run_faults(tasks: list) -> None:
        from bucketserve.bench.soak_cycles import kill_part

        await asyncio.sleep(a.warmup_frac * a.duration)
        for part in FAULTS:
            faults_out.append(await asyncio.to_thread(kill_part, sp, part))
            await asyncio.sleep(20.0)  # load on the recovered server before the next kill

    return run_faults


def make_target(sp: ServeProcess, api: str, openai_port: int) -> Target:
    if api == "v2":
        return Target(f"http://{sp.http_url}")
    base = f"http://127.0.0.1:{openai_port}"
    for _ in range(600):  # the OpenAI front starts after Triton is ready
        try:
            model = httpx.get(f"{base}/v1/models", timeout=5).json()["data"][0]["id"]
            return Target(base, "openai", model)
        except (httpx.HTTPError, KeyError, ValueError):
            time.sleep(0.5)
    raise RuntimeError(f"the OpenAI front at {base} never answered /v1/models")


def soak(a) -> dict:
    run_dir = Path(tempfile.mkdtemp(prefix="soak-")) / "run"
    openai_port = free_port() if a.api == "openai" else 0
    sp = ServeProcess(run_dir, "--kv-cache-gb", str(a.kv_cache_gb), "--topology", a.topology,
                      "--max-queued-requests", str(a.max_queued), "--drain-timeout-s", "10",
                      "--max-concurrent-requests", str(a.max_concurrent),
                      "--openai-port", str(openai_port))  # fmt: skip
    sp.start()
    report: dict = {"args": vars(a), "machine": machine_name(), "cpu": cpu_model(),
                    "commit": git_commit(), "startup_s": sp.wait_ready()}  # fmt: skip
    try:
        target = make_target(sp, a.api, openai_port)
        cap = (
            0.0
            if a.rate
            else aio.run(capacity(target, a.capacity_s, a.capacity_concurrency, a.seed + 1))
        )
        rate = a.rate or a.rate_mult * cap
        report.update(capacity_rps=cap, rate_rps=rate)
        rss: dict = {}
        faults: list = []
        timeline: list = []
        fault_cb = make_fault_cb(sp, a, faults) if a.faults else None
        private: dict = {}
        warm_at: list[float] = []  # when the warm-up ended (none: the load was shorter)

        def warm_cb() -> None:
            rss.update(warm=rss_by_process(sp))
            warm_at.append(time.monotonic())
            private.update(warm=rss_by_process(sp, private=True))

        outs = aio.run(load(sp, target, a, rate, warm_cb, fault_cb, timeline))
        rss["end"], private["end"] = rss_by_process(sp), rss_by_process(sp, private=True)
        report["rss_growth_pct"] = rss_growth(rss)
        report["private_rss_growth_pct"] = rss_growth(private)
        report["rss_growth_second_half_pct"] = second_half_growth(timeline)
        report["private_rss_growth_second_half_pct"] = second_half_growth(timeline, "private")
        report["rss_timeline"] = timeline
        report.update(summarize(outs, a.deadline_s), rss=rss, faults=faults)
        report["requests"] = [asdict(o) for o in outs]  # one row per request, in send order
        spans = [(o.start_s, o.end_s) for o in outs]
        in_flight_at_kills(report, spans)
        report["max_in_flight"] = in_flight_peaks(spans, warm_at[0] if warm_at else float("inf"))
        report["kv_leaked_blocks"], report["kv_blocks"] = leaked_blocks(sp, 60.0)
        report["preemptions"] = counter_total(sp, "bucketserve_preemptions_total")
    finally:
        report["shutdown_s"] = sp.stop()
        time.sleep(1.5)
        report["left_processes"] = [p.pid for p in sp.processes()]
        report["left_shm"] = sorted(sp.shm_segments())
    return report


def summarize(outs: list[Outcome], deadline_s: float) -> dict:
    kinds = Counter(o.kind for o in outs)
    causes = Counter(o.cause for o in outs if o.kind == "errored")
    lost = Counter(o.cause for o in outs if o.kind == "lost")
    return {"sent": len(outs), "outcomes": dict(kinds), "errors_by_cause": dict(causes),
            "lost_by_cause": dict(lost),
            "cancelled_by_client": kinds[CANCELLED], "deadline_s": deadline_s}  # fmt: skip


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--duration", type=float, default=600.0, help="seconds of load (10 min)")
    p.add_argument("--faults", action="store_true", help="kill each part in turn under load")
    p.add_argument("--cycles", type=int, default=0, help="start/SIGTERM cycles instead of load")
    p.add_argument("--rate-mult", type=float, default=2.0, help="load = this x capacity")
    p.add_argument("--rate", type=float, default=0.0, help="requests/s; 0: rate-mult x capacity")
    p.add_argument("--cancel-frac", type=float, default=0.1)
    p.add_argument("--capacity-s", type=float, default=60.0)
    p.add_argument("--capacity-concurrency", type=int, default=8)
    p.add_argument("--warmup-frac", type=float, default=0.2, help="RSS baseline after this")
    p.add_argument("--rss-every-s", type=float, default=30.0, help="RSS sample interval")
    p.add_argument("--deadline-s", type=float, default=180.0, help="no FINAL by then: hung")
    p.add_argument("--max-requests", type=int, default=20000)
    p.add_argument("--max-queued", type=int, default=16, help="--max-queued-requests of the server")
    p.add_argument("--max-concurrent", type=int, default=32,
                   help="--max-concurrent-requests of the server (0: no cap)")  # fmt: skip
    p.add_argument("--kv-cache-gb", type=float, default=0.5)
    p.add_argument("--topology", default="disaggregated",
                   help="the server's --topology (the stored soak reports ran disaggregated; "
                   "--faults kills a prefill stub, which only disaggregated has)")  # fmt: skip
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--api", choices=("v2", "openai"), default="v2",
                   help="v2: generate_stream via the HTTP front; openai: /v1/completions (gRPC)")  # fmt: skip
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)
    if a.faults and a.topology != "disaggregated":
        p.error(f"--faults kills {', '.join(FAULTS)}: it needs --topology disaggregated")
    return a


def run(argv: list[str] | None = None) -> dict:
    """Parse, run, write the report (if --out); returns the report."""
    a = parse(argv)
    report = run_cycles(a.cycles) if a.cycles else soak(a)
    if a.out:
        write_report(report, a.out)
    return report


def main(argv: list[str] | None = None) -> int:
    print(json.dumps(run(argv), indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
