"""Run perf/tools/aiperf.sh (AIPerf in perf/.aiperf-venv) on our prompts through the OpenAI front.

AIPerf speaks only OpenAI: it streams `/v1/completions` (the prompt text as is, no chat
template, like our load generator's `text_input`) with max_tokens and min_tokens set to the one
output length, and writes the same two-table CSV as genai-perf (read with genai_perf.read_csv).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from bucketserve.bench.genai_perf import read_csv, write_prompts
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
    prompts = out / "prompts.jsonl"
    n_out = write_prompts(reqs, prompts)
    env = dict(os.environ, CONCURRENCY=str(concurrency), REQUESTS=str(len(reqs)),
               OUTPUT_MEAN=str(n_out), INPUT_FILE=str(prompts), ENDPOINT="completions",
               MODEL=model)  # fmt: skip
    proc = subprocess.run([str(SCRIPT), openai_url, str(out)], env=env, capture_output=True,
                          text=True, timeout=timeout_s)  # fmt: skip
    (out / "aiperf_command.txt").write_text(proc.stderr)  # the script's `set -x` trace
    found = sorted(out.glob(f"concurrency{concurrency}/profile_export_aiperf.csv"))
    if proc.returncode != 0 or not found:
        log = out / f"concurrency{concurrency}" / "aiperf_stdout.txt"
        tail = log.read_text(errors="replace")[-1500:] if log.exists() else proc.stderr[-1500:]
        raise RuntimeError(f"aiperf exited {proc.returncode}: {tail}")
    return read_csv(found[-1])
