"""Abort at every stage: a request whose client goes away while it waits in a bucket (queued
behind long prompts), while its prompt is being prefilled or handed off, or while it decodes,
stops there — on every entry model, over HTTP, gRPC and the OpenAI routes. Each would decode
1,900 tokens if not stopped (~100 s at batch 1 on this CPU): every KV block back within
RETURN_BOUND_S of the last hang-up says the work stopped wherever it was."""

from __future__ import annotations

import inspect
import json
import socket
import threading
import time
import uuid

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from .helpers import generate, kv_blocks, wait_all_blocks_free

pytestmark = pytest.mark.server

LONG = 1900  # the test servers' max_model_len is 2048
RETURN_BOUND_S = 30.0  # a timeout, not a speed target: the measured time is printed
ENTRY_MODELS = ("bucketserve", "bucketserve_bls", "ensemble", "tensorrt_llm_bls")
# when each target is abandoned: at once (queued behind the fillers' prefill), a little later
# (in a prefill batch or its hand-off, or still queued), after its first token (decoding)
STAGES = ("queued", "prefill", "decoding")
PREFILL_DELAY_S = 1.0


def filler_prompt() -> str:
    """~1,500 tokens of Python source behind a unique first line (no prefix-cache hit): a
    prefill of ~2.5 s on the test servers that keeps the prefill instance busy."""
    import argparse

    return f"# {uuid.uuid4().hex}\n" + inspect.getsource(argparse)[:6000]


def start_fillers(server, n: int = 1) -> list[threading.Thread]:
    """Long prompts (one by default), one token each: the targets sent next queue behind
    their prefill or join its batch."""
    threads = [threading.Thread(target=generate, args=(server, {
        "text_input": filler_prompt(), "max_tokens": 1}), daemon=True) for _ in range(n)]  # fmt: skip
    for t in threads:
        t.start()
    time.sleep(0.3)  # the fillers reach the scheduler first
    return threads


def http_target(server, path: str, body: dict, stage: str, record: dict) -> None:
    """POST a streaming request on a raw socket; hang up at `stage`."""
    t0 = time.monotonic()
    doc = json.dumps(body).encode()
    host, port = server.http_url.split(":")
    s = socket.create_connection((host, int(port)))
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(doc)}\r\n\r\n".encode() + doc)  # fmt: skip
    if stage == "prefill":
        time.sleep(PREFILL_DELAY_S)
    elif stage == "decoding":
        s.settimeout(300)
        seen = b""
        while seen.count(b"data:") < 2:  # two events: it decodes
            chunk = s.recv(65536)
            if not chunk:
                break
            seen += chunk
        record["events"] = seen.count(b"data:")
    s.close()
    record.setdefault(stage, []).append(round(time.monotonic() - t0, 2))


def grpc_inputs(model: str) -> list:
    text = f"Tell a long story number {uuid.uuid4().hex[:6]}."
    if model in ("ensemble", "tensorrt_llm_bls"):  # TensorRT-LLM shapes: [1, 1]
        values = {"text_input": np.array([[text.encode()]], dtype=np.object_),
                  "max_tokens": np.array([[LONG]], dtype=np.int32),
                  "min_length": np.array([[LONG]], dtype=np.int32),
                  "stream": np.array([[True]], dtype=np.bool_)}  # fmt: skip
    else:
        params = {"max_tokens": LONG, "min_tokens": LONG, "temperature": 0}
        values = {"text_input": np.array([text.encode()], dtype=np.object_),
                  "stream": np.array([True], dtype=np.bool_),
                  "sampling_parameters": np.array([json.dumps(params).encode()],
                                                  dtype=np.object_)}  # fmt: skip
    dtype = {np.object_: "BYTES", np.int32: "INT32", np.bool_: "BOOL"}
    out = []
    for name, arr in values.items():
        t = grpcclient.InferInput(name, list(arr.shape), dtype[arr.dtype.type])
        t.set_data_from_numpy(arr)
        out.append(t)
    return out


def grpc_target(server, model: str, stage: str, record: dict) -> None:
    """One stream, one request; the client cancels the stream at `stage`."""
    t0 = time.monotonic()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    got = threading.Event()
    count = [0]

    def on_answer(result, error) -> None:
        count[0] += 1
        if count[0] >= 2 or error is not None:
            got.set()

    client.start_stream(callback=on_answer)
    client.async_stream_infer(model, grpc_inputs(model), enable_empty_final_response=True)
    if stage == "prefill":
        time.sleep(PREFILL_DELAY_S)
    elif stage == "decoding":
        got.wait(300)
        record["events"] = count[0]
    client.stop_stream(cancel_requests=True)
    client.close()
    record.setdefault(stage, []).append(round(time.monotonic() - t0, 2))


def run_cell(server, label: str, targets: list) -> None:
    """Fillers, then one target per stage, each abandoned at its stage; every block back."""
    fillers = start_fillers(server)
    record: dict = {}
    threads = [threading.Thread(target=fn, args=(*args, stage, record))
               for stage in STAGES for fn, args in targets]  # fmt: skip
    for t in threads:
        t.start()
    in_use = 0  # the gauges are live: the targets' blocks show while they run
    while any(t.is_alive() for t in threads):
        in_use = max(in_use, sum(total - free for free, total in kv_blocks(server).values()))
        time.sleep(0.05)
    for t in threads + fillers:
        t.join(timeout=300)
    waited, blocks = wait_all_blocks_free(server, timeout_s=RETURN_BOUND_S)
    hang_ups = {stage: record.get(stage) for stage in STAGES}
    print(f"\n{label}: hung up after {hang_ups} s; every KV block free {waited:.2f}s after the"
          f" last hang-up (at most {in_use} blocks were in use): {blocks}")  # fmt: skip
    assert all(free == total for free, total in blocks.values()), blocks
    assert record.get("events", 0) >= 2 and in_use > 0, (record, in_use)  # it did decode


@pytest.mark.parametrize("model", ENTRY_MODELS)
def test_http_abort_at_every_stage(server, model):
    body = {"text_input": "Tell a long story.", "max_tokens": LONG, "min_tokens": LONG,
            "stream": True}  # fmt: skip
    path = f"/v2/models/{model}/generate_stream"
    run_cell(server, f"HTTP {model}", [(http_target, (server, path, body))])


@pytest.mark.parametrize("model", ENTRY_MODELS)
def test_grpc_abort_at_every_stage(server, model):
    run_cell(server, f"gRPC {model}", [(grpc_target, (server, model))])


def test_openai_abort_at_every_stage(server):
    chat = {"model": "smollm2", "messages": [{"role": "user", "content": "Tell a long story."}],
            "max_tokens": LONG, "min_tokens": LONG, "stream": True}  # fmt: skip
    completion = {"model": "smollm2", "prompt": "Once upon a time", "max_tokens": LONG,
                  "min_tokens": LONG, "stream": True}  # fmt: skip
    run_cell(server, "OpenAI", [(http_target, (server, "/v1/chat/completions", chat)),
                                (http_target, (server, "/v1/completions", completion))])  # fmt: skip
