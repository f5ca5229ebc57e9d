"""The CPU decode step with its streamed weights in one buffer (engine/weight_arena.py, the
default) against the same model with its weights where the loader left them (the layout before
it: the baseline runner is built with the arena and the copying switched off), two runners in
one process, interleaved rounds, per dtype and batch size: median step time of each, their
ratio with its spread over the rounds, the read bandwidth, and each layout's resident memory
(RSS of a fresh process that built one runner and nothing else).

    .venv/bin/python perf/engine/weight_arena_bench.py --dtypes bfloat16,float32 --batch-sizes 1,4
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from unittest import mock

import torch
from bucketserve.bench.floor import read_bandwidth
from bucketserve.engine import fusion
from bucketserve.engine.config import EngineConfig
from bucketserve.engine.runner import ModelRunner
from decode_path_bench import steps  # this folder: the same decode steps


def rss_mb() -> float:
    with open("/proc/self/smaps_rollup") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Rss:")) / 1024


def build(args, dtype: str, arena: bool) -> ModelRunner:
    config = EngineConfig(model=args.model, device="cpu", dtype=dtype, seed=0,
                          num_blocks=args.max_batch * (-(-(args.prompt_len + args.steps + 4) // 16)) + 8,
                          max_num_seqs=args.max_batch)  # fmt: skip
    if arena:
        runner = ModelRunner(config)
    else:
        with mock.patch.object(fusion, "place_streamed_weights", lambda model, streams: None), \
             mock.patch.object(fusion, "own_tensors", lambda model, arena=None: 0):  # fmt: skip
            runner = ModelRunner(config)
    return runner


def fresh_rss_mb(args, dtype: str, arena: bool) -> float:
    """RSS (MB) of a new process that built one runner of this layout."""
    cmd = [sys.executable, __file__, "--rss-of", f"{dtype},{int(arena)}", "--model", args.model,
           "--batch-sizes", args.batch_sizes]  # fmt: skip
    return float(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.split()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--dtypes", default="bfloat16,float32")
    p.add_argument("--batch-sizes", default="1,4")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=8, help="interleaved rounds")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: default)")
    p.add_argument("--rss-of", default="", help=argparse.SUPPRESS)  # "dtype,0|1": fresh_rss_mb
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    batches = [int(b) for b in args.batch_sizes.split(",")]
    args.max_batch = max(batches)
    if args.rss_of:
        dtype, arena = args.rss_of.split(",")
        build(args, dtype, arena=arena == "1")
        print(round(rss_mb()))
        return 0
    for dtype in args.dtypes.split(","):
        rss = {
            name: round(fresh_rss_mb(args, dtype, name == "arena")) for name in ("loaded", "arena")
        }
        loaded, arena = build(args, dtype, arena=False), build(args, dtype, arena=True)
        for batch in batches:
            med = {"loaded": [], "arena": []}
            for _ in range(args.rounds):
                for name, runner in (("loaded", loaded), ("arena", arena)):
                    times, _ = steps(runner, type(runner.model), batch, args)  # the model as is
                    med[name].append(statistics.median(times))
            ratios = [a / b for a, b in zip(med["arena"], med["loaded"], strict=True)]
            print(json.dumps({
                "dtype": dtype, "batch": batch, "threads": torch.get_num_threads(),
                "loaded_step_ms": round(1e3 * statistics.median(med["loaded"]), 2),
                "arena_step_ms": round(1e3 * statistics.median(med["arena"]), 2),
                "arena_over_loaded": round(statistics.median(ratios), 3),
                "ratio_range": [round(min(ratios), 3), round(max(ratios), 3)],
                "read_bandwidth_gb_s": round(read_bandwidth() / 1e9, 1),
                "rss_mb": rss,
            }), flush=True)  # fmt: skip
        loaded.close()
        arena.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
