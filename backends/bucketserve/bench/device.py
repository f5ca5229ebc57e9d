"""Shared by the perf/device/*.py checks that perf/device/device_check.sh runs: where results go,
whether a GPU is here, and timing helpers. Each check prints one JSON object (its result)."""

from __future__ import annotations

import json
import sys
import time

import torch


def on_gpu() -> bool:
    """A CUDA device is usable (the checks run their full GPU form)."""
    return torch.cuda.is_available()


def device() -> str:
    return "cuda:0" if on_gpu() else "cpu"


def sync() -> None:
    if on_gpu():
        torch.cuda.synchronize()


def median_s(fn, iters: int, warmup: int = 2) -> float:
    """Median wall seconds of fn() (synchronised), after untimed warm-up calls."""
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def emit(result: dict) -> None:
    """The check's result: one JSON object on stdout (the shell script stores it)."""
    json.dump(result, sys.stdout, default=str)
    sys.stdout.write("\n")
    sys.stdout.flush()


def skipped(reason: str) -> dict:
    return {"status": "skipped", "reason": reason}
