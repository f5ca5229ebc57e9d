"""perf_analyzer (from tritonclient[all]) drives a streaming load against the ensemble."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.server


def cuda_runtime_dir() -> str:
    import nvidia.cuda_runtime as cr  # pip nvidia-cuda-runtime-cu12: perf_analyzer links libcudart.so.12

    return os.path.join(list(cr.__path__)[0], "lib")


def test_perf_analyzer_streaming_reports_throughput(server, tmp_path):
    data = {
        "data": [
            {
                "text_input": [f"Write one sentence about topic {i}."],
                "max_tokens": [12],
                "min_tokens": [12],
                "stream": [True],
                "temperature": [0.0],
            }
            for i in range(4)
        ]
    }
    (tmp_path / "input.json").write_text(json.dumps(data))
    binary = Path(sys.executable).parent / "perf_analyzer"
    env = {**os.environ, "LD_LIBRARY_PATH": cuda_runtime_dir()}
    proc = subprocess.run(
        [
            str(binary),
            "-m",
            "bucketserve",
            "-i",
            "grpc",
            "-u",
            server.grpc_url,
            "--streaming",
            "--concurrency-range",
            "2",
            "--input-data",
            str(tmp_path / "input.json"),
            "--request-count",
            "8",
            # no key: perf_analyzer reads the ensemble's steps' configs and every model's
            # statistics, read-only calls the gRPC edge serves for every model
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    m = re.search(
        r"Concurrency: 2, throughput: ([\d.]+) infer/sec, latency (\d+) usec", proc.stdout
    )
    assert m, proc.stdout[-2000:]
    assert float(m.group(1)) > 0 and int(m.group(2)) > 0
    assert "Successful request count: 8" in proc.stdout
