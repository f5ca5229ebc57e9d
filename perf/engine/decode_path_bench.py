"""The CPU decode step with its decoder layers in one C++ call (`CpuCausalLM`,
torch.ops.bucketserve.decode_layers) against the same runner's Python layers, interleaved
rounds in one process (same weights, same pool, same sequences), per dtype and batch size:
median step time of each and their ratio, and whether their logits are bit-identical.

    .venv/bin/python perf/engine/decode_path_bench.py --batch-sizes 1,16 --rounds 4
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
from bucketserve.engine.block_manager import BlockManager
from bucketserve.engine.config import EngineConfig
from bucketserve.engine.fusion import CpuCausalLM
from bucketserve.engine.model import CausalLM
from bucketserve.engine.runner import ModelRunner
from bucketserve.engine.sequence import Sequence


def steps(runner: ModelRunner, cls: type, batch: int, args) -> tuple[list[float], torch.Tensor]:
    """Step times (s) of `args.steps` decode steps after a prefill of `args.prompt_len` tokens
    per sequence, with the model as `cls`; and the logits of the first step."""
    runner.model.__class__ = cls
    bm = BlockManager(runner.num_blocks, runner.block_size)
    seqs = [Sequence(list(range(100 + i, 100 + i + args.prompt_len))) for i in range(batch)]
    for seq in seqs:
        bm.allocate_for(seq)
    runner.prefill_logits(seqs)
    times, first = [], None
    for step in range(args.steps + 2):
        for seq in seqs:
            seq.append_token(7 + step)  # fixed tokens: both paths decode the same inputs
            bm.ensure_slot(seq)
        start = time.perf_counter()
        logits = runner.decode_logits(seqs)
        if step >= 2:  # two warm-up steps
            times.append(time.perf_counter() - start)
        first = logits if first is None else first
    for seq in seqs:
        bm.release(seq)
    return times, first


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--dtypes", default="bfloat16,float32")
    p.add_argument("--batch-sizes", default="1,16")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=4, help="interleaved C++ / Python rounds")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: default)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    batches = [int(b) for b in args.batch_sizes.split(",")]
    for dtype in args.dtypes.split(","):
        blocks = max(batches) * (-(-(args.prompt_len + args.steps + 4) // 16)) + 8
        runner = ModelRunner(EngineConfig(model=args.model, device="cpu", dtype=dtype, seed=0,
                                          num_blocks=blocks, max_num_seqs=max(batches)))  # fmt: skip
        if type(runner.model) is not CpuCausalLM:
            print(json.dumps({"dtype": dtype, "skipped": "decode_layers unavailable"}))
            continue
        for batch in batches:
            times = {CpuCausalLM: [], CausalLM: []}
            logits = {}
            for _ in range(args.rounds):
                for cls in (CpuCausalLM, CausalLM):
                    t, logits[cls] = steps(runner, cls, batch, args)
                    times[cls] += t
            cpp, py = (1e3 * statistics.median(times[c]) for c in (CpuCausalLM, CausalLM))
            print(json.dumps({
                "dtype": dtype, "batch": batch, "threads": torch.get_num_threads(),
                "cpp_layers_step_ms": round(cpp, 2), "python_layers_step_ms": round(py, 2),
                "python_over_cpp": round(py / cpp, 2),
                "bit_identical": torch.equal(logits[CpuCausalLM], logits[CausalLM]),
            }), flush=True)  # fmt: skip
        runner.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
