"""Engine micro-benchmark: BucketServe's ModelRunner vs transformers eager, same model, same
prompts, same run. Prints one JSON object per line (phase prefill / decode per batch size).

    python perf/engine/engine_bench.py                      # CPU, SmolLM2 fp32, batch 1 and 16
    python perf/engine/engine_bench.py --device cuda --model dummy:llama-3-8b --batch-sizes 1,64
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import time
from dataclasses import dataclass

import torch
from bucketserve.engine.block_manager import BlockManager
from bucketserve.engine.config import EngineConfig, resolve_device, resolve_dtype
from bucketserve.engine.loader import dummy_shape, is_dummy
from bucketserve.engine.runner import ModelRunner
from bucketserve.engine.sampling_params import SamplingParams
from bucketserve.engine.sequence import Sequence
from bucketserve.engine.shapes import DUMMY_SHAPES

# B/s, H200 device-to-device copy: docs/measurements.md#reference-numbers-h200-one-gpu
GPU_BANDWIDTH = 4.3e12


@dataclass(slots=True)
class Args:
    """Benchmark settings (one source of defaults: the argparse below reads these)."""

    model: str = "smollm2"
    device: str = "auto"
    dtype: str = "auto"
    attention: str = "auto"
    batch_sizes: str = ""  # "": 1,16 on CPU; 1,16,64 on GPU
    prompt_len: int = 128
    decode_steps: int = 32
    impl: str = "both"
    repeats: int = 3
    seed: int = 0
    threads: int = 0  # 0: torch's default
    output: str = ""


def make_prompts(model: str, batch: int, length: int, seed: int) -> list[list[int]]:
    """`batch` prompts of exactly `length` tokens: real text (stdlib source, seeded offsets)
    for real models; seeded random ids for dummy shapes (no tokenizer, no SmolLM2 needed)."""
    gen = torch.Generator().manual_seed(seed)
    if is_dummy(model):
        vocab = DUMMY_SHAPES[dummy_shape(model)]["vocab_size"]
        return torch.randint(0, vocab, (batch, length), generator=gen).tolist()
    from transformers import AutoTokenizer

    source = inspect.getsource(argparse)
    ids = AutoTokenizer.from_pretrained(_model_dir(model))(source).input_ids
    starts = torch.randint(0, len(ids) - length, (batch,), generator=gen).tolist()
    return [ids[s : s + length] for s in starts]


class OursBench:
    """Packed prefill, then batched paged decode through ModelRunner."""

    name = "bucketserve"

    def __init__(self, args: Args, max_batch: int) -> None:
        max_len = args.prompt_len + args.decode_steps + 16
        # A pool just big enough (max_len // 16 + 2 blocks per sequence covers block sizes
        # >= 16): the default takes 90 % of a GPU's free memory, none left for transformers.
        self.runner = ModelRunner(EngineConfig(
            model=args.model, device=args.device, dtype=args.dtype, attention=args.attention,
            seed=args.seed, max_model_len=max_len, num_blocks=max_batch * (max_len // 16 + 2),
        ))  # fmt: skip
        self.attention = self.runner.attention_backend

    def run(self, prompts: list[list[int]], steps: int) -> tuple[float, float]:
        """Seconds for the prefill and for `steps` decode steps."""
        r = self.runner
        bm = BlockManager(r.num_blocks, r.block_size)
        seqs = [Sequence(p, SamplingParams(temperature=0, max_tokens=steps + 1)) for p in prompts]
        for seq in seqs:
            bm.allocate_for(seq)
        t_prefill = _timed(lambda: _append(seqs, r.prefill(seqs)), r.device)
        start = time.perf_counter()
        for _ in range(steps):
            for seq in seqs:
                bm.ensure_slot(seq)
            _append(seqs, r.decode(seqs))
        t_decode = _elapsed(start, r.device)
        for seq in seqs:
            bm.release(seq)
        return t_prefill, t_decode


class HfBench:
    """transformers eager: one forward for the prompts, then a greedy loop on its KV cache."""

    name = "transformers"

    def __init__(self, args: Args, ours: OursBench | None) -> None:
        from transformers import AutoConfig, AutoModelForCausalLM

        self.device = resolve_device(args.device)
        dtype = resolve_dtype(EngineConfig(dtype=args.dtype).dtype, self.device)
        if is_dummy(args.model):
            config = AutoConfig.for_model(**DUMMY_SHAPES[dummy_shape(args.model)])
            with torch.device(self.device):  # initialise on the device: 8B on CPU takes minutes
                model = AutoModelForCausalLM.from_config(config, dtype=dtype)
        else:
            model_dir = ours.runner.tokenizer_dir if ours else _model_dir(args.model)
            model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
        self.model = model.to(self.device).eval()
        self.attention = self.model.config._attn_implementation

    @torch.inference_mode()
    def run(self, prompts: list[list[int]], steps: int) -> tuple[float, float]:
        """Seconds for the prefill and for `steps` decode steps."""
        ids = torch.tensor(prompts, device=self.device)
        start = time.perf_counter()
        out = self.model(ids, use_cache=True)
        token = out.logits[:, -1].argmax(-1, keepdim=True)
        t_prefill = _elapsed(start, self.device)
        cache, start = out.past_key_values, time.perf_counter()
        for _ in range(steps):
            out = self.model(token, past_key_values=cache, use_cache=True)
            token = out.logits[:, -1].argmax(-1, keepdim=True)
        return t_prefill, _elapsed(start, self.device)


def _model_dir(spec: str) -> str:
    from bucketserve.engine.loader import resolve_model

    return resolve_model(spec)


def _append(seqs: list[Sequence], tokens: list[int]) -> None:
    for seq, token in zip(seqs, tokens, strict=True):
        seq.append_token(token)


def _elapsed(start: float, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def _timed(fn, device: torch.device) -> float:
    start = time.perf_counter()
    fn()
    return _elapsed(start, device)


def measure(bench, prompts: list[list[int]], args: Args) -> tuple[float, float]:
    """Best-of-`repeats` prefill and decode seconds after one untimed warm-up."""
    bench.run(prompts, min(4, args.decode_steps))
    runs = [bench.run(prompts, args.decode_steps) for _ in range(args.repeats)]
    return min(r[0] for r in runs), min(r[1] for r in runs)


def records(bench, batch: int, times: tuple[float, float], args: Args, meta: dict) -> list[dict]:
    """The two JSON lines (prefill, decode) of one measurement."""
    t_prefill, t_decode = times
    common = dict(meta, impl=bench.name, attention=bench.attention, batch=batch,
                  prompt_len=args.prompt_len)  # fmt: skip
    prefill = dict(common, phase="prefill", steps=1, seconds=round(t_prefill, 4),
                   tokens_per_s=round(batch * args.prompt_len / t_prefill, 1))  # fmt: skip
    decode = dict(common, phase="decode", steps=args.decode_steps, seconds=round(t_decode, 4),
                  tokens_per_s=round(batch * args.decode_steps / t_decode, 1),
                  step_ms=round(1e3 * t_decode / args.decode_steps, 3))  # fmt: skip
    if meta["device"].startswith("cuda"):
        decode.update(memory_floor(bench, batch, args, decode["step_ms"]))
    return [prefill, decode]


def memory_floor(bench, batch: int, args: Args, step_ms: float) -> dict:
    """Decode step time vs reading all weights and the batch's KV once at GPU bandwidth."""
    mc = ours_config(args)
    context = args.prompt_len + args.decode_steps // 2
    # A step reads one embedding row per sequence, not the table (unless lm_head shares it).
    params = mc.num_params - (0 if mc.tie_word_embeddings else mc.vocab_size * mc.hidden_size)
    nbytes = params * torch.finfo(_dtype(args)).bits // 8
    nbytes += batch * context * mc.kv_bytes_per_token
    floor_ms = 1e3 * nbytes / GPU_BANDWIDTH
    return dict(floor_ms=round(floor_ms, 3), floor_ratio=round(step_ms / floor_ms, 2))


