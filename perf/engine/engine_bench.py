"""Engine micro-benchmark: BucketServe's ModelRunner vs transformers eager, same model, same
prompts, same run, in each benchmarked dtype. Prints one JSON object per line (phase prefill /
decode per batch size, impl and dtype), then a table on stderr: tokens/s of each, bf16/fp32,
and the decode step against its memory floor (weight + KV bytes / read bandwidth, measured).

    python perf/engine/engine_bench.py                      # CPU, SmolLM2, fp32 (+ bf16), batch 1/16/64
    python perf/engine/engine_bench.py --device cuda --model dummy:llama-3-8b --batch-sizes 1,64
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
import sys
import time
from dataclasses import dataclass

import torch
from bucketserve.bench.engine_table import print_table
from bucketserve.bench.floor import decode_floor, read_bandwidth
from bucketserve.engine.block_manager import BlockManager
from bucketserve.engine.config import EngineConfig, auto_dtype, resolve_device
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
    dtypes: str = "auto"  # comma-separated; "auto": float32 and, where auto picks it, bfloat16
    attention: str = "auto"
    batch_sizes: str = "1,16,64"
    prompt_len: int = 128
    decode_steps: int = 32
    impl: str = "both"
    repeats: int = 3  # timed rounds, every bench once per round (interleaved); median kept
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

    def __init__(self, args: Args, dtype: str, max_batch: int) -> None:
        max_len = args.prompt_len + args.decode_steps + 16
        # A pool just big enough (max_len // 16 + 2 blocks per sequence covers block sizes
        # >= 16): the default takes 90 % of a GPU's free memory, none left for transformers.
        self.runner = ModelRunner(EngineConfig(
            model=args.model, device=args.device, dtype=dtype, attention=args.attention,
            seed=args.seed, max_model_len=max_len, num_blocks=max_batch * (max_len // 16 + 2),
        ))  # fmt: skip
        self.attention = self.runner.attention_backend
        self.dtype = dtype

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

    def __init__(self, args: Args, dtype: str, model_dir: str | None) -> None:
        from transformers import AutoConfig, AutoModelForCausalLM

        self.device, self.dtype = resolve_device(args.device), dtype
        if is_dummy(args.model):
            config = AutoConfig.for_model(**DUMMY_SHAPES[dummy_shape(args.model)])
            with torch.device(self.device):  # initialise on the device: 8B on CPU takes minutes
                model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
        else:
            model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype))
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


@dataclass(slots=True)
class Timing:
    """One bench's medians over the rounds, and each round's decode step and bandwidth."""

    prefill_s: float
    decode_s: float
    rounds: list[tuple[float, float]]  # (step_ms, read bandwidth B/s around that run)


def measure(benches: list, prompts: list[list[int]], args: Args, bandwidth) -> list[Timing]:
    """Median prefill and decode seconds of each bench over `repeats` rounds, each round
    running every bench once in turn (so a burst of load on a shared machine hits all of
    them), after one untimed warm-up each; `bandwidth()` is read before and after every
    timed run (bench/floor.py: the floor of that run)."""
    for bench in benches:
        bench.run(prompts, min(4, args.decode_steps))
    runs: list[list[tuple[float, float, float]]] = [[] for _ in benches]
    for _ in range(args.repeats):
        for i, bench in enumerate(benches):
            before = bandwidth()
            t_prefill, t_decode = bench.run(prompts, args.decode_steps)
            runs[i].append((t_prefill, t_decode, max(before, bandwidth())))
    return [
        Timing(
            statistics.median(r[0] for r in rs),
            statistics.median(r[1] for r in rs),
            [(1e3 * r[1] / args.decode_steps, r[2]) for r in rs],
        )  # fmt: skip
        for rs in runs
    ]


def records(bench, batch: int, timing: Timing, args: Args, meta: dict) -> list[dict]:
    """The two JSON lines (prefill, decode) of one measurement."""
    t_prefill, t_decode = timing.prefill_s, timing.decode_s
    common = dict(meta, impl=bench.name, dtype=bench.dtype, attention=bench.attention,
                  batch=batch, prompt_len=args.prompt_len)  # fmt: skip
    prefill = dict(common, phase="prefill", steps=1, seconds=round(t_prefill, 4),
                   tokens_per_s=round(batch * args.prompt_len / t_prefill, 1))  # fmt: skip
    decode = dict(common, phase="decode", steps=args.decode_steps, seconds=round(t_decode, 4),
                  tokens_per_s=round(batch * args.decode_steps / t_decode, 1),
                  step_ms=round(1e3 * t_decode / args.decode_steps, 3))  # fmt: skip
    context = args.prompt_len + args.decode_steps // 2
    mc = _model_config(args.model, bench.dtype)
    decode.update(decode_floor(mc, batch, context, timing.rounds))
    return [prefill, decode]


def _model_config(model: str, dtype: str):
    from bucketserve.engine.loader import model_config_for

    return model_config_for(model, dtype=dtype)


def bench_dtypes(spec: str, device: torch.device) -> list[str]:
    """The dtypes to benchmark: "auto" -> float32, and bfloat16 when auto picks it."""
    if spec != "auto":
        return [EngineConfig(dtype=d).dtype for d in spec.split(",")]
    picked = str(auto_dtype(device)[0]).removeprefix("torch.")
    return list(dict.fromkeys(["float32", picked])) if device.type == "cpu" else [picked]


def make_benches(args: Args, dtypes: list[str], max_batch: int) -> list:
    """Ours and transformers per dtype, in the order they run (ours first per dtype)."""
    benches = []
    for dtype in dtypes:
        ours = OursBench(args, dtype, max_batch) if args.impl != "transformers" else None
        model_dir = None if is_dummy(args.model) else _model_dir(args.model)
        hf = HfBench(args, dtype, model_dir) if args.impl != "bucketserve" else None
        benches += [b for b in (ours, hf) if b]
    return benches


def main(argv: list[str] | None = None) -> None:
    """Run the comparison, print JSON lines (stdout) and the table (stderr)."""
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    batches = [int(b) for b in args.batch_sizes.split(",")]
    benches = make_benches(args, bench_dtypes(args.dtypes, device), max(batches))
    bandwidth = (lambda: GPU_BANDWIDTH) if device.type == "cuda" else read_bandwidth
    meta = dict(model=args.model, device=str(device), threads=torch.get_num_threads())
    print(f"read bandwidth {bandwidth() / 1e9:.1f} GB/s now "
          f"({'measured before and after every timed run' if device.type == 'cpu' else 'H200 reference'})",
          file=sys.stderr)  # fmt: skip
    out = open(args.output, "a") if args.output else None  # noqa: SIM115
    rows = []
    for batch in batches:
        prompts = make_prompts(args.model, batch, args.prompt_len, args.seed + batch)
        for bench, timing in zip(benches, measure(benches, prompts, args, bandwidth), strict=True):
            for rec in records(bench, batch, timing, args, meta):
                rows.append(rec)
                line = json.dumps(rec)
                print(line, flush=True)
                if out:
                    out.write(line + "\n")
    print_table(rows)
    for bench in benches:
        if isinstance(bench, OursBench):
            bench.runner.close()
    if out:
        out.close()


def parse_args(argv: list[str] | None) -> Args:
    """Command line -> Args (defaults come from the dataclass)."""
    d = Args()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=d.model)
    p.add_argument("--device", default=d.device)
    p.add_argument("--dtypes", "--dtype", default=d.dtypes, help="comma-separated, or auto")
    p.add_argument("--attention", default=d.attention)
    p.add_argument("--batch-sizes", default=d.batch_sizes, help="comma-separated")
    p.add_argument("--prompt-len", type=int, default=d.prompt_len)
    p.add_argument("--decode-steps", type=int, default=d.decode_steps)
    p.add_argument("--impl", choices=("both", "bucketserve", "transformers"), default=d.impl)
    p.add_argument("--repeats", type=int, default=d.repeats, help="timed rounds, median kept")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--threads", type=int, default=d.threads, help="torch CPU threads (0: default)")
    p.add_argument("--output", default=d.output, help="also append the JSON lines here")
    return Args(**vars(p.parse_args(argv)))


if __name__ == "__main__":
    main(sys.argv[1:])
