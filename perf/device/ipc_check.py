"""Step 3: the KV hand-off between two real processes, as serving does it: the producer
exports its pool (CUDA IPC on GPU, POSIX shm on CPU) and fills a prompt's blocks; a spawned
consumer opens the pool from a non-main thread, copies the blocks into its own pool with
copy_blocks, and returns a SHA-256 of the copied bytes, compared with the producer's."""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import threading
import time

import torch
from bucketserve.bench.device import device, emit, on_gpu

BLOCK = 16


def shape_for(num_blocks: int) -> tuple[int, ...]:
    if on_gpu():  # Llama-3-8B: 32 layers, 8 KV heads of 128, 128 KiB per token in bf16
        return (32, 2, num_blocks, BLOCK, 8, 128)
    return (4, 2, num_blocks, BLOCK, 2, 64)


def digest(pool: torch.Tensor, ids: list[int]) -> str:
    data = pool[:, :, ids].contiguous().cpu().view(torch.uint8).numpy().tobytes()
    return hashlib.sha256(data).hexdigest()


def consumer(handle_json: str, jobs: list[list[int]], out) -> None:
    """Open the peer pool and pull each job from a worker thread (the decode loop's place)."""
    from bucketserve.kv.transport import (
        PoolHandle,
        allocate_pool,
        copy_blocks,
        open_pool,
        release_pool,
    )  # fmt: skip

    results = []

    def work() -> None:
        # CUDA context first: docs/platform-notes.md#p7-cuda-context-before-ipc-open
        torch.empty(1, device=device())
        handle = PoolHandle.from_json(handle_json)
        src = open_pool(handle)
        shape = list(handle.shape)
        shape[2] = max(len(j) for j in jobs) + 1
        dst, dst_handle = allocate_pool(shape, handle.dtype, device(), handle.name + "c")
        for ids in jobs:
            dst_ids = list(range(len(ids)))
            copy_blocks(src, ids, dst, dst_ids)  # warm-up: first touch, allocator
            start = time.perf_counter()
            copy_blocks(src, ids, dst, dst_ids)
            results.append((time.perf_counter() - start, digest(dst, dst_ids)))
        release_pool(dst_handle)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    out.put(results)


def main() -> None:
    from bucketserve.kv.transport import allocate_pool, release_pool

    token_counts = [2048, 8192] if on_gpu() else [512, 2048]
    needed = [-(-n // BLOCK) for n in token_counts]
    dtype = torch.bfloat16 if on_gpu() else torch.float32
    pool, handle = allocate_pool(shape_for(sum(needed) + 8), dtype, device(), "bs_devchk_ipc")
    gen = torch.Generator().manual_seed(0)
    ids_all = torch.randperm(sum(needed) + 8, generator=gen).tolist()  # scattered blocks
    jobs, start = [], 0
    for n in needed:
        jobs.append(ids_all[start : start + n])
        start += n
    pool.copy_(torch.randn(pool.shape, generator=gen).to(dtype))
    if on_gpu():
        torch.cuda.synchronize()
    expected = [digest(pool, ids) for ids in jobs]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=consumer, args=(handle.to_json(), jobs, out))
    proc.start()
    results = out.get(timeout=240)
    proc.join(timeout=30)
    release_pool(handle)
    rows = []
    for tokens, ids, (secs, got), want in zip(token_counts, jobs, results, expected, strict=True):
        nbytes = pool[:, :, ids].numel() * pool.element_size()
        rows.append({"tokens": tokens, "bytes_equal": got == want, "copy_ms": round(secs * 1e3, 2),
                     "gb_per_s": round(nbytes / secs / 1e9, 3)})  # fmt: skip
    emit({"status": "ok", "kind": handle.kind, "ok": all(r["bytes_equal"] for r in rows),
          "pulls": rows})  # fmt: skip


if __name__ == "__main__":
    main()