def _dtype(args: Args) -> torch.dtype:
    return resolve_dtype(EngineConfig(dtype=args.dtype).dtype, resolve_device(args.device))


def ours_config(args: Args):
    """ModelConfig of the benchmarked model in the benchmark dtype."""
    from bucketserve.engine.loader import model_config_for

    return model_config_for(args.model, dtype=str(_dtype(args)).removeprefix("torch."))


def print_speedups(batch: int, rates: dict) -> None:
    """bucketserve / transformers tokens/s per phase, to stderr (stdout stays JSON lines)."""
    for phase in ("prefill", "decode"):
        ours, theirs = rates.get(("bucketserve", phase)), rates.get(("transformers", phase))
        if ours and theirs:
            print(f"batch {batch} {phase}: bucketserve {ours} vs transformers {theirs} "
                  f"tokens/s = {ours / theirs:.2f}x", file=sys.stderr, flush=True)  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    """Run the comparison and print JSON lines."""
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    sizes = args.batch_sizes or ("1,16" if device.type == "cpu" else "1,16,64")
    batches = [int(b) for b in sizes.split(",")]
    ours = OursBench(args, max(batches)) if args.impl in ("both", "bucketserve") else None
    benches = [b for b in (ours, HfBench(args, ours) if args.impl != "bucketserve" else None) if b]
    meta = dict(model=args.model, device=str(device), dtype=str(_dtype(args)).removeprefix("torch."),
                threads=torch.get_num_threads())  # fmt: skip
    out = open(args.output, "a") if args.output else None  # noqa: SIM115
    for batch in batches:
        prompts = make_prompts(args.model, batch, args.prompt_len, args.seed + batch)
        rates = {}
        for bench in benches:  # same prompts, interleaved per batch size
            for rec in records(bench, batch, measure(bench, prompts, args), args, meta):
                rates[rec["impl"], rec["phase"]] = rec["tokens_per_s"]
                line = json.dumps(rec)
                print(line, flush=True)
                if out:
                    out.write(line + "\n")
        print_speedups(batch, rates)
    if ours:
        ours.runner.close()
    if out:
        out.close()


def parse_args(argv: list[str] | None) -> Args:
    """Command line -> Args (defaults come from the dataclass)."""
    d = Args()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=d.model)
    p.add_argument("--device", default=d.device)
    p.add_argument("--dtype", default=d.dtype)
    p.add_argument("--attention", default=d.attention)
    p.add_argument("--batch-sizes", default=d.batch_sizes, help="comma-separated")
    p.add_argument("--prompt-len", type=int, default=d.prompt_len)
    p.add_argument("--decode-steps", type=int, default=d.decode_steps)
    p.add_argument("--impl", choices=("both", "bucketserve", "transformers"), default=d.impl)
    p.add_argument("--repeats", type=int, default=d.repeats, help="timed runs, best kept")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--threads", type=int, default=d.threads, help="torch CPU threads (0: default)")
    p.add_argument("--output", default=d.output, help="also append the JSON lines here")
    return Args(**vars(p.parse_args(argv)))


if __name__ == "__main__":
    main(sys.argv[1:])
