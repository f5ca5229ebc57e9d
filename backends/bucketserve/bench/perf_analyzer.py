"""perf_analyzer recipe: streaming gRPC against the ensemble, concurrency mode, same prompts.

perf_analyzer ships in tritonclient[all]; it needs Debian's libb64-0d and libcudart.so.12
(pip nvidia-cuda-runtime-cu12) on the library path, which `pa_env()` adds
(docs/platform-notes.md#p6-perf-analyzer-libraries). Its profile export
(one entry per request with every response's timestamp) is turned into RequestRecords, so our
metrics code computes TTFT and throughput for both tools the same way.

    python perf/tools/perf_analyzer.py --url 127.0.0.1:8001 --concurrency 2 --requests 16 --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from bucketserve.bench.records import RequestRecord
from bucketserve.bench.workloads import BenchRequest


def cuda_runtime_lib() -> str | None:
    """The directory of libcudart.so.12 from the pip package nvidia-cuda-runtime-cu12."""
    try:
        import nvidia.cuda_runtime as cr
    except ImportError:
        return None
    lib = Path(list(cr.__path__)[0]) / "lib"
    return str(lib) if (lib / "libcudart.so.12").exists() else None


def pa_binary() -> str:
    path = Path(sys.executable).parent / "perf_analyzer"
    return str(path) if path.exists() else (shutil.which("perf_analyzer") or "perf_analyzer")


def pa_env() -> dict[str, str]:
    env = dict(os.environ)
    lib = cuda_runtime_lib()
    if lib:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (lib, env.get("LD_LIBRARY_PATH")) if p)
    return env


def input_data(reqs: list[BenchRequest], temperature: float = 0.0, seed: int = 0) -> dict:
    """perf_analyzer --input-data JSON: one entry per request, the tensors loadgen sends."""
    return {
        "data": [
            {
                "text_input": [r.prompt],
                "max_tokens": [r.output_tokens],
                "min_tokens": [r.output_tokens],
                "stream": [True],
                "temperature": [temperature],
                "seed": [seed + r.idx],
                "exclude_input_in_output": [True],
                "return_num_input_tokens": [True],
                "return_num_output_tokens": [True],
                "slo_class": [r.slo_class],
                "ttft_slo_ms": [r.ttft_slo_s * 1000.0],
                "tpot_slo_ms": [r.tpot_slo_s * 1000.0],
            }
            for r in reqs
        ]
    }


def command(
    url: str, model: str, data: Path, concurrency: int, requests: int, out: Path,
    headers: dict[str, str] | None = None,
) -> list[str]:  # fmt: skip
    """`headers`: gRPC metadata for every call (`-H key:value`), e.g. the API key."""
    return [
        pa_binary(),
        "-m",
        model,
        "-i",
        "grpc",
        "-u",
        url,
        "--streaming",
        "--input-data",
        str(data),
        "--concurrency-range",
        str(concurrency),
        "--request-count",
        str(requests),
        "--profile-export-file",
        str(out / "pa_profile.json"),
        "-f",
        str(out / "pa_summary.csv"),
        "--verbose-csv",
        *[arg for k, v in (headers or {}).items() for arg in ("-H", f"{k}:{v}")],
    ]


def run(
    url: str,
    model: str,
    reqs: list[BenchRequest],
    concurrency: int,
    requests: int,
    out: Path,
    timeout_s: float = 600.0,
    headers: dict[str, str] | None = None,
) -> list[RequestRecord]:
    """Run perf_analyzer once; its stdout goes to out/pa_stdout.txt; records from its export."""
    out.mkdir(parents=True, exist_ok=True)
    data = out / "pa_input.json"
    data.write_text(json.dumps(input_data(reqs)))
    cmd = command(url, model, data, concurrency, requests, out, headers)
    shown = [a.split(":", 1)[0] + ":***" if a.startswith("triton-grpc-protocol-") else a
             for a in cmd]  # fmt: skip  # keys are never written down
    (out / "pa_command.txt").write_text(" ".join(shown) + "\n")
    proc = subprocess.run(cmd, env=pa_env(), capture_output=True, text=True, timeout=timeout_s)
    (out / "pa_stdout.txt").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(
            f"perf_analyzer exited {proc.returncode}: {(proc.stdout + proc.stderr)[-2000:]}"
        )
    return parse_export(out / "pa_profile.json", reqs)


def _num_output_tokens(outputs: list[dict]) -> list[int | None]:
    counts = []
    for o in outputs:
        v = o.get("num_output_tokens") if isinstance(o, dict) else None
        counts.append(int(v[0] if isinstance(v, list) else v) if v not in (None, [], "") else None)
    return counts


def parse_export(path: Path, reqs: list[BenchRequest]) -> list[RequestRecord]:
    """RequestRecords from a profile export; request i used data entry i % len(reqs)."""
    export = json.loads(Path(path).read_text())
    items = [r for exp in export["experiments"] for r in exp["requests"]]
    t0 = min((r["timestamp"] for r in items), default=0)
    records = []
    for i, item in enumerate(sorted(items, key=lambda r: r["timestamp"])):
        req = reqs[i % len(reqs)]
        rec = RequestRecord(
            i,
            req.source,
            0.0,
            (item["timestamp"] - t0) / 1e9,
            req.input_tokens,
            req.output_tokens,
            req.ttft_slo_s,
            req.tpot_slo_s,
        )
        stamps = [(t - item["timestamp"]) / 1e9 for t in item.get("response_timestamps", [])]
        counts = _num_output_tokens(item.get("response_outputs", []))
        for k, t in enumerate(stamps):
            n = counts[k] if k < len(counts) else None
            if n is None and k < len(stamps) - 1:
                n = rec.output_tokens + 1  # no outputs exported: one token per response
            if n is not None:
                rec.add_chunk(t, n)
        if stamps:
            rec.finish(stamps[-1])
        else:
            rec.error = "no responses"
        records.append(rec)
    return records


def main() -> None:
    from bucketserve.bench.textsource import TextSource, load_tokenizer
    from bucketserve.bench.workloads import build_requests, workload

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="127.0.0.1:8001")
    p.add_argument("--model", default="bucketserve")
    p.add_argument("--workload", default="alpaca")
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("perf/results/tmp/pa"))
    a = p.parse_args()
    reqs = build_requests(
        workload(a.workload), a.requests, a.seed, TextSource.build(load_tokenizer())
    )
    records = run(a.url, a.model, reqs, a.concurrency, a.requests, a.out)
    from bucketserve.bench.metrics import summarize

    print(summarize("perf_analyzer", 0.0, records))


if __name__ == "__main__":
    main()
