"""Perplexity of the engine on a fixed text in float32 and bfloat16: the quality bf16 costs.

    python perf/engine/perplexity.py                  # SmolLM2 on CPU: both dtypes and the delta

The text is the Python language reference shipped with every Python (`pydoc_data.topics`,
topics in sorted order), cut into NUM_CHUNKS chunks of CHUNK_TOKENS tokens. Each chunk is
scored teacher-forced through the engine's own steps: a one-token prefill, then decode steps
fed the text's next token, so the paged KV pool and the decode kernels are what is measured.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import torch
import torch.nn.functional as F

from bucketserve.engine.block_manager import BlockManager
from bucketserve.engine.config import EngineConfig
from bucketserve.engine.runner import ModelRunner
from bucketserve.engine.sampling_params import SamplingParams
from bucketserve.engine.sequence import Sequence

NUM_CHUNKS = 8
CHUNK_TOKENS = 256


def text_chunks(tokenizer, num_chunks: int = NUM_CHUNKS, length: int = CHUNK_TOKENS):
    """`num_chunks` consecutive `length`-token slices of the language reference."""
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[k] for k in sorted(topics))
    ids = tokenizer(text[: 8 * num_chunks * length]).input_ids  # ~4 chars a token: enough
    if len(ids) < num_chunks * length:
        raise ValueError(f"the text has {len(ids)} tokens, {num_chunks * length} are needed")
    return [ids[i * length : (i + 1) * length] for i in range(num_chunks)]


@torch.inference_mode()
def perplexity(runner: ModelRunner, chunks: list[list[int]]) -> float:
    """exp(mean negative log-likelihood) of every chunk token after the first, given the ones
    before it; all chunks decode together as one batch."""
    bm = BlockManager(runner.num_blocks, runner.block_size)
    seqs = [Sequence(c[:1], SamplingParams(temperature=0, max_tokens=len(c))) for c in chunks]
    for seq in seqs:
        bm.allocate_for(seq)
    logits, nll = runner.prefill_logits(seqs), 0.0  # [B, V] float32
    length = min(len(c) for c in chunks)
    for i in range(1, length):
        targets = torch.tensor([c[i] for c in chunks])
        nll += float(F.cross_entropy(logits.float(), targets, reduction="sum"))
        if i == length - 1:
            break
        for seq, chunk in zip(seqs, chunks, strict=True):
            seq.append_token(chunk[i])
            bm.ensure_slot(seq)
        logits = runner.decode_logits(seqs)
    for seq in seqs:
        bm.release(seq)
    return math.exp(nll / (len(chunks) * (length - 1)))


def main(argv: list[str] | None = None) -> None:
    """Print the perplexity per dtype and the bf16 - fp32 delta."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: default)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers import AutoTokenizer

    result = {}
    for dtype in args.dtypes.split(","):
        runner = ModelRunner(EngineConfig(model=args.model, device="cpu", dtype=dtype,
                                          kv_cache_gb=0.25, max_model_len=1024))  # fmt: skip
        chunks = text_chunks(AutoTokenizer.from_pretrained(runner.tokenizer_dir))
        start = time.perf_counter()
        result[dtype] = perplexity(runner, chunks)
        runner.close()
        print(f"{dtype}: perplexity {result[dtype]:.4f} over {len(chunks)} x "
              f"{len(chunks[0]) - 1} tokens ({time.perf_counter() - start:.1f} s)")  # fmt: skip
    if {"float32", "bfloat16"} <= set(result):
        fp32, bf16 = result["float32"], result["bfloat16"]
        print(f"bf16 - fp32: {bf16 - fp32:+.4f} ({100 * (bf16 / fp32 - 1):+.2f} %)")


if __name__ == "__main__":
    main(sys.argv[1:])
