"""Our load generator and perf_analyzer at the same fixed load (closed loop, concurrency C).

Both send the same request list in the same order (perf_analyzer cycles its --input-data
entries) to the same server, one after the other, with the same request count; both are
summarised by metrics.summarize from per-request timestamps.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

import perf_analyzer
from loadgen import LoadConfig, run_closed_loop
from metrics import RunSummary, summarize
from records import write_jsonl
from workloads import BenchRequest

TOLERANCE = 0.10  # differences above 10 % in throughput or mean TTFT are explained in the report


@dataclass(slots=True)
class FixedLoadResult:
    concurrency: int
    requests: int
    ours: RunSummary
    pa: RunSummary | None
    pa_error: str = ""
    pa_reported: dict | None = None  # perf_analyzer's own summary line (its CSV)
    ours_ttft: list[float] = field(default_factory=list)
    pa_ttft: list[float] = field(default_factory=list)
    ours_e2e: list[float] = field(default_factory=list)
    pa_e2e: list[float] = field(default_factory=list)

    def differences(self) -> dict[str, float]:
        """Relative difference (pa - ours) / ours of throughput and mean TTFT."""
        if self.pa is None:
            return {}
        out = {}
        for name in ("served_rate", "output_tok_s", "ttft_mean", "e2e_p50"):
            a, b = getattr(self.ours, name), getattr(self.pa, name)
            if a and b is not None:
                out[name] = (b - a) / a
        return out


def read_pa_csv(path: Path) -> dict | None:
    """perf_analyzer's -f CSV: its own throughput and latency figures (latency in µs)."""
    if not path.exists():
        return None
    lines = path.read_text().strip().splitlines()
    if len(lines) < 2:
        return None
    return dict(zip(lines[0].split(","), lines[1].split(","), strict=False))


def run_fixed_load(
    srv,
    reqs: list[BenchRequest],
    concurrency: int,
    requests: int,
    out: Path,
    drain_s: float = 300.0,
) -> FixedLoadResult:
    """Loadgen first, then perf_analyzer, each `requests` requests at `concurrency`."""
    reqs = reqs[:requests]
    cfg = LoadConfig(url=srv.grpc_url, duration_s=3600.0, max_requests=requests, drain_s=drain_s)
    records = asyncio.run(run_closed_loop(reqs, concurrency, cfg))
    write_jsonl(records, out / "requests" / f"fixed_loadgen_c{concurrency}.jsonl")
    ours = summarize("loadgen", 0.0, records)
    print(
        f"[fixed load] loadgen c={concurrency}: {ours.served_rate:.3f} req/s, "
        f"TTFT mean {ours.ttft_mean}",
        flush=True,
    )
    try:
        pa_records = perf_analyzer.run(
            srv.grpc_url,
            "bucketserve",
            reqs,
            concurrency,
            requests,
            out / "perf_analyzer",
            timeout_s=drain_s + 300,
        )
    except Exception as e:  # reported, the rest of the benchmark still stands
        print(f"[fixed load] perf_analyzer failed: {e}", flush=True)
        return FixedLoadResult(
            concurrency,
            requests,
            ours,
            None,
            str(e)[-1500:],
            ours_ttft=_ok(records, "ttft_s"),
            ours_e2e=_ok(records, "e2e_s"),
        )
    write_jsonl(pa_records, out / "requests" / f"fixed_perf_analyzer_c{concurrency}.jsonl")
    pa = summarize("perf_analyzer", 0.0, pa_records)
    print(
        f"[fixed load] perf_analyzer c={concurrency}: {pa.served_rate:.3f} req/s, "
        f"TTFT mean {pa.ttft_mean}",
        flush=True,
    )
    return FixedLoadResult(
        concurrency,
        requests,
        ours,
        pa,
        pa_reported=read_pa_csv(out / "perf_analyzer" / "pa_summary.csv"),
        ours_ttft=_ok(records, "ttft_s"),
        pa_ttft=_ok(pa_records, "ttft_s"),
        ours_e2e=_ok(records, "e2e_s"),
        pa_e2e=_ok(pa_records, "e2e_s"),
    )


def _ok(records, name: str) -> list[float]:
    return [getattr(r, name) for r in records if r.ok]
