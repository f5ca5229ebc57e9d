"""Run perf/tools/aiperf.sh (AIPerf in perf/.aiperf-venv) on our prompts through the OpenAI front.

AIPerf speaks only OpenAI: it streams `/v1/completions` (the prompt text as is, no chat
template, like our load generator's `text_input`) with max_tokens and min_tokens set to the one
output length, and writes the same two-table CSV as genai-perf (read with genai_perf.read_csv).
"""

from __future__ import annotations

from pathlib import Path

from bucketserve.bench.genai_perf import checked_csv, read_csv, run_script, tool_env
from bucketserve.bench.paths import PERF, TOOLS
from bucketserve.bench.workloads import BenchRequest

SCRIPT = TOOLS / "aiperf.sh"
VENV_BIN = PERF / ".aiperf-venv" / "bin" / "aiperf"


def available() -> bool:
    return VENV_BIN.exists()


def run(
    openai_url: str,
    reqs: list[BenchRequest],
    concurrency: int,
    out: Path,
    timeout_s: float = 600.0,
    model: str = "smollm2",
) -> dict[str, dict[str, float]]:
    """AIPerf on exactly `reqs` against `openai_url` (http://host:port); returns its CSV."""
    env = tool_env(reqs, concurrency, out, ENDPOINT="completions", MODEL=model)
    proc = run_script(SCRIPT, openai_url, out, env, timeout_s)
    (out / "aiperf_command.txt").write_text(proc.stderr)  # the script's `set -x` trace
    return read_csv(aiperf_csv(proc, out, concurrency))


def aiperf_csv(proc, out: Path, concurrency: int) -> Path:
    """The CSV aiperf.sh wrote for `concurrency` under `out`; RuntimeError if it failed."""
    found = sorted(out.glob(f"concurrency{concurrency}/profile_export_aiperf.csv"))
    return checked_csv(
        "aiperf", proc, found, out / f"concurrency{concurrency}" / "aiperf_stdout.txt"
    )
