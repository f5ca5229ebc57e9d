"""Streaming overhead of the OpenAI front end: the same requests, the same closed-loop load,
once through Triton's gRPC streaming (bucketserve_bls) and once through /v1/completions SSE
(which itself streams from bucketserve_bls), alternating A-B-A-B so host drift shows up.

    .venv/bin/python perf/front/openai_overhead.py --grpc 127.0.0.1:8001 --openai http://127.0.0.1:9000/v1
Prints one JSON line per round and a summary table (ratios OpenAI / gRPC per round pair).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import numpy as np
import openai
import tritonclient.grpc.aio as grpcaio
from tritonclient.grpc import InferInput


def prompts(n: int) -> list[str]:
    return [f"Write a short story about a lighthouse keeper and a lost ship, part {i}." for i in range(n)]  # fmt: skip


def _tensor(name, value, dtype, np_dtype):
    t = InferInput(name, [1], dtype)
    t.set_data_from_numpy(np.array([value], dtype=np_dtype))
    return t


async def grpc_one(client, text: str, n_out: int) -> tuple[float, float, int]:
    """(ttft, e2e, output tokens) of one streamed request over gRPC."""
    params = json.dumps({"max_tokens": n_out, "min_tokens": n_out, "temperature": 0})
    inputs = [_tensor("text_input", text.encode(), "BYTES", np.object_),
              _tensor("stream", True, "BOOL", np.bool_),
              _tensor("sampling_parameters", params.encode(), "BYTES", np.object_)]  # fmt: skip
    done = asyncio.Event()

    async def reqs():
        yield {"model_name": "bucketserve_bls", "inputs": inputs}
        await done.wait()

    start, ttft, n = time.perf_counter(), None, 0
    async for result, error in client.stream_infer(reqs()):
        if error is not None:
            raise RuntimeError(error)
        if ttft is None and result.as_numpy("text_output")[0]:
            ttft = time.perf_counter() - start
        n = int(result.as_numpy("num_output_tokens")[0])
        if result.as_numpy("finish_reason")[0]:
            break
    done.set()
    return ttft, time.perf_counter() - start, n


async def openai_one(client, text: str, n_out: int) -> tuple[float, float, int]:
    """(ttft, e2e, output tokens) of one streamed /v1/completions request."""
    start, ttft, n = time.perf_counter(), None, 0
    stream = await client.completions.create(
        model="smollm2", prompt=text, max_tokens=n_out, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"min_tokens": n_out})  # fmt: skip
    async for chunk in stream:
        if ttft is None and chunk.choices and chunk.choices[0].text:
            ttft = time.perf_counter() - start
        if chunk.usage is not None:
            n = chunk.usage.completion_tokens
    return ttft, time.perf_counter() - start, n


async def closed_loop(one, texts: list[str], concurrency: int, n_out: int) -> dict:
    queue = list(texts)
    results = []

    async def worker():
        while queue:
            results.append(await one(queue.pop(0), n_out))

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    span = time.perf_counter() - start
    ttfts = [r[0] for r in results]
    return {"requests": len(results), "tokens_per_s": sum(r[2] for r in results) / span,
            "ttft_mean_s": statistics.mean(ttfts), "ttft_p50_s": statistics.median(ttfts),
            "e2e_mean_s": statistics.mean(r[1] for r in results)}  # fmt: skip


async def main(a) -> None:
    grpc = grpcaio.InferenceServerClient(a.grpc)
    oai = openai.AsyncOpenAI(base_url=a.openai, api_key="unused", timeout=600)
    paths = {"grpc": lambda t, n: grpc_one(grpc, t, n), "openai": lambda t, n: openai_one(oai, t, n)}  # fmt: skip
    for one in paths.values():  # warm-up, untimed
        await closed_loop(one, prompts(2), 2, 4)
    rounds = []
    for r in range(a.rounds):
        for name, one in paths.items():
            row = {"round": r, "path": name, **await closed_loop(one, prompts(a.requests), a.concurrency, a.output_tokens)}  # fmt: skip
            print(json.dumps(row), flush=True)
            rounds.append(row)
    summarize(rounds)
    await grpc.close()


def summarize(rows: list[dict]) -> None:
    g = [r for r in rows if r["path"] == "grpc"]
    o = [r for r in rows if r["path"] == "openai"]
    tps = [b["tokens_per_s"] / a["tokens_per_s"] for a, b in zip(g, o, strict=True)]
    ttft = [b["ttft_mean_s"] / a["ttft_mean_s"] for a, b in zip(g, o, strict=True)]
    print("| path | tokens/s (mean of rounds) | TTFT mean (s) | TTFT p50 (s) |")
    print("| --- | --- | --- | --- |")
    for name, rs in (("gRPC streaming", g), ("OpenAI SSE", o)):
        print(f"| {name} | {statistics.mean(r['tokens_per_s'] for r in rs):.1f} | "
              f"{statistics.mean(r['ttft_mean_s'] for r in rs):.3f} | "
              f"{statistics.mean(r['ttft_p50_s'] for r in rs):.3f} |")  # fmt: skip
    print(f"OpenAI/gRPC tokens/s per round: {[round(x, 3) for x in tps]}; "
          f"TTFT: {[round(x, 3) for x in ttft]}")  # fmt: skip


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--grpc", default="127.0.0.1:8001")
    p.add_argument("--openai", default="http://127.0.0.1:9000/v1")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--output-tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    asyncio.run(main(p.parse_args()))
