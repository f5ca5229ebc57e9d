"""Structured-output cost: a decode step with every row JSON-schema-guided vs the same step
unguided, at each batch size; and the sampler alone on the same logits. Prints one JSON object
per line and a ratio table.

    python perf/engine/guided_bench.py                      # CPU, SmolLM2, batch 1 and 16
    python perf/engine/guided_bench.py --model dummy:tiny --batch-sizes 1,16,64
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass, fields

import torch
from bucketserve.engine.block_manager import BlockManager
from bucketserve.engine.config import EngineConfig
from bucketserve.engine.runner import ModelRunner
from bucketserve.engine.sampler import SampleRow
from bucketserve.engine.sampling_params import SamplingParams
from bucketserve.engine.sequence import Sequence

# A string field the model must keep writing: every timed step stays inside the grammar
# (a reply that closed its JSON would be left unmasked and flatter the numbers).
SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 20},
        "year": {"type": "integer"},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}},
        "story": {"type": "string", "minLength": 2000},
    },
    "required": ["title", "year", "tags", "story"],
}


@dataclass(slots=True)
class Args:
    """Benchmark settings (the argparse below reads its defaults from here)."""

    model: str = "smollm2"
    batch_sizes: str = "1,16"
    prompt_len: int = 32
    decode_steps: int = 24
    warmup_steps: int = 4
    repeats: int = 3
    seed: int = 0
    threads: int = 0  # 0: torch's default


def decode_run(runner: ModelRunner, params: SamplingParams, batch: int, a: Args) -> list[float]:
    """Seconds of each timed decode step of `batch` fresh sequences (prefill untimed)."""
    blocks = BlockManager(runner.num_blocks, runner.block_size)
    gen = torch.Generator().manual_seed(a.seed)
    prompts = torch.randint(100, 20000, (batch, a.prompt_len), generator=gen).tolist()
    seqs = [Sequence(p, params) for p in prompts]
    for s in seqs:
        blocks.allocate_for(s, s.num_tokens + a.warmup_steps + a.decode_steps + 1)
    for s, tok in zip(seqs, runner.prefill(seqs), strict=True):
        s.append_token(tok)
    times = []
    for step in range(a.warmup_steps + a.decode_steps):
        start = time.perf_counter()
        tokens = runner.decode(seqs)
        if step >= a.warmup_steps:
            times.append(time.perf_counter() - start)
        for s, tok in zip(seqs, tokens, strict=True):
            s.append_token(tok)
    for s in seqs:
        blocks.release(s)
    return times


def sampler_run(runner: ModelRunner, params: SamplingParams, batch: int, a: Args) -> list[float]:
    """Seconds of the sampler alone on [batch, V] logits, rows advancing one token a call."""
    vocab = runner.model_config.vocab_size
    logits = torch.randn(batch, vocab, generator=torch.Generator().manual_seed(a.seed))
    tokens = [[1, 2, 3] for _ in range(batch)]
    times = []
    for step in range(a.warmup_steps + a.decode_steps):
        rows = [SampleRow(params, step, (2,), t) for t in tokens]
        start = time.perf_counter()
        out = runner.sampler(logits, rows)
        if step >= a.warmup_steps:
            times.append(time.perf_counter() - start)
        for t, tok in zip(tokens, out.tokens, strict=True):
            t.append(tok)
    return times


def measure(runner: ModelRunner, batch: int, a: Args) -> list[dict]:
    budget = a.warmup_steps + a.decode_steps + 8
    plain = SamplingParams(temperature=0, max_tokens=budget, ignore_eos=True)
    guided = SamplingParams(temperature=0, max_tokens=budget, guide_type="json",
                            guide=json.dumps(SCHEMA))  # fmt: skip
    runner.sampler.prefetch([guided])
    runner.sampler.guided.grammars.get(guided)  # compiled once, before timing
    rows = []
    for what, fn in (("decode_step", decode_run), ("sampler", sampler_run)):
        times: dict[str, list[float]] = {"unmasked": [], "masked": []}
        for _ in range(a.repeats):  # alternated, so a load change hits both alike
            for name, p in (("unmasked", plain), ("masked", guided)):
                times[name] += fn(runner, p, batch, a)
        ms = {name: 1e3 * statistics.median(t) for name, t in times.items()}
        rows.append({"what": what, "batch": batch, "unmasked_ms": round(ms["unmasked"], 3),
                     "masked_ms": round(ms["masked"], 3),
                     "ratio": round(ms["masked"] / ms["unmasked"], 3),
                     "added_ms": round(ms["masked"] - ms["unmasked"], 3)})  # fmt: skip
    return rows


def main(a: Args) -> None:
    if a.threads:
        torch.set_num_threads(a.threads)
    sizes = [int(b) for b in a.batch_sizes.split(",")]
    need = max(sizes) * (a.prompt_len + a.warmup_steps + a.decode_steps + 2)
    runner = ModelRunner(EngineConfig(model=a.model, device="cpu", num_blocks=need // 16 + 32,
                                      max_num_seqs=max(sizes), seed=a.seed))  # fmt: skip
    print(f"# {runner.describe()}")
    results = [row for b in sizes for row in measure(runner, b, a)]
    for row in results:
        print(json.dumps({"model": a.model, **row}))
    print(f"{'what':<12} {'batch':>5} {'unmasked ms':>12} {'masked ms':>10} {'ratio':>6}")
    for r in results:
        print(f"{r['what']:<12} {r['batch']:>5} {r['unmasked_ms']:>12.3f} "
              f"{r['masked_ms']:>10.3f} {r['ratio']:>6.3f}")  # fmt: skip
    runner.close()


def parse_args(argv=None) -> Args:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for f in fields(Args):
        p.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=f.default)
    return Args(**vars(p.parse_args(argv)))


if __name__ == "__main__":
    main(parse_args())
