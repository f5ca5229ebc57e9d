"""Step 6 (GPU only): two engine instances load at once on one GPU with
gpu_memory_utilization=0.45 each (what serving gives prefill + decode on the same GPU): both
pools must come out the same size whatever the load order, and memory must remain. Then one
prefill of max_num_batched_tokens tokens measures the activation peak against the estimate."""

from __future__ import annotations

import multiprocessing as mp

import torch
from bucketserve.bench.device import emit, on_gpu, skipped


def instance(rank: int, barrier, out) -> None:
    from bucketserve.engine.block_manager import BlockManager
    from bucketserve.engine.config import EngineConfig
    from bucketserve.engine.kv_pool import activation_bytes
    from bucketserve.engine.runner import ModelRunner
    from bucketserve.engine.sequence import Sequence

    cfg = EngineConfig(model="dummy:llama-3-8b", device="cuda:0", attention="triton",
                       gpu_memory_utilization=0.45, cuda_graphs=False,
                       max_model_len=8192, max_num_batched_tokens=16384)  # fmt: skip
    runner = ModelRunner(cfg)
    barrier.wait()  # both pools allocated
    free, total = torch.cuda.mem_get_info()
    row = {"rank": rank, "num_blocks": runner.num_blocks, "free_gib_after_both": free / 2**30}
    if rank == 0:
        bm = BlockManager(runner.num_blocks, runner.block_size)
        seqs = [Sequence([7] * 2048) for _ in range(8)]  # 16384 tokens: the prefill budget
        for s in seqs:
            bm.allocate_for(s)
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        runner.prefill(seqs)
        row["prefill_peak_gib"] = (torch.cuda.max_memory_allocated() - base) / 2**30
        row["estimate_gib"] = activation_bytes(runner.model_config, cfg, "triton") / 2**30
    barrier.wait()
    out.put(row)
    runner.close()


def main() -> None:
    if not on_gpu():
        emit(skipped("needs a GPU (two instances sharing one device)"))
        return
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=instance, args=(r, barrier, out)) for r in range(2)]
    for p in procs:
        p.start()
    rows = sorted((out.get(timeout=400) for _ in procs), key=lambda r: r["rank"])
    for p in procs:
        p.join(timeout=60)
    same = rows[0]["num_blocks"] == rows[1]["num_blocks"]
    fits = rows[0]["prefill_peak_gib"] <= rows[0]["estimate_gib"]
    emit({"status": "ok", "ok": same and fits, "same_split": same,
          "peak_within_estimate": fits, "instances": rows})  # fmt: skip


if __name__ == "__main__":
    main()
