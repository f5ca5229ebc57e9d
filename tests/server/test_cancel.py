"""Cancelling long generations mid-stream stops decoding and returns every KV block."""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from .helpers import kv_blocks, streams_that_leave, wait_all_blocks_free

pytestmark = pytest.mark.server

N = 16
LONG = 512  # min_tokens = max_tokens: 16 of them take ~30 s to finish on this CPU if not stopped
# A timeout, not a speed target (the measured time is printed; 0.1-0.3 s measured): a third of
# what the streams would take to finish on their own, so it tells stopped from finished.
RETURN_BOUND_S = 10.0


def inputs(text: str, stream: bool = True, stop: bool = False, tokens: int = LONG) -> list:
    values = [
        ("text_input", np.array([text.encode()], dtype=np.object_), "BYTES"),
        ("max_tokens", np.int32([tokens]), "INT32"),
        ("min_tokens", np.int32([tokens]), "INT32"),
        ("stream", np.bool_([stream]), "BOOL"),
        ("stop", np.bool_([stop]), "BOOL"),
    ]
    out = []
    for name, arr, dtype in values:
        t = grpcclient.InferInput(name, [1], dtype)
        t.set_data_from_numpy(arr)
        out.append(t)
    return out


class Collector:
    """gRPC stream callback: counts responses per request id, records finals and errors."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.finals: list[tuple[str, str]] = []  # (request id, finish reason)
        self.errors: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, result, error) -> None:
        with self.lock:
            if error is not None:
                self.errors.append(str(error))
                return
            resp = result.get_response()
            self.counts[resp.id] = self.counts.get(resp.id, 0) + 1
            if resp.parameters["triton_final_response"].bool_param:
                reason = result.as_numpy("finish_reason") if resp.outputs else None
                self.finals.append((resp.id, reason[0].decode() if reason is not None else ""))

    def wait_started(self, ids: list[str], timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if all(self.counts.get(i, 0) >= 2 for i in ids):
                    return
            time.sleep(0.05)
        raise AssertionError(f"streams did not start: {self.counts}")


def start_streams(
    server, model: str, tokens: int = LONG
) -> tuple[grpcclient.InferenceServerClient, Collector, list[str]]:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    col = Collector()
    client.start_stream(callback=col)
    ids = [f"cancel-{uuid.uuid4().hex[:8]}" for _ in range(N)]
    for i, rid in enumerate(ids):
        client.async_stream_infer(
            model,
            inputs(f"Tell a long story number {i}.", tokens=tokens),
            request_id=rid,
            enable_empty_final_response=True,
        )
    col.wait_started(ids)
    assert_blocks_in_use(server)
    return client, col, ids


def assert_blocks_in_use(server) -> None:
    """The gauges must show the running streams' blocks, so a later "all free" is fresh."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if kv_blocks(server)["decode0"][0] < kv_blocks(server)["decode0"][1]:
            return
        time.sleep(0.05)
    raise AssertionError(f"decode blocks never showed in use: {kv_blocks(server)}")


def assert_blocks_return(server, label: str, n: int = N) -> None:
    waited, blocks = wait_all_blocks_free(server, timeout_s=RETURN_BOUND_S)
    print(f"{label}: all KV blocks free {waited:.2f}s after cancelling {n} requests: {blocks}")
    assert all(free == total for free, total in blocks.values()), blocks


def test_grpc_cancel_on_bls(server):
    client, col, _ = start_streams(server, "bucketserve_bls")
    client.stop_stream(cancel_requests=True)
    client.close()
    assert_blocks_return(server, "gRPC cancel (bucketserve_bls)")


@pytest.mark.parametrize("model", ["bucketserve_bls", "bucketserve"])
def test_http_disconnect(server, model):
    """The front stops a request whose HTTP client left (a `stop` request with its id), so
    decoding ends on the ensemble too (Triton cancels a running ensemble step only between
    steps: docs/platform-notes.md#p19-ensemble-cancellation-stops-between-steps)."""
    url = f"http://{server.http_url}/v2/models/{model}/generate_stream"
    payloads = [{"text_input": f"Tell a long story number {i}.", "max_tokens": LONG,
                 "min_tokens": LONG} for i in range(N)]  # fmt: skip
    streams_that_leave(url, payloads, while_held=lambda: assert_blocks_in_use(server))
    assert_blocks_return(server, f"HTTP disconnect ({model})")


@pytest.mark.parametrize(
    ("path", "body"),
    [("/v2/models/bucketserve/generate", {"text_input": "Tell a long story."}),
     ("/v1/completions", {"model": "smollm2", "prompt": "Tell a long story."})],
)  # fmt: skip
def test_http_disconnect_before_a_whole_answer(server, path, body):
    """A non-streamed request whose client hangs up is stopped the same way (the edge
    watches the connection while it collects the answer), v2 and OpenAI alike."""
    doc = json.dumps({**body, "max_tokens": LONG, "min_tokens": LONG}).encode()
    host, port = server.http_url.split(":")
    socks = []
    for _ in range(4):
        s = socket.create_connection((host, int(port)))
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(doc)}\r\n\r\n".encode() + doc)  # fmt: skip
        socks.append(s)
    deadline = time.monotonic() + 120
    while kv_blocks(server)["decode0"][0] == kv_blocks(server)["decode0"][1]:
        assert time.monotonic() < deadline, kv_blocks(server)
        time.sleep(0.1)
    for s in socks:
        s.close()
    assert_blocks_return(server, f"HTTP disconnect before a whole answer ({path})", len(socks))


def test_stop_request_on_ensemble(server):
    check_stop_requests(server, "stop request (ensemble)")


def check_stop_requests(server, label: str, tokens: int = LONG) -> None:
    """N streams on the ensemble, each stopped by a `stop` request with its id: every block
    comes back, and each id sees two FINALs (the stream and the stop), both "cancelled"."""
    client, col, ids = start_streams(server, "bucketserve", tokens=tokens)
    for rid in ids:
        client.async_stream_infer("bucketserve", inputs("stop", stop=True), request_id=rid,
                                  enable_empty_final_response=True)  # fmt: skip
    assert_blocks_return(server, label)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(col.finals) < 2 * len(ids):
        time.sleep(0.05)
    client.stop_stream()
    client.close()
    assert not col.errors, col.errors
    assert sorted(rid for rid, _ in col.finals) == sorted(ids * 2), col.finals
    assert all(reason == "cancelled" for _, reason in col.finals), col.finals


def test_blocks_total_unchanged(server):
    blocks = kv_blocks(server)
    assert all(total > 0 for _, total in blocks.values()), blocks
