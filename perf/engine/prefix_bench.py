"""Prefix-caching benchmark (engine): requests sharing one long system prompt, each with its own
question, run one after another through LLMEngine; time to first token (prefill + the first
sampled token) with the cache on vs off, same runner, same run. Prints one JSON line per
setting, then the ratio of warm to cold TTFT. Seeded; one untimed warm-up per setting.

    python perf/engine/prefix_bench.py                       # SmolLM2 CPU fp32, 1,500 + ~20 tokens
    python perf/engine/prefix_bench.py --system-tokens 2000 --requests 16
"""

from __future__ import annotations

import argparse
import inspect
import json
import random
import statistics
import sys
import time
from dataclasses import dataclass

import torch
from bucketserve.engine.config import EngineConfig
from bucketserve.engine.llm_engine import LLMEngine
from bucketserve.engine.loader import resolve_model
from bucketserve.engine.runner import ModelRunner
from bucketserve.engine.sampling_params import SamplingParams

WORDS = ("why how which where does the this function class value return error list parse "
         "string number file line call module argument default option help name type").split()  # fmt: skip


@dataclass(slots=True)
class Args:
    """Benchmark settings (one source of defaults: the argparse below reads these)."""

    model: str = "smollm2"
    device: str = "cpu"
    attention: str = "auto"
    system_tokens: int = 1500
    question_tokens: int = 20
    requests: int = 8
    chunk_tokens: int = 4096  # prefill a whole prompt per step
    threads: int = 0  # 0: torch's default
    seed: int = 0


def make_prompts(tokenizer, a: Args) -> list[list[int]]:
    """The shared system prompt (stdlib argparse source) plus a seeded question per request."""
    system = tokenizer(inspect.getsource(argparse)).input_ids[: a.system_tokens]
    rng = random.Random(a.seed)
    prompts = []
    for _ in range(a.requests):
        text = "\nQ: " + " ".join(rng.choice(WORDS) for _ in range(2 * a.question_tokens))
        prompts.append(system + tokenizer(text).input_ids[: a.question_tokens])
    return prompts


def run(runner: ModelRunner, prompts: list[list[int]], caching: bool, a: Args) -> dict:
    config = EngineConfig(model=a.model, device=a.device, enable_prefix_caching=caching)
    engine = LLMEngine(config, runner=runner, chunk_tokens=a.chunk_tokens)
    first = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    engine.generate([list(range(100, 164))], first)  # warm-up, untimed, shares nothing
    ttft, cached = [], []
    for p in prompts:
        hits, start = engine.num_cached_tokens, time.perf_counter()
        engine.generate([p], first)
        ttft.append(time.perf_counter() - start)
        cached.append(engine.num_cached_tokens - hits)
    rest = statistics.mean(ttft[1:]) if len(ttft) > 1 else float("nan")
    return {"prefix_caching": caching, "prompt_tokens": len(prompts[0]),
            "ttft_s": [round(t, 4) for t in ttft], "first_ttft_s": round(ttft[0], 4),
            "rest_mean_ttft_s": round(rest, 4), "rest_over_first": round(rest / ttft[0], 3),
            "cached_tokens": cached}  # fmt: skip


def parse(argv: list[str] | None) -> Args:
    d, p = Args(), argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in Args.__slots__:
        p.add_argument("--" + name.replace("_", "-"), type=type(getattr(d, name)),
                       default=getattr(d, name))  # fmt: skip
    return Args(**vars(p.parse_args(argv)))


def main(argv: list[str] | None = None) -> int:
    from transformers import AutoTokenizer

    a = parse(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    runner = ModelRunner(EngineConfig(model=a.model, device=a.device, attention=a.attention,
                                      max_num_batched_tokens=a.chunk_tokens))  # fmt: skip
    prompts = make_prompts(AutoTokenizer.from_pretrained(resolve_model(a.model)), a)
    try:
        rows = [run(runner, prompts, caching, a) for caching in (False, True)]
    finally:
        runner.close()
    for row in rows:
        print(json.dumps(row), flush=True)
    off, on = rows
    print(json.dumps({"summary": "requests 2.. mean TTFT, cache on / off",
                      "ratio": round(on["rest_mean_ttft_s"] / off["rest_mean_ttft_s"], 3),
                      "on_rest_over_first": on["rest_over_first"]}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
