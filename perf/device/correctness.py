"""Step 2: our engine against transformers with identical weights: a 2-layer model with
Llama-3-8B dimensions (llama3 rope scaling) saved by the installed transformers, fp32 and bf16,
sdpa and triton attention, prompts of 1 to 8k tokens; prefill + 8 decode steps compared to
one teacher-forced HF forward. On CPU: small dimensions, short prompts, sdpa only."""

from __future__ import annotations

import gc
import json
import os
import tempfile
import time

import torch
from bucketserve.bench.device import device, emit, on_gpu, sync

GPU_DIMS = dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                num_key_value_heads=8, vocab_size=128256)  # fmt: skip
CPU_DIMS = dict(hidden_size=256, intermediate_size=512, num_attention_heads=8,
                num_key_value_heads=2, vocab_size=1000)  # fmt: skip
DECODE_STEPS = 8
TOLERANCE = {"float32": 1e-3, "bfloat16": 5e-2}  # max |ours - HF| / max |HF| over the logits


def save_model(path: str) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    dims = GPU_DIMS if on_gpu() else CPU_DIMS
    cfg = AutoConfig.for_model(
        model_type="llama", num_hidden_layers=2, max_position_embeddings=16384,
        rope_theta=500000.0, eos_token_id=2, tie_word_embeddings=False,
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                          high_freq_factor=4.0, original_max_position_embeddings=8192),
        **dims,
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(path)


def compare(runner, hf, prompt: list[int]) -> dict:
    from bucketserve.engine.block_manager import BlockManager
    from bucketserve.engine.sequence import Sequence

    bm = BlockManager(runner.num_blocks, runner.block_size)
    seq = Sequence(list(prompt))
    bm.allocate_for(seq)
    if on_gpu():
        torch.cuda.reset_peak_memory_stats()
    sync()
    start = time.perf_counter()
    ours = [runner.prefill_logits([seq])[0]]
    sync()
    prefill_s = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated() / 2**30 if on_gpu() else None
    for _ in range(DECODE_STEPS):
        seq.append_token(int(ours[-1].argmax()))
        bm.ensure_slot(seq)
        ours.append(runner.decode_logits([seq])[0])
    bm.release(seq)
    ids = torch.tensor([seq.token_ids], device=runner.device)
    with torch.no_grad():
        ref = hf(ids, logits_to_keep=DECODE_STEPS + 1).logits[0].float()  # [9, V]
    ours = torch.stack(ours).float()
    return {
        "tokens": len(prompt), "prefill_s": round(prefill_s, 4), "peak_gib": peak,
        "rel_err": float((ours - ref).abs().max() / ref.abs().max()),
        "greedy_match": int((ours.argmax(-1) == ref.argmax(-1)).sum()), "of": DECODE_STEPS + 1,
    }  # fmt: skip


def run_case(path: str, dtype: str, attention: str, lengths: list[int]) -> dict:
    from bucketserve.engine.config import EngineConfig
    from bucketserve.engine.runner import ModelRunner
    from transformers import AutoModelForCausalLM

    runner = ModelRunner(EngineConfig(model=path, device=device(), dtype=dtype,
                                      attention=attention, num_blocks=1100, block_size=16))  # fmt: skip
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype),
                                              attn_implementation="sdpa").to(device()).eval()  # fmt: skip
    gen = torch.Generator().manual_seed(1)
    vocab = runner.model_config.vocab_size
    rows = [compare(runner, hf, torch.randint(3, vocab, (n,), generator=gen).tolist())
            for n in lengths]  # fmt: skip
    ok = all(r["rel_err"] < TOLERANCE[dtype] for r in rows)
    result = {"dtype": dtype, "attention": runner.attention_backend, "ok": ok,
              "elementwise": runner.elementwise_impl, "prompts": rows}  # fmt: skip
    runner.close()
    del runner, hf
    gc.collect()
    if on_gpu():
        torch.cuda.empty_cache()
    return result


def main() -> None:
    from bucketserve.engine.shapes import read_model_config

    with tempfile.TemporaryDirectory() as path:
        save_model(path)
        with open(os.path.join(path, "config.json")) as f:
            saved = json.load(f)
        mc = read_model_config(path)
        result = {"status": "ok", "config_has_rope_parameters": "rope_parameters" in saved,
                  "read_rope_theta": mc.rope_theta, "read_rope_type":
                  (mc.rope_scaling or {}).get("rope_type"), "cases": []}  # fmt: skip
        if on_gpu():
            lengths, dtypes, attentions = [1, 17, 300, 4096, 8192], ["float32", "bfloat16"], [
                "sdpa", "triton"]  # fmt: skip
        else:
            lengths, dtypes, attentions = [1, 17, 300], ["float32"], ["sdpa"]
            result["skipped"] = "bf16 and triton (need a GPU), prompts > 300 tokens (CPU time)"
        for dtype in dtypes:
            for attention in attentions:
                try:
                    result["cases"].append(run_case(path, dtype, attention, lengths))
                except Exception as e:  # one failing backend must not hide the others
                    result["cases"].append({"dtype": dtype, "attention": attention, "ok": False,
                                            "error": f"{type(e).__name__}: {e}"[:500]})  # fmt: skip
                emit(result["cases"][-1])  # one line per case: a timeout keeps the finished
    result["ok"] = result["read_rope_theta"] == 500000.0
    result["cases"] = len(result["cases"])
    emit(result)


if __name__ == "__main__":
    main()
