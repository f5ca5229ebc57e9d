"""Paged-decode attention on a GPU: the Triton kernel against SDPA (same pools, same block
tables), correctness and time per call, one JSON line per shape.

    PYTHONPATH=backends python perf/engine/gpu_attention_check.py            # Llama-3-8B heads, bf16
    TRITON_INTERPRET=1 PYTHONPATH=backends python perf/engine/gpu_attention_check.py --device cpu \\
        --dtype float32 --shapes 2x40 --iters 1                            # dry run on CPU
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from bucketserve.engine.attention import AttentionMetadata
from bucketserve.engine.attention.sdpa import SdpaBackend
from bucketserve.engine.attention.triton_paged import TritonBackend


def pools(batch: int, context: int, heads: int, kv_heads: int, dim: int, block: int, args):
    """Random caches with each sequence's blocks scattered over the pool, and q."""
    gen = torch.Generator().manual_seed(batch)
    per_seq = -(-context // block)
    num_blocks = batch * per_seq + 8
    shape = (num_blocks, block, kv_heads, dim)
    k_cache, v_cache = (torch.randn(shape, generator=gen).to(args.device, args.dtype) for _ in "kv")
    ids = torch.randperm(num_blocks, generator=gen).tolist()
    tables = [ids[i * per_seq : (i + 1) * per_seq] for i in range(batch)]
    q = torch.randn(batch, heads, dim, generator=gen).to(args.device, args.dtype)
    return q, k_cache, v_cache, tables


def timed(fn, iters: int, device: str) -> float:
    """Median seconds per call after one warm-up (compiles the kernel)."""
    fn()
    times = []
    for _ in range(iters):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def check(batch: int, context: int, args) -> dict:
    q, k_cache, v_cache, tables = pools(batch, context, args.heads, args.kv_heads,
                                        args.head_dim, args.block_size, args)  # fmt: skip
    lens = [context] * batch
    to_tensor = lambda d, t: torch.tensor(d, dtype=t, device=args.device)  # noqa: E731
    result = dict(batch=batch, context=context, dtype=str(args.dtype), device=args.device)
    outs = {}
    for backend in (TritonBackend(), SdpaBackend()):
        meta = AttentionMetadata(is_prefill=False, slot_mapping=torch.zeros(1), seq_lens=lens,
                                 max_seqlen=context)  # fmt: skip
        backend.prepare_decode(meta, tables, lens, args.block_size, to_tensor)
        call = lambda b=backend, m=meta: b.decode(q, k_cache, v_cache, m, args.head_dim**-0.5)  # noqa: E731
        outs[backend.name] = call().float()
        result[f"{backend.name}_us"] = round(1e6 * timed(call, args.iters, args.device), 1)
    ref = outs["sdpa"]
    result["max_rel_err"] = float((outs["triton"] - ref).abs().max() / ref.abs().max())
    result["ok"] = result["max_rel_err"] < 2e-2
    kv_bytes = 2 * batch * context * args.kv_heads * args.head_dim * k_cache.element_size()
    result["triton_kv_gb_per_s"] = round(kv_bytes / result["triton_us"] / 1e3, 1)
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument(
        "--shapes", default="1x1024,16x1024,64x1024", help="batch x context pairs, comma-separated"
    )
    p.add_argument("--heads", type=int, default=32)  # Llama-3-8B
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--iters", type=int, default=20)
    args = p.parse_args()
    args.dtype = getattr(torch, args.dtype)
    for shape in args.shapes.split(","):
        batch, context = (int(x) for x in shape.split("x"))
        print(json.dumps(check(batch, context, args)), flush=True)
    if args.device.startswith("cuda"):
        print(json.dumps(recompile_check(args)), flush=True)


def recompile_check(args) -> dict:
    """First-call time of the kernel as the block-table width grows: a width that is not
    specialised on costs no recompile (~1 s each otherwise, stalling the decode loop)."""
    from bucketserve.engine.attention.triton_paged import paged_decode

    q, k_cache, v_cache, tables = pools(1, 64 * args.block_size, args.heads, args.kv_heads,
                                        args.head_dim, args.block_size, args)  # fmt: skip
    times = {}
    for width in (61, 62, 64, 80, 97):  # %16 and ==1 were the old specialisations
        table = torch.tensor([tables[0][:1] * width], dtype=torch.int32, device=args.device)
        lens = torch.tensor([args.block_size], dtype=torch.int32, device=args.device)
        torch.cuda.synchronize()
        start = time.perf_counter()
        paged_decode(q, k_cache, v_cache, table, lens, 0.1)
        torch.cuda.synchronize()
        times[width] = round((time.perf_counter() - start) * 1e3, 2)
    return {"first_call_ms_by_table_width": times}


if __name__ == "__main__":
    main()
