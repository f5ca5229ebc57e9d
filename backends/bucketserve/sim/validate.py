"""The simulator checked against the real CPU server: replay a smoke run's requests (their
send times, prompt and output lengths, SLOs) through the simulator with a latency model
fitted to the CPU engine (perf/engine/engine_bench.py JSON lines), and compare mean TTFT, mean
TPOT and SLO attainment with what the server measured.

    python -m bucketserve.sim.validate --server-run perf/results/<run> \
        --bench perf/results/engine_bench_cpu_fit_1thread.jsonl

Server deployment modelled: one prefill and one decode instance on CPU (the smoke default),
SmolLM2-135M fp32, 1 GiB KV pool each, 16-token blocks, every policy on P/D as the server
runs it.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from pathlib import Path

import numpy as np

from bucketserve.scheduling import POLICIES, RequestMeta
from bucketserve.sim.cluster import ClusterSpec
from bucketserve.sim.hardware import ModelSpec
from bucketserve.sim.latency import FittedLatency
from bucketserve.sim.metrics import meets_slo, tpot
from bucketserve.sim.simulator import Simulator
from bucketserve.sim.workload import SimRequest

# SmolLM2-135M in fp32: 30 layers, 3 KV heads of 64 -> 46,080 bytes of KV per token
SMOLLM2 = ModelSpec("SmolLM2-135M", 134.5e6, 30, 576, 9, 3, 64, 4, 8192)
POOL_BYTES = 2**30
BLOCK = 16


def server_requests(path: Path) -> list[SimRequest]:
    """The measured requests of one (policy, rate) file as simulator requests."""
    reqs = []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        prompt = int(row.get("server_input_tokens") or row["input_tokens"])
        out = int(row["max_tokens"])
        meta = RequestMeta(f"r{row['idx']}", prompt, out, float(row["t_send_s"]),
                           ttft_slo_s=float(row["ttft_slo_s"]), tpot_slo_s=float(row["tpot_slo_s"]),
                           task_type=row.get("source", ""))  # fmt: skip
        sim = SimRequest(meta, out)
        sim.extra["real"] = row
        reqs.append(sim)
    return reqs


def _real_ok(row: dict) -> bool:
    ttft, tp = row.get("ttft_s"), row.get("tpot_s")
    if ttft is None or tp is None or row.get("error"):
        return False
    return ttft <= row["ttft_slo_s"] and tp <= row["tpot_slo_s"]


def server_prefill_busy(run_dir: Path) -> dict[tuple[str, float], float]:
    """{(policy, rate): seconds of prefill batches the server's scheduler timed} from the run's
    summary.csv (runs made before the column existed give {})."""
    path = run_dir / "summary.csv"
    if not path.exists():
        return {}
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return {(r["label"], float(r["offered_rate"])): float(r["prefill_busy_s"])
            for r in rows if r.get("prefill_busy_s")}  # fmt: skip


def compare_one(path: Path, latency: FittedLatency, busy: dict | None = None) -> dict:
    """Simulated vs measured means for one (policy, rate) file."""
    policy, rate = path.stem.rsplit("_rate", 1)
    reqs = server_requests(path)
    blocks = POOL_BYTES // (BLOCK * SMOLLM2.kv_bytes_per_token)
    cluster = ClusterSpec(blocks, SMOLLM2.kv_bytes_per_token, BLOCK, 1, 1, 1, topology="pd")
    out = Simulator(policy, reqs, cluster, latency, max_model_len=SMOLLM2.max_len).run()
    real = [r.extra["real"] for r in reqs]
    done = [r for r in reqs if not math.isnan(r.finish_s)]
    row = {"policy": policy, "rate": float(rate), "requests": len(reqs)}
    row["real_ttft_s"] = _mean([x["ttft_s"] for x in real if x.get("ttft_s") is not None])
    row["sim_ttft_s"] = _mean([r.first_token_s - r.meta.arrival_s for r in done])
    row["real_tpot_s"] = _mean([x["tpot_s"] for x in real if x.get("tpot_s") is not None])
    row["sim_tpot_s"] = _mean([tpot(r) for r in done if r.output_len > 1])
    row["real_attainment"] = sum(_real_ok(x) for x in real) / len(real)
    row["sim_attainment"] = sum(meets_slo(r) for r in reqs) / len(reqs)
    for k in ("ttft", "tpot"):
        row[f"{k}_error"] = row[f"sim_{k}_s"] / row[f"real_{k}_s"] - 1.0
    # prefill time under serving load vs the isolated-engine model, for the same requests
    row["real_prefill_busy_s"] = (busy or {}).get((policy, float(rate)), math.nan)
    row["sim_prefill_busy_s"] = out.prefill_busy_s
    return row


def _mean(values: list[float]) -> float:
    return float(np.mean(values)) if values else math.nan


def compare_run(run_dir: Path, bench: Path, impl: str = "bucketserve") -> tuple[list[dict], str]:
    """Every (policy, rate) file of a smoke run; returns the rows and the fitted model."""
    latency = FittedLatency.from_jsonl(bench, SMOLLM2.kv_bytes_per_token, impl=impl)
    files = request_logs(run_dir)
    if not files:
        raise ValueError(f"no requests/*_rate*.jsonl under {run_dir}")
    busy = server_prefill_busy(run_dir)
    rows = [compare_one(f, latency, busy) for f in files]
    calibrate(rows)
    return rows, latency.describe()


def request_logs(run_dir: Path) -> list[Path]:
    """The run's per-(policy, rate) request logs (not committed: .gitignore); ablation labels
    are not policies."""
    return [f for f in sorted((run_dir / "requests").glob("*_rate*.jsonl"))
            if f.stem.rsplit("_rate", 1)[0] in POLICIES]  # fmt: skip


def has_request_logs(run_dir: Path) -> bool:
    """The run's per-request logs are here."""
    return bool(request_logs(run_dir))


def read_validation(path: Path) -> list[dict]:
    """validation.csv rows as compare_run returned them."""
    rows = []
    for row in csv.DictReader(path.open()):
        for k, v in row.items():
            if k not in ("policy", "in_sample"):
                row[k] = float(v) if v not in ("", "nan") else math.nan
        row["requests"] = int(row["requests"])
        row["in_sample"] = row["in_sample"] == "True"
        rows.append(row)
    return rows


def calibrate(rows: list[dict]) -> float:
    """One constant the engine benchmark cannot see: the per-request path outside the engine
    (tokenizer, Triton hops, scheduler, first response). Estimated as the TTFT gap at
    each policy's lowest rate, added to every simulated TTFT; the other rates are out of
    sample. The median over policies: one policy the model gets wrong at its lowest rate
    (static's whole-batch waits) must not set the path of all. Returns the constant (seconds)."""
    lowest: dict[str, dict] = {}
    for r in rows:
        if r["policy"] not in lowest or r["rate"] < lowest[r["policy"]]["rate"]:
            lowest[r["policy"]] = r
    c = float(np.median([r["real_ttft_s"] - r["sim_ttft_s"] for r in lowest.values()]))
    for r in rows:
        r["path_overhead_s"] = c
        r["sim_ttft_cal_s"] = r["sim_ttft_s"] + c
        r["ttft_cal_error"] = r["sim_ttft_cal_s"] / r["real_ttft_s"] - 1.0
        r["in_sample"] = r is lowest[r["policy"]]
    return c


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--server-run", type=Path, required=True)
    p.add_argument("--bench", type=Path, required=True)
    a = p.parse_args(argv)
    rows, desc = compare_run(a.server_run, a.bench)
    print(desc)
    for r in rows:
        print(f"{r['policy']:13s} {r['rate']:5.2f}  TTFT real {r['real_ttft_s']:.3f} sim {r['sim_ttft_s']:.3f} "
              f"({100 * r['ttft_error']:+.0f} %, +path {100 * r['ttft_cal_error']:+.0f} %)  TPOT real {r['real_tpot_s']:.4f} sim {r['sim_tpot_s']:.4f} "
              f"({100 * r['tpot_error']:+.0f} %)  attain real {r['real_attainment']:.2f} sim {r['sim_attainment']:.2f}  "
              f"prefill busy real {r['real_prefill_busy_s']:.1f} s sim {r['sim_prefill_busy_s']:.1f} s")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
