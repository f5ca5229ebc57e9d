"""Step 4: where a decode step's time goes: wall time, host time (until the step is enqueued),
GPU time (CUDA events), kernels per step (profiler), eager vs CUDA graph, at batch 1/64 and
context 128/2048 on dummy:llama-3-8b bf16, against a floor from a measured copy bandwidth
(weights + KV read once per step). On CPU: dummy:smollm2-135m float32, the dynamic SDPA step
vs the static paged step, batch 1/8, context 128 (no graphs, no kernel count)."""

from __future__ import annotations

import gc
import time

import torch
from bucketserve.bench.device import device, emit, median_s, on_gpu, sync

BLOCK = 16


def copy_bandwidth() -> float:
    """Bytes/s of a large device copy (read + write), the floor's denominator."""
    n = (1 << 30) if on_gpu() else (1 << 26)
    x = torch.empty(n, dtype=torch.uint8, device=device())
    y = torch.empty_like(x)
    return 2 * n / median_s(lambda: y.copy_(x), 10)


def make_seqs(runner, batch: int, context: int):
    from bucketserve.engine.block_manager import BlockManager
    from bucketserve.engine.sequence import Sequence

    bm = BlockManager(runner.num_blocks, runner.block_size)
    seqs = [Sequence([5] * context) for _ in range(batch)]
    for s in seqs:
        bm.allocate_for(s)
    return seqs  # KV contents do not matter for timing


def kernels_per_step(runner, seqs) -> int | None:
    if not on_gpu():
        return None
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        runner.decode_logits(seqs)
        sync()
    return sum(1 for e in prof.events() if e.device_type.name == "CUDA")


def measure(runner, batch: int, context: int, bandwidth: float, label: str) -> dict:
    seqs = make_seqs(runner, batch, context)
    wall = median_s(lambda: runner.decode(seqs), 10 if on_gpu() else 3)
    hosts, gpus = [], []
    for _ in range(5):
        sync()
        start = time.perf_counter()
        if on_gpu():
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
        runner.decode_logits(seqs)
        hosts.append(time.perf_counter() - start)
        if on_gpu():
            end.record()
            end.synchronize()
            gpus.append(begin.elapsed_time(end) / 1e3)
    weights = sum(p.numel() * p.element_size() for p in runner.model.parameters())
    kv = batch * context * runner.model_config.kv_bytes_per_token
    floor = (weights + kv) / bandwidth
    return {
        "path": label, "batch": batch, "context": context, "wall_ms": round(wall * 1e3, 3),
        "host_ms": round(sorted(hosts)[2] * 1e3, 3),
        "gpu_ms": round(sorted(gpus)[2] * 1e3, 3) if gpus else None,
        "kernels": kernels_per_step(runner, seqs), "floor_ms": round(floor * 1e3, 3),
        "wall_over_floor": round(wall / floor, 2),
    }  # fmt: skip


def runner_for(attention: str, graphs: bool, static: bool = True):
    from bucketserve.engine.config import EngineConfig
    from bucketserve.engine.runner import ModelRunner

    gpu = on_gpu()
    return ModelRunner(EngineConfig(
        model="dummy:llama-3-8b" if gpu else "dummy:smollm2-135m", device=device(),
        dtype="bfloat16" if gpu else "float32", attention=attention, cuda_graphs=graphs,
        static_decode=static, num_blocks=(64 * 2048 if gpu else 8 * 256) // BLOCK + 64,
        block_size=BLOCK, max_model_len=4096 if gpu else 1024, max_num_seqs=64,
        num_threads=None if gpu else 1,
    ))  # fmt: skip


def main() -> None:
    bandwidth = copy_bandwidth()
    if on_gpu():
        paths = [("sdpa", "sdpa", False, True), ("triton-eager", "triton", False, True),
                 ("triton-graph", "triton", True, True)]  # fmt: skip
        shapes = [(b, c) for b in (1, 64) for c in (128, 2048)]
    else:
        paths = [("sdpa-dynamic", "sdpa", False, False), ("cpu_paged-static", "cpu_paged",
                                                          False, True)]  # fmt: skip
        shapes = [(1, 128), (8, 128)]
    rows = []
    for label, attention, graphs, static in paths:
        try:
            runner = runner_for(attention, graphs, static)
            if graphs and not runner.uses_cuda_graphs:
                raise RuntimeError("cuda_graphs requested but the runner does not use them")
            for b, c in shapes:
                rows.append(measure(runner, b, c, bandwidth, label))
                emit(rows[-1])  # one line per shape: a timeout keeps the finished
            runner.close()
            del runner
        except Exception as e:  # one failing path must not hide the others
            rows.append({"path": label, "ok": False, "error": f"{type(e).__name__}: {e}"[:500]})
            emit(rows[-1])
        gc.collect()
        if on_gpu():
            torch.cuda.empty_cache()
    emit({"status": "ok", "copy_gb_per_s": round(bandwidth / 1e9, 1), "steps": len(rows),
          "skipped": None if on_gpu() else "graphs, kernel counts, 8B shapes (need a GPU)"})  # fmt: skip


if __name__ == "__main__":
    main()
