"""Run perf/tools/genai_perf.sh (genai-perf in perf/.genai-venv) on our prompts and read its CSV.

genai-perf 0.0.16 with `--backend vllm --endpoint-type kserve --streaming` sends our shape-[1]
tensors to `bucketserve`; with `--backend tensorrtllm` it sends TensorRT-LLM's shape-[1, 1]
tensors (to `tensorrt_llm_bls`). Output length goes as top-level max_tokens/min_tokens tensors
(--extra-inputs). It counts output tokens by re-tokenising the streamed text, so its token
counts can be a little lower than the server's. AIPerf writes the same two-table CSV.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
from pathlib import Path

from bucketserve.bench.paths import PERF, TOOLS
from bucketserve.bench.workloads import BenchRequest

SCRIPT = TOOLS / "genai_perf.sh"
VENV_BIN = PERF / ".genai-venv" / "bin" / "genai-perf"


def available() -> bool:
    return VENV_BIN.exists()


def read_csv(path: Path) -> dict[str, dict[str, float]]:
    """{metric: {statistic: value}} from both tables (the second one's statistic is "value")."""
    out: dict[str, dict[str, float]] = {}
    header: list[str] = []
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if not row:
                continue
            if row[0] == "Metric":
                header = [h.lower() for h in row]
                continue
            try:  # AIPerf leaves a statistic it does not have empty
                out[row[0]] = {
                    h: float(v.replace(",", ""))
                    for h, v in zip(header[1:], row[1:], strict=False)
                    if v.strip()
                }
            except ValueError:
                continue
    return out


UNITS = {"(ms)": 1e-3, "(ns)": 1e-9, "(us)": 1e-6, "(s)": 1.0, "(sec)": 1.0}


def metric(table: dict[str, dict[str, float]], name: str, stat: str) -> float | None:
    """One figure of a genai-perf or AIPerf CSV, latencies in seconds: `name` is the metric's
    name without its unit, any capitalisation ("Time to First Token", "Request Throughput")."""
    for key, stats in table.items():
        base, _, unit = key.partition(" (")
        if base.lower() != name.lower():
            continue
        value = stats.get(stat)
        return None if value is None else value * UNITS.get(f"({unit}", 1.0)
    return None


def write_prompts(reqs: list[BenchRequest], path: Path) -> int:
    """Our prompts as {"text": ...} JSON lines (both tools read them); the one output length."""
    lengths = {r.output_tokens for r in reqs}
    if len(lengths) != 1:
        raise ValueError("genai-perf and AIPerf take one output length for all requests")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"text": r.prompt}) + "\n" for r in reqs))
    return lengths.pop()


def tool_env(reqs: list[BenchRequest], concurrency: int, out: Path, **settings: str) -> dict:
    """The scripts' environment for exactly `reqs` (prompts in out/prompts.jsonl) + `settings`."""
    prompts = out / "prompts.jsonl"
    n_out = write_prompts(reqs, prompts)
    return dict(os.environ, CONCURRENCY=str(concurrency), REQUESTS=str(len(reqs)),
                OUTPUT_MEAN=str(n_out), INPUT_FILE=str(prompts), **settings)  # fmt: skip


def run_script(script: Path, url: str, out: Path, env: dict, timeout_s: float):
    """`script URL OUT` (genai_perf.sh, aiperf.sh) with `env`; its CompletedProcess (text)."""
    return subprocess.run([str(script), url, str(out)], env=env, capture_output=True, text=True,
                          timeout=timeout_s)  # fmt: skip


def checked_csv(tool: str, proc, found: list[Path], log: Path) -> Path:
    """The last CSV of `found`; a RuntimeError with the log's (or stderr's) tail if the run
    failed or wrote none."""
    if proc.returncode != 0 or not found:
        tail = log.read_text(errors="replace")[-1500:] if log.exists() else proc.stderr[-1500:]
        raise RuntimeError(f"{tool} exited {proc.returncode}: {tail}")
    return found[-1]


def run(
    url: str,
    reqs: list[BenchRequest],
    concurrency: int,
    out: Path,
    timeout_s: float = 600.0,
    backend: str = "vllm",
    model: str = "bucketserve",
    headers: dict[str, str] | None = None,
) -> dict[str, dict[str, float]]:
    """genai-perf on exactly `reqs` (same prompts, one output length); returns its CSV.
    `headers`: gRPC metadata for every call (e.g. `triton-grpc-protocol-api-key` of a server
    started with --api-key), passed in the environment, never on a command line."""
    env = tool_env(reqs, concurrency, out, BACKEND=backend, MODEL=model,
                   PA_HEADERS=" ".join(f"{k}:{v}" for k, v in (headers or {}).items()))  # fmt: skip
    proc = run_script(SCRIPT, url, out, env, timeout_s)
    trace = proc.stderr  # the script's `set -x` trace, keys left out
    for value in (headers or {}).values():
        trace = trace.replace(value, "***")
    (out / "genai_perf_command.txt").write_text(trace)
    found = sorted(out.glob("*/profile_export_genai_perf.csv"))
    return read_csv(checked_csv("genai-perf", proc, found, out / "genai_perf_stdout.txt"))
