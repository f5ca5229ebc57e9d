"""Our load generator, perf_analyzer, genai-perf (both backends) and AIPerf at the same fixed load.

Closed loop at concurrency C, the same N prompts (real text, one input and one output length
so the other tools can send them too) in the same order, one tool after the other on the same
server: loadgen, perf_analyzer, genai-perf with the vLLM-backend tensors (`bucketserve`),
genai-perf with TensorRT-LLM's (`tensorrt_llm_bls`), AIPerf through the OpenAI front
(`/v1/completions`), loadgen again (A-B-...-A, so drift of the host shows up as the difference
between the two loadgen runs). Ours and perf_analyzer's runs are summarised by
metrics.summarize from per-request timestamps (perf_analyzer's profile export); genai-perf and
AIPerf by their own CSVs. Each tool's client CPU time is measured (getrusage).
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass, field
from pathlib import Path

from bucketserve.bench import aio, aiperf_run, genai_perf, perf_analyzer
from bucketserve.bench.loadgen import LoadConfig, run_closed_loop
from bucketserve.bench.metrics import RunSummary, summarize
from bucketserve.bench.records import write_jsonl
from bucketserve.bench.textsource import TextSource
from bucketserve.bench.workloads import BenchRequest, requests_from_lengths, source

TOLERANCE = 0.10  # differences above 10 % in throughput or mean TTFT are explained in the report
INPUT_TOKENS = 84  # Alpaca's mean prompt
OUTPUT_TOKENS = 16
# the tools that report through their own CSV: name -> (artifact folder, how it reaches us)
EXTERNAL = {
    "genai-perf vllm": ("genai-perf", "gRPC, [1] tensors, `bucketserve`"),
    "genai-perf trtllm": ("genai-perf-trtllm", "gRPC, [1, 1] tensors, `tensorrt_llm_bls`"),
    "aiperf": ("aiperf", "OpenAI `/v1/completions` SSE"),
}


@dataclass(slots=True)
class FixedLoadResult:
    concurrency: int
    requests: int
    ours: RunSummary
    ours_again: RunSummary | None = None
    pa: RunSummary | None = None
    pa_error: str = ""
    pa_reported: dict | None = None  # perf_analyzer's own summary line (its CSV)
    ext: dict[str, dict] = field(default_factory=dict)  # tool -> its CSV {metric: {stat: value}}
    ext_errors: dict[str, str] = field(default_factory=dict)
    samples: dict[str, list[float]] = field(default_factory=dict)  # "ours_ttft", "pa_e2e", ...
    cpu_s: dict[str, float] = field(default_factory=dict)  # client CPU seconds per tool
    load: dict[str, float] = field(default_factory=dict)  # host 1-min load average at its start


def fixed_requests(text: TextSource, n: int, seed: int) -> list[BenchRequest]:
    """n prompts of INPUT_TOKENS real-text tokens, OUTPUT_TOKENS each, Alpaca's SLOs."""
    slo = source("alpaca", "cpu")
    lengths = [(INPUT_TOKENS, OUTPUT_TOKENS)] * n
    return requests_from_lengths(lengths, seed, text, slo, name="fixed")


def read_pa_csv(path: Path) -> dict | None:
    """perf_analyzer's -f CSV: its own throughput and latency figures (latency in µs)."""
    if not path.exists():
        return None
    lines = path.read_text().strip().splitlines()
    if len(lines) < 2:
        return None
    return dict(zip(lines[0].split(","), lines[1].split(","), strict=False))


def _ok(records, name: str) -> list[float]:
    return [getattr(r, name) for r in records if r.ok]


def _run_pa(srv, reqs, res: FixedLoadResult, out: Path, timeout_s: float) -> None:
    try:
        recs = perf_analyzer.run(srv.grpc_url, "bucketserve", reqs, res.concurrency, len(reqs),
                                 out / "perf_analyzer", timeout_s=timeout_s)  # fmt: skip
    except Exception as e:  # reported; the rest of the benchmark still stands
        res.pa_error = str(e)[-1500:]
        return
    write_jsonl(recs, out / "requests" / f"fixed_perf_analyzer_c{res.concurrency}.jsonl")
    res.pa = summarize("perf_analyzer", 0.0, recs)
    res.pa_reported = read_pa_csv(out / "perf_analyzer" / "pa_summary.csv")
    res.samples.update(pa_ttft=_ok(recs, "ttft_s"), pa_e2e=_ok(recs, "e2e_s"))


