"""The linears of one decode step on CPU, by what runs them: oneDNN's packed GEMM (in the dtype
the engine packs: `fusion.gemm_dtype`) against `small_linear` (csrc/small_linear.cpp) where it
runs that dtype and row count, and a plain sum of the same weight bytes (the read rate the
streaming loops aim at). The weight set is one decoder stack of a named shape (fused qkv, o,
fused gate/up, down per layer; random weights), timed adjacent in one process, median of
`--repeats`, `--rounds` rounds. One JSON object per line, then a table on stderr.

    .venv/bin/python perf/engine/linear_bench.py --dtypes float32,bfloat16 --rows 1,4,8,16
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
from bucketserve.engine import cpu_ops
from bucketserve.engine.fusion import OneDnnLinear
from bucketserve.engine.shape_table import DUMMY_SHAPES
from bucketserve.engine.weight_arena import arena_like


def layer_shapes(shape: str) -> list[tuple[int, int]]:
    """(out, in) of every linear in one decoder stack of `shape`, layer by layer."""
    c = DUMMY_SHAPES[shape]
    d, f = c["hidden_size"], c["intermediate_size"]
    head_dim = c.get("head_dim", d // c["num_attention_heads"])
    q, kv = c["num_attention_heads"] * head_dim, c["num_key_value_heads"] * head_dim
    return [(q + 2 * kv, d), (d, q), (2 * f, d), (d, f)] * c["num_hidden_layers"]


def timed(fn, repeats: int) -> float:
    """Median seconds of `repeats` calls of fn."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="smollm2-135m", help="a dummy shape (engine/shape_table.py)")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--rows", default="1,4,8,16", help="comma-separated row counts")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: default)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if not cpu_ops.load():
        sys.exit(f"the C++ kernels did not build: {cpu_ops.unavailable_reason()}")
    shapes = layer_shapes(args.shape)
    rows_list = [int(r) for r in args.rows.split(",")]
    g = torch.Generator().manual_seed(0)
    results = {}
    for name in args.dtypes.split(","):
        dtype = getattr(torch, name)
        # One arena buffer in read order, as the engine places its streamed weights
        # (engine/weight_arena.py); the plain sum reads one too.
        _, plain = arena_like([torch.empty(n, k, dtype=dtype) for n, k in shapes])
        linears = []
        for w, (n, k) in zip(plain, shapes, strict=True):
            w.copy_(0.05 * torch.randn(n, k, generator=g))
            lin = torch.nn.Linear(k, n, bias=False, device="meta")
            lin.weight = torch.nn.Parameter(w, requires_grad=False)
            linears.append(OneDnnLinear(lin, small=True))
        _, (flat,) = arena_like([torch.empty(sum(w.numel() for w in plain), dtype=dtype)])
        torch.cat([w.reshape(-1) for w in plain], out=flat)  # the same bytes in one run
        nbytes = flat.numel() * flat.element_size()
        most = min(m.small_rows for m in linears)  # 0: some linear runs oneDNN at every size
        for rows in rows_list:
            xs = {k: torch.randn(rows, k, generator=g).to(dtype) for k in {k for _, k in shapes}}

            def onednn(xs=xs, linears=linears):  # OneDnnLinear._gemm without padding
                for m in linears:
                    x = xs[m.in_features].to(m.gemm_dtype)
                    y = torch.ops.mkldnn._linear_pointwise(x, m.packed_weight, None, "none", [], "")
                    y.to(m.dtype)

            def small(xs=xs, linears=linears):
                for m in linears:
                    torch.ops.bucketserve.small_linear(xs[m.in_features], m.plain_weight, None)

            impls = {"onednn": onednn}
            if rows <= most:
                impls["small_linear"] = small
            if rows == 1:
                impls["plain_sum"] = flat.sum
            for rnd in range(args.rounds):
                for impl, fn in impls.items():
                    fn()  # warm: oneDNN's primitive for this shape, caches
                    s = timed(fn, args.repeats)
                    results.setdefault((name, rows, impl), []).append(s)
                    flops = 2 * rows * sum(n * k for n, k in shapes)
                    print(json.dumps({"shape": args.shape, "dtype": name, "rows": rows,
                                      "impl": impl, "round": rnd, "ms": round(s * 1e3, 3),
                                      "gb_per_s": round(nbytes / s / 1e9, 1),
                                      "gflops": round(flops / s / 1e9, 1),
                                      "threads": torch.get_num_threads()}), flush=True)  # fmt: skip
    print(f"{'dtype':>9} {'rows':>4} {'impl':>13}  median ms (rounds)", file=sys.stderr)
    for (name, rows, impl), times in results.items():
        each = ", ".join(f"{t * 1e3:.2f}" for t in times)
        print(f"{name:>9} {rows:>4} {impl:>13}  {statistics.median(times) * 1e3:7.2f} ({each})",
              file=sys.stderr)  # fmt: skip


if __name__ == "__main__":
    main()
