"""Shared-system-prompt TTFT on a real server: N requests sharing a ~1,500-token system prompt,
each with its own ~20-token question, sent one after another (streaming `generate_stream`; TTFT
is the first event). Starts the default server (SmolLM2 on CPU, `--topology auto`: two colocated
instances) with prefix caching on, then again with it off, unless --url is given (then only
that server, as it is configured). Prints one JSON line per request and a summary per
server: request 1's TTFT, the mean of requests 2..N, their ratio, and each reply's
`num_cached_tokens`. Seeded; one untimed warm-up request per server.

    nice -n 10 .venv/bin/python perf/load/prefix_ttft.py
    nice -n 10 .venv/bin/python perf/load/prefix_ttft.py --topology disaggregated --requests 16
"""

from __future__ import annotations

import argparse
import inspect
import json
import random
import statistics
import sys
import uuid

from bucketserve.bench.local import caching_on_then_off, stream_greedy

WORDS = ("why how which where does the this function class value return error list parse "
         "string number file line call module argument default option help name type").split()  # fmt: skip


def system_prompt(chars: int) -> str:
    """~chars / 4 tokens of Python source (the stdlib's argparse)."""
    return inspect.getsource(argparse)[:chars]


def ask(url: str, text: str, args, salt: str) -> dict:
    got = stream_greedy(url, args.model, text, args.max_tokens, salt)
    return {k: got[k] for k in ("ttft_s", "num_input_tokens", "num_cached_tokens")}


def series(url: str, args, label: str) -> dict:
    """The N requests, one after another, under a fresh salt (nothing cached from before)."""
    rng, salt = random.Random(args.seed), uuid.uuid4().hex
    system = system_prompt(args.system_chars)
    ask(url, "Warm-up: say hello.", args, salt)  # untimed, shares nothing with the rest
    rows = []
    for i in range(args.requests):
        question = " ".join(rng.choice(WORDS) for _ in range(args.question_words))
        row = {
            "server": label,
            "request": i + 1,
            **ask(url, f"{system}\nQ: {question}?\nA:", args, salt),
        }
        print(json.dumps(row), flush=True)
        rows.append(row)
    first, rest = rows[0]["ttft_s"], statistics.mean(r["ttft_s"] for r in rows[1:])
    return {"server": label, "first_ttft_s": first, "rest_mean_ttft_s": round(rest, 4),
            "rest_over_first": round(rest / first, 3),
            "cached_tokens": [r["num_cached_tokens"] for r in rows]}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default=None, help="HTTP host:port of a running server")
    p.add_argument("--model", default="bucketserve")
    p.add_argument("--topology", default="auto", help="without --url")
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--system-chars", type=int, default=6000, help="~1,500 SmolLM2 tokens")
    p.add_argument("--question-words", type=int, default=12, help="~20 tokens")
    p.add_argument("--max-tokens", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.url:
        print(json.dumps(series(args.url, args, args.url)), flush=True)
        return 0
    caching_on_then_off(
        "prefix-ttft-",
        lambda srv, label: [series(srv.http_url, args, label)],
        topology=args.topology,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
