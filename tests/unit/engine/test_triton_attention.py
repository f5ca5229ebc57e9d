"""Triton kernels (paged decode, fused element-wise), interpreted on CPU (TRITON_INTERPRET=1),
against SDPA and the torch references."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from bucketserve.engine.attention import resolve_backend_name
from bucketserve.engine.config import EngineConfig
from bucketserve.engine.runner import ModelRunner

ROOT = Path(__file__).resolve().parents[3]


def test_interpreted_kernel_matches_sdpa():
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run(
        [sys.executable, "-m", "tests.unit.engine.triton_checks"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(result["kernel"]) == 4 and max(result["kernel"]) < 1e-5, result
    assert len(result["elementwise"]) == 3, result
    assert max(result["elementwise"].values()) < 1e-5, result
    assert result["runner"]["err"] < 1e-5, result
    # attention='triton': fused element-wise kernels and the static decode step took part
    assert result["runner"]["paths"][0] == ["triton", True], result
    # chunked prefill fused with Triton-kernel decodes: same greedy tokens as whole prompts
    assert result["chunked"]["equal"] and result["chunked"]["mixed_steps"][0] > 0, result


def test_triton_needs_cuda_or_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="attention='triton' needs a CUDA device"):
        resolve_backend_name("triton", torch.device("cpu"))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert resolve_backend_name("triton", torch.device("cpu")) == "triton"
    with pytest.raises(ValueError, match="block_size must be a power of two >= 16"):
        ModelRunner(EngineConfig(model="dummy:tiny", attention="triton", block_size=24))
