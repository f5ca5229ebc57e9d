"""Run perf/genai_perf.sh (genai-perf in perf/.genai-venv) on our prompts and read its CSV.

genai-perf 0.0.16 with `--backend vllm --endpoint-type kserve --streaming` sends our shape-[1]
tensors; output length goes as top-level max_tokens/min_tokens tensors (--extra-inputs).
It counts output tokens by re-tokenising the streamed text, so its token counts can be a
little lower than the server's.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
from pathlib import Path

from workloads import BenchRequest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "perf" / "genai_perf.sh"
VENV_BIN = ROOT / "perf" / ".genai-venv" / "bin" / "genai-perf"


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
            try:
                out[row[0]] = {
                    h: float(v.replace(",", "")) for h, v in zip(header[1:], row[1:], strict=False)
                }
            except ValueError:
                continue
    return out


def run(
    url: str, reqs: list[BenchRequest], concurrency: int, out: Path, timeout_s: float = 600.0
) -> dict[str, dict[str, float]]:
    """genai-perf on exactly `reqs` (same prompts, one output length); returns its CSV."""
    lengths = {r.output_tokens for r in reqs}
    if len(lengths) != 1:
        raise ValueError("genai-perf takes one output length for all requests")
    out.mkdir(parents=True, exist_ok=True)
    prompts = out / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"text": r.prompt}) + "\n" for r in reqs))
    env = dict(os.environ, CONCURRENCY=str(concurrency), REQUESTS=str(len(reqs)),
               OUTPUT_MEAN=str(lengths.pop()), INPUT_FILE=str(prompts))  # fmt: skip
    proc = subprocess.run([str(SCRIPT), url, str(out)], env=env, capture_output=True,
                          text=True, timeout=timeout_s)  # fmt: skip
    (out / "genai_perf_command.txt").write_text(proc.stderr)  # the script's `set -x` trace
    found = sorted(out.glob("*/profile_export_genai_perf.csv"))
    if proc.returncode != 0 or not found:
        log = out / "genai_perf_stdout.txt"
        tail = log.read_text(errors="replace")[-1500:] if log.exists() else proc.stderr[-1500:]
        raise RuntimeError(f"genai-perf exited {proc.returncode}: {tail}")
    return read_csv(found[-1])
