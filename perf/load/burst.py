"""Burst check: N concurrent long `generate` requests against the default server.

Starts the default server (SmolLM2 on CPU, policy bucketserve, `--topology auto`: one colocated
instance per --prefill / --decode CPU entry, two by default; `--topology disaggregated` makes
them prefill and decode instances) on free ports unless --url is given, fires every burst at once, and prints per
burst: served / failed (with HTTP status and message), wall time, output tokens, preemptions
and recomputed tokens (from /metrics, the difference over the burst), and whether every KV
block came back afterwards. Seeded (each request's `seed` is base seed + index).

With --shared-prefix-chars every prompt starts with one shared system prompt (prefix caching's
case); --cancel-every K makes every K-th request a stream the client drops after its first
tokens; --no-prefix-caching and --kv-cache-gb configure the started server. Run the same burst
with caching on and off to see that caching adds no busy answer or failure, and that afterwards
every block is free or evictable (cached prefixes count as free: nothing references them).

    nice -n 10 .venv/bin/python perf/load/burst.py --bursts 24,64 --max-tokens 1800
    nice -n 10 .venv/bin/python perf/load/burst.py --bursts 16 --max-tokens 256 --decode 2  # smoke
    nice -n 10 .venv/bin/python perf/load/burst.py --bursts 32 --max-tokens 400 \
        --shared-prefix-chars 4000 --cancel-every 4 --kv-cache-gb 0.25 [--no-prefix-caching]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import sys
import time

import requests
from bucketserve.bench.local import local_server
from bucketserve.serving.launch.ports import free_port

PROMPTS = (
    "Write a long, detailed story about a lighthouse keeper who finds a map.",
    "Explain, step by step and at length, how a compiler turns source code into a program.",
    "Describe a journey across a desert, day by day, with every detail you can imagine.",
    "Write an essay on the history of mathematics, from counting to calculus.",
)
COUNTERS = ("bucketserve_preemptions_total", "bucketserve_recomputed_tokens_total",
            "bucketserve_prefix_cache_hits_total", "bucketserve_prefix_cache_evictions_total")  # fmt: skip


def metric(text: str, name: str, instance: str | None = None) -> float:
    """Sum of one metric's samples (optionally of one instance) in a Prometheus scrape."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and (instance is None or f'"{instance}"' in line):
            total += float(line.rsplit(" ", 1)[1])
    return total


def shared_prefix(chars: int) -> str:
    """~chars / 4 tokens of Python source every prompt starts with ("" for none)."""
    import inspect
    import json.decoder

    return inspect.getsource(json.decoder)[:chars] + "\n" if chars else ""


def one(url: str, i: int, args) -> dict:
    body = {"text_input": shared_prefix(args.shared_prefix_chars) + PROMPTS[i % len(PROMPTS)],
            "max_tokens": args.max_tokens, "temperature": args.temperature,
            "seed": args.seed + i}  # fmt: skip
    if args.cancel_every and i % args.cancel_every == args.cancel_every - 1:
        return dropped(url, i, body, args)
    start = time.monotonic()
    r = requests.post(f"http://{url}/v2/models/{args.model}/generate", json=body, timeout=3600)
    out = {"status": r.status_code, "seconds": time.monotonic() - start}
    data = r.json()
    out |= {"tokens": data["num_output_tokens"]} if r.ok else {"error": data.get("error", r.text)}
    print(json.dumps({"request": i, **out}), file=sys.stderr, flush=True)  # progress
    return out


def dropped(url: str, i: int, body: dict, args, events: int = 3) -> dict:
    """A stream the client hangs up on after `events` events (the server must cancel it)."""
    start, seen, status = time.monotonic(), 0, 0
    endpoint = f"http://{url}/v2/models/{args.model}/generate_stream"
    with requests.post(endpoint, json={**body, "stream": True}, timeout=3600, stream=True) as r:
        status = r.status_code
        for line in r.iter_lines():
            seen += line.startswith(b"data: ")
            if seen >= events:
                break
    out = {"status": status, "seconds": time.monotonic() - start, "cancelled": True}
    out |= {"tokens": 0} if status == 200 else {"error": f"stream answered {status}"}
    print(json.dumps({"request": i, **out}), file=sys.stderr, flush=True)  # progress
    return out


