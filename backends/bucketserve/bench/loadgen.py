"""Asyncio load generator: gRPC streaming (tritonclient.grpc.aio), one stream per request.

Open loop (send at given times, e.g. Poisson) or closed loop (fixed concurrency). Bounded in
request count and in time: nothing is sent after `duration_s`; requests still running
`drain_s` after the last send are cancelled and recorded as errors. Warm-up is untimed.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient

from bucketserve.bench import aio
from bucketserve.bench.records import RequestRecord
from bucketserve.bench.workloads import BenchRequest


@dataclass(slots=True)
class LoadConfig:
    """Where to send and how long; sampling is greedy unless temperature > 0."""

    url: str = "127.0.0.1:8001"
    model: str = "bucketserve"
    duration_s: float = 60.0
    max_requests: int = 1000
    drain_s: float = 120.0
    temperature: float = 0.0
    seed: int = 0
    # a prefix-cache namespace for the run: runs that resend the same prompts to one server
    # (a sweep's rates) must not find each other's KV cached ("": the server's default)
    cache_salt: str = ""

    def __post_init__(self) -> None:
        if self.duration_s <= 0 or self.drain_s <= 0:
            raise ValueError("duration_s and drain_s must be > 0")
        if self.max_requests < 1:
            raise ValueError(f"max_requests must be >= 1, got {self.max_requests}")


def _tensor(name: str, dtype: str, value) -> grpcclient.InferInput:
    arr = np.array([value], dtype=object if dtype == "BYTES" else None)
    if dtype != "BYTES":
        arr = arr.astype(
            {"INT32": np.int32, "FP32": np.float32, "BOOL": np.bool_, "UINT64": np.uint64}[dtype]
        )
    t = grpcclient.InferInput(name, [1], dtype)
    t.set_data_from_numpy(arr)
    return t


def make_inputs(req: BenchRequest, cfg: LoadConfig) -> list[grpcclient.InferInput]:
    """The tensors of one request: output length enforced by min_tokens = max_tokens."""
    salt = [_tensor("cache_salt", "BYTES", cfg.cache_salt.encode())] if cfg.cache_salt else []
    return salt + [
        _tensor("text_input", "BYTES", req.prompt.encode()),
        _tensor("max_tokens", "INT32", req.output_tokens),
        _tensor("min_tokens", "INT32", req.output_tokens),
        _tensor("stream", "BOOL", True),
        _tensor("temperature", "FP32", cfg.temperature),
        _tensor("seed", "UINT64", cfg.seed + req.idx),
        _tensor("exclude_input_in_output", "BOOL", True),
        _tensor("return_num_input_tokens", "BOOL", True),
        _tensor("return_num_output_tokens", "BOOL", True),
        _tensor("slo_class", "BYTES", req.slo_class.encode()),
        _tensor("ttft_slo_ms", "FP32", req.ttft_slo_s * 1000.0),
        _tensor("tpot_slo_ms", "FP32", req.tpot_slo_s * 1000.0),
    ]


def new_record(req: BenchRequest, rate: float, request_id: str) -> RequestRecord:
    return RequestRecord(
        req.idx,
        req.source,
        rate,
        0.0,
        req.input_tokens,
        req.output_tokens,
        req.ttft_slo_s,
        req.tpot_slo_s,
        error="not finished",
        request_id=request_id,
    )


def _scalar(result, name: str):
    arr = result.as_numpy(name)
    return None if arr is None or arr.size == 0 else arr.reshape(-1)[0]


def _is_final(result) -> bool:
    params = result.get_response().parameters
    return "triton_final_response" in params and params["triton_final_response"].bool_param


async def stream_one(
    client, req: BenchRequest, cfg: LoadConfig, rec: RequestRecord, t0: float
) -> None:
    """Send one request on its own stream and fill `rec` until the FINAL response."""
    inputs = make_inputs(req, cfg)

    async def one():
        yield {
            "model_name": cfg.model,
            "inputs": inputs,
            "request_id": rec.request_id,
            "parameters": {"triton_enable_empty_final_response": True},
        }

    start = time.perf_counter()
    rec.t_send_s = start - t0
    responses = client.stream_infer(one())
    try:
        async for result, error in responses:
            now = time.perf_counter() - start
            if error is not None:
                rec.error = str(error)
                return
            n_out, reason = _scalar(result, "num_output_tokens"), _scalar(result, "finish_reason")
            if n_out is not None:
                rec.add_chunk(now, int(n_out))
            if reason:
                rec.finish_reason = reason.decode() if isinstance(reason, bytes) else str(reason)
            n_in = _scalar(result, "num_input_tokens")
            if n_in is not None:
                rec.server_input_tokens = int(n_in)
            if _is_final(result):
                rec.finish(now)
                rec.error = (
                    "" if rec.output_tokens else f"no tokens ({rec.finish_reason or 'final'})"
                )
                return
    finally:
        responses.cancel()


async def stop_request(client, request_id: str, cfg: LoadConfig, timeout_s: float = 10.0) -> None:
    """Ask the server to stop `request_id` (`stop: true`, the TensorRT-LLM convention): a
    cancelled gRPC stream does not stop an ensemble step that is already running."""
    inputs = [
        _tensor("text_input", "BYTES", b"stop"),
        _tensor("max_tokens", "INT32", 1),
        _tensor("stop", "BOOL", True),
    ]

    async def one():
        yield {"model_name": cfg.model, "inputs": inputs, "request_id": request_id}

    responses = client.stream_infer(one())

    async def first() -> None:
        async for _ in responses:
            return

    try:
        await asyncio.wait_for(first(), timeout_s)
    except asyncio.TimeoutError:
        pass
    finally:
        responses.cancel()


async def _settle(
    client, tasks: list[asyncio.Task], records: list[RequestRecord], cfg: LoadConfig
) -> None:
    """Wait up to drain_s for running requests; stop them on the server, cancel, mark."""
    if not tasks:
        return
    _, pending = await asyncio.wait(tasks, timeout=cfg.drain_s)
    late = [rec.request_id for t, rec in zip(tasks, records, strict=True) if t in pending]
    await asyncio.gather(*(stop_request(client, rid, cfg) for rid in late), return_exceptions=True)
    for t in pending:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for task, rec in zip(tasks, records, strict=True):
        if task.cancelled() and rec.e2e_s is None:
            rec.error = f"unfinished after drain of {cfg.drain_s:g} s (stopped)"
        elif not task.cancelled() and task.exception() is not None:
            rec.error = f"{type(task.exception()).__name__}: {task.exception()}"


async def run_open_loop(
    reqs: list[BenchRequest], send_times: np.ndarray, rate: float, cfg: LoadConfig
) -> list[RequestRecord]:
    """Send reqs[i] at send_times[i] until duration_s or max_requests."""
    records, tasks = [], []
    tag = secrets.token_hex(4)
    async with aioclient.InferenceServerClient(cfg.url) as client:
        t0 = time.perf_counter()
        for req, ts in zip(reqs, send_times, strict=False):
            if ts > cfg.duration_s or len(tasks) >= cfg.max_requests:
                break
            await asyncio.sleep(max(0.0, t0 + float(ts) - time.perf_counter()))
            records.append(new_record(req, rate, f"{tag}-{len(records)}"))
            tasks.append(asyncio.create_task(stream_one(client, req, cfg, records[-1], t0)))
        await _settle(client, tasks, records, cfg)
    return records


async def run_closed_loop(
    reqs: list[BenchRequest], concurrency: int, cfg: LoadConfig
) -> list[RequestRecord]:
    """`concurrency` workers each send the next request (cycling reqs) as soon as one ends."""
    records: list[RequestRecord] = []
    tag = secrets.token_hex(4)
    async with aioclient.InferenceServerClient(cfg.url) as client:
        t0 = time.perf_counter()

        async def worker() -> None:
            while len(records) < cfg.max_requests and time.perf_counter() - t0 < cfg.duration_s:
                req = reqs[len(records) % len(reqs)]
                records.append(new_record(req, 0.0, f"{tag}-{len(records)}"))
                try:
                    await stream_one(client, req, cfg, records[-1], t0)
                except Exception as e:  # recorded, the worker goes on
                    records[-1].error = f"{type(e).__name__}: {e}"

        workers = [asyncio.create_task(worker()) for _ in range(concurrency)]
        _, pending = await asyncio.wait(workers, timeout=cfg.duration_s + cfg.drain_s)
        for w in pending:
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
    for rec in records:
        if rec.e2e_s is None and rec.error == "not finished":
            rec.error = "unfinished at the end of the run"
    return records


def warm_up(reqs: list[BenchRequest], cfg: LoadConfig, n: int = 4, concurrency: int = 2) -> None:
    """Untimed: a few requests so lazy initialisation is not measured; bounded by cfg.drain_s."""
    wcfg = LoadConfig(
        cfg.url,
        cfg.model,
        duration_s=0.1,  # the first `concurrency` requests go out at once, then no more
        max_requests=n,
        drain_s=cfg.drain_s,
        temperature=cfg.temperature,
        seed=cfg.seed,
    )
    records = aio.run(run_closed_loop(reqs, min(concurrency, n), wcfg))
    failed = [r.error for r in records if not r.ok]
    if failed:
        raise RuntimeError(f"warm-up failed: {failed[0]}")