def _run_external(srv, reqs, res: FixedLoadResult, out: Path, timeout_s: float, tool: str) -> None:
    folder = out / EXTERNAL[tool][0]
    module = aiperf_run if tool == "aiperf" else genai_perf
    if not module.available():
        res.ext_errors[tool] = "not installed (`make bench-tools` creates its venv)"
        return
    try:
        if tool == "aiperf":
            res.ext[tool] = aiperf_run.run(srv.openai_url, reqs, res.concurrency, folder,
                                           timeout_s, model=srv.cfg.model)  # fmt: skip
        else:
            backend, model = (
                ("vllm", "bucketserve")
                if tool.endswith("vllm")
                else ("tensorrtllm", "tensorrt_llm_bls")
            )
            res.ext[tool] = genai_perf.run(srv.grpc_url, reqs, res.concurrency, folder, timeout_s,
                                           backend=backend, model=model)  # fmt: skip
    except Exception as e:
        res.ext_errors[tool] = str(e)[-1500:]
        return
    for export in sorted(folder.glob("*/profile_export.json"))[-1:]:
        recs = perf_analyzer.parse_export(export, reqs)  # the perf_analyzer run genai-perf drove
        res.samples.update({f"{tool}_ttft": _ok(recs, "ttft_s"), f"{tool}_e2e": _ok(recs, "e2e_s")})


def _cpu_s(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def _run_ours(srv, reqs, concurrency: int, out: Path, name: str, timeout_s: float):
    cfg = LoadConfig(url=srv.grpc_url, duration_s=3600.0, max_requests=len(reqs), drain_s=timeout_s)
    cpu = _cpu_s(resource.RUSAGE_SELF)
    records = aio.run(run_closed_loop(reqs, concurrency, cfg))
    cpu = _cpu_s(resource.RUSAGE_SELF) - cpu
    write_jsonl(records, out / "requests" / f"fixed_{name}_c{concurrency}.jsonl")
    return summarize(name, 0.0, records), records, cpu


def _timed_child(fn, *args) -> float:
    """CPU seconds of the subprocesses `fn` waited for (perf_analyzer, genai-perf)."""
    cpu = _cpu_s(resource.RUSAGE_CHILDREN)
    fn(*args)
    return _cpu_s(resource.RUSAGE_CHILDREN) - cpu


def run_fixed_load(srv, text: TextSource, concurrency: int, requests: int, out: Path,
                   seed: int = 0, timeout_s: float = 300.0) -> FixedLoadResult:  # fmt: skip
    """loadgen, perf_analyzer, genai-perf x2, AIPerf, loadgen again: `requests` at `concurrency`."""
    reqs = fixed_requests(text, requests, seed)
    load = {"loadgen": os.getloadavg()[0]}
    ours, records, cpu = _run_ours(srv, reqs, concurrency, out, "loadgen", timeout_s)
    res = FixedLoadResult(concurrency, requests, ours, load=load)
    res.samples.update(ours_ttft=_ok(records, "ttft_s"), ours_e2e=_ok(records, "e2e_s"))
    res.cpu_s["loadgen"] = cpu
    res.load["perf_analyzer"] = os.getloadavg()[0]
    res.cpu_s["perf_analyzer"] = _timed_child(_run_pa, srv, reqs, res, out, timeout_s)
    for tool in EXTERNAL:
        res.load[tool] = os.getloadavg()[0]
        res.cpu_s[tool] = _timed_child(_run_external, srv, reqs, res, out, timeout_s, tool)
    res.load["loadgen again"] = os.getloadavg()[0]
    again, records, cpu = _run_ours(srv, reqs, concurrency, out, "loadgen_again", timeout_s)
    res.ours_again, res.cpu_s["loadgen again"] = again, cpu
    res.samples.update(again_ttft=_ok(records, "ttft_s"), again_e2e=_ok(records, "e2e_s"))
    pa = f"{res.pa.served_rate:.3f} req/s" if res.pa else f"failed: {res.pa_error[:200]}"
    ext = "; ".join(f"{t} " + ("ran" if t in res.ext else f"failed: {res.ext_errors.get(t, '')[:200]}")
                    for t in EXTERNAL)  # fmt: skip
    print(f"[fixed load] c={concurrency}: loadgen {ours.served_rate:.3f} then "
          f"{again.served_rate:.3f} req/s; perf_analyzer {pa}; {ext}", flush=True)  # fmt: skip
    return res