def kv_back(metrics_url: str, timeout_s: float = 60.0) -> tuple[bool, str]:
    end = time.monotonic() + timeout_s
    while True:
        text = requests.get(metrics_url, timeout=10).text
        free = metric(text, "bucketserve_kv_blocks_free")
        total = metric(text, "bucketserve_kv_blocks_total")
        if (free == total and total > 0) or time.monotonic() > end:
            return free == total, f"{free:.0f}/{total:.0f}"
        time.sleep(0.25)


def burst(url: str, metrics_url: str, n: int, args) -> dict:
    before = requests.get(metrics_url, timeout=10).text
    start = time.monotonic()
    with cf.ThreadPoolExecutor(n) as pool:
        results = list(pool.map(lambda i: one(url, i, args), range(n)))
    wall = time.monotonic() - start
    ok, blocks = kv_back(metrics_url)
    after = requests.get(metrics_url, timeout=10).text
    served = [r for r in results if r["status"] == 200 and not r.get("cancelled")]
    cancelled = sum(1 for r in results if r.get("cancelled") and r["status"] == 200)
    row = {"concurrency": n, "served": len(served), "cancelled": cancelled,
           "failed": n - len(served) - cancelled,
           "wall_s": round(wall, 1), "output_tokens": sum(r["tokens"] for r in served),
           "tokens_per_s": round(sum(r["tokens"] for r in served) / wall, 1),
           "kv_free_after": blocks, "kv_all_back": ok,
           "kv_blocks_cached_after": metric(after, "bucketserve_kv_blocks_cached")}  # fmt: skip
    for name in COUNTERS:
        row[name.removeprefix("bucketserve_")] = metric(after, name) - metric(before, name)
    row["errors"] = sorted({f"{r['status']}: {r['error']}" for r in results if "error" in r})
    return row


def start_server(args):
    """The default server, or with --serve-model / --topology / --prefill / --decode changed."""
    return local_server(
        "burst-", model=args.serve_model, openai_port=free_port(), topology=args.topology,
        prefill_devices=["cpu"] * args.prefill, decode_devices=["cpu"] * args.decode,
        enable_prefix_caching=not args.no_prefix_caching,
        **({"kv_cache_gb": args.kv_cache_gb} if args.kv_cache_gb else {}),
    ).start_ready()  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default=None, help="HTTP host:port of a running server")
    p.add_argument("--metrics-url", default=None, help="with --url: http://host:port/metrics")
    p.add_argument("--model", default="bucketserve")
    p.add_argument("--bursts", default="24,64", help="comma-separated concurrencies")
    p.add_argument("--max-tokens", type=int, default=1800)
    p.add_argument("--temperature", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--serve-model", default="smollm2", help="without --url: the model to serve")
    p.add_argument("--topology", default="auto", help="without --url: the server's --topology")
    p.add_argument("--prefill", type=int, default=1, help="without --url: CPU prefill entries")
    p.add_argument("--decode", type=int, default=1, help="without --url: CPU decode entries")
    p.add_argument("--shared-prefix-chars", type=int, default=0, help="a shared system prompt")
    p.add_argument("--cancel-every", type=int, default=0, help="every K-th request dropped")
    p.add_argument("--no-prefix-caching", action="store_true", help="without --url")
    p.add_argument("--kv-cache-gb", type=float, default=None, help="without --url")
    args = p.parse_args(argv)
    server = None if args.url else start_server(args)
    url = args.url or server.http_url
    metrics_url = args.metrics_url or server.metrics_url
    try:
        warm = {**vars(args), "max_tokens": 4, "cancel_every": 0, "shared_prefix_chars": 0}
        one(url, 0, argparse.Namespace(**warm))  # untimed, shares no prefix
        for n in (int(x) for x in args.bursts.split(",")):
            print(json.dumps(burst(url, metrics_url, n, args)), flush=True)
    finally:
        if server is not None:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
