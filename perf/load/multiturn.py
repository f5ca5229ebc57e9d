"""Multi-turn conversations on a real server, prefix caching on vs off: C conversations run at
once, each of T turns sent one after another, every turn resending the whole history (a shared
system prompt, then each earlier question and the server's own answer) plus a new question, as
a chat client does. Streaming `generate_stream`; TTFT is the first event.

Starts the default server (SmolLM2 on CPU, `--topology auto`: two colocated instances) with prefix
caching on, then with it off, and runs every seed on each (each seed under its own
`cache_salt`, so nothing is shared across seeds); --url runs one given server instead. Greedy,
so both servers see the same histories. Prints one JSON line per turn and, per server and seed,
TTFT p50 / p90 of turns 2..T, TPOT p50, the cached share of prompt tokens, SLO attainment and
the SLO-meeting requests per second at this closed-loop concurrency.

    nice -n 10 .venv/bin/python perf/load/multiturn.py --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import inspect
import json
import random
import statistics
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from bucketserve.bench.local import caching_on_then_off, stream_greedy
from bucketserve.bench.metrics import percentile

WORDS = ("why how which where does the this function class value return error list parse "
         "string number file line call module argument default option help name type").split()  # fmt: skip


def system_prompt(chars: int) -> str:
    """~chars / 4 tokens of Python source (the stdlib's json.decoder)."""
    import json.decoder

    return "You answer questions about this code.\n" + inspect.getsource(json.decoder)[:chars]


def conversation(url: str, args, seed: int, index: int, salt: str, label: str) -> list[dict]:
    """One conversation's T turns, each after the previous answer arrived."""
    rng = random.Random(f"{seed}-{index}")
    history, rows = system_prompt(args.system_chars), []
    for turn in range(1, args.turns + 1):
        question = " ".join(rng.choice(WORDS) for _ in range(args.question_words)) + "?"
        history += f"\nUser: {question}\nAssistant:"
        got = stream_greedy(url, args.model, history, args.max_tokens, salt)
        history += got.pop("reply")
        row = {"server": label, "seed": seed, "conversation": index, "turn": turn, **got}
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def run_seed(url: str, args, seed: int, label: str) -> dict:
    """C conversations at once under a fresh salt; the summary of turns 2..T."""
    salt = uuid.uuid4().hex
    stream_greedy(
        url, args.model, "Warm-up: say hello.", args.max_tokens, salt
    )  # untimed, shares nothing
    start = time.monotonic()
    with ThreadPoolExecutor(args.conversations) as pool:
        jobs = [pool.submit(conversation, url, args, seed, i, salt, label)
                for i in range(args.conversations)]  # fmt: skip
        rows = [row for job in jobs for row in job.result()]
    wall = time.monotonic() - start
    later = [r for r in rows if r["turn"] > 1]
    ttfts = [r["ttft_s"] for r in later]
    met = [r for r in rows if r["ttft_s"] <= args.slo_ttft and r["tpot_s"] <= args.slo_tpot]
    prompt = sum(r["num_input_tokens"] for r in rows)
    return {
        "server": label, "seed": seed, "requests": len(rows),
        "ttft_p50_s": round(percentile(ttfts, 50), 3),
        "ttft_p90_s": round(percentile(ttfts, 90), 3),
        "tpot_p50_s": round(statistics.median(r["tpot_s"] for r in rows), 4),
        "cached_share": round(sum(r["num_cached_tokens"] for r in rows) / prompt, 3),
        "mean_prompt_tokens": round(prompt / len(rows)),
        "slo_attainment": round(len(met) / len(rows), 3),
        "slo_met_per_s": round(len(met) / wall, 3),
        "wall_s": round(wall, 1),
        "all_finished": all(r["finish_reason"] in ("stop", "length") for r in rows),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default=None, help="HTTP host:port of a running server")
    p.add_argument("--model", default="bucketserve")
    p.add_argument("--topology", default="auto", help="without --url")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--conversations", type=int, default=4, help="run at once")
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--system-chars", type=int, default=2400, help="~650 SmolLM2 tokens")
    p.add_argument("--question-words", type=int, default=12, help="~20 tokens")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--slo-ttft", type=float, default=2.0, help="seconds")
    p.add_argument("--slo-tpot", type=float, default=0.15, help="seconds")
    args = p.parse_args(argv)
    if args.url:
        for seed in args.seeds:
            print(json.dumps(run_seed(args.url, args, seed, args.url)), flush=True)
        return 0
    caching_on_then_off(
        "multiturn-", lambda srv, label: [run_seed(srv.http_url, args, s, label) for s in args.seeds],
        topology=args.topology,
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
