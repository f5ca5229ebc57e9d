"""The colocated topology on a real server: every instance runs fused iterations (running
decodes' tokens plus prompt chunks), no KV hand-off. Same answers as disaggregated, streaming,
cancellation with every block back, placement over two instances."""

from __future__ import annotations

import concurrent.futures as cf
import inspect
import json
import threading
import urllib.request

import pytest

from .conftest import start_server
from .helpers import generate, kv_blocks, metric_value, stream_events, wait_all_blocks_free
from .test_cancel import assert_blocks_return, check_stop_requests, start_streams
from .test_placement import counts, payload

pytestmark = pytest.mark.server

CAPITAL = {"text_input": "What is the capital of France?", "max_tokens": 16,
           "temperature": 0.0, "apply_chat_template": True}  # fmt: skip


def long_prompt() -> str:
    """~1,500 tokens of Python source (the stdlib's argparse)."""
    import argparse

    return inspect.getsource(argparse)[:6400]


@pytest.mark.parametrize("model", ["bucketserve", "bucketserve_bls"])
def test_colocated_answers_paris(colocated, model):
    r = generate(colocated, CAPITAL, model=model)
    assert r.status_code == 200, r.text
    assert "Paris" in r.json()["text_output"]


def test_the_default_runs_two_colocated_instances_and_no_prefill_model(colocated):
    blocks = kv_blocks(colocated)
    assert set(blocks) == {"decode0", "decode1"}, blocks  # auto: one per CPU entry of both roles
    assert colocated.cfg.topology == "colocated"


def test_colocated_openai_chat(colocated):
    body = {"model": "smollm2", "max_tokens": 16, "temperature": 0,
            "messages": [{"role": "user", "content": "What is the capital of France?"}]}  # fmt: skip
    req = urllib.request.Request(
        f"http://127.0.0.1:{colocated.cfg.openai_port}/v1/chat/completions",
        data=json.dumps(body).encode(), headers={"Content-Type": "application/json"},
    )  # fmt: skip
    reply = json.loads(urllib.request.urlopen(req, timeout=120).read())
    assert "Paris" in reply["choices"][0]["message"]["content"]
    assert reply["usage"]["prompt_tokens"] > 20


def test_colocated_stream_equals_whole(colocated):
    events = stream_events(colocated, {**CAPITAL, "max_tokens": 24})
    assert len(events) > 1 and events[-1]["finish_reason"] in ("stop", "length")
    whole = generate(colocated, {**CAPITAL, "max_tokens": 24}).json()["text_output"]
    assert "".join(e["text_output"] for e in events) == whole


def test_long_prompt_in_chunks_beside_a_decode_equals_disaggregated(colocated, server):
    """A 1,500-token prompt prefilled in 32-token chunks while other requests decode (one on
    each instance, so wherever the prompt lands its iterations are mixed) gives the same greedy
    tokens as the disaggregated server."""
    long_req = {"text_input": long_prompt(), "max_tokens": 16, "temperature": 0.0}
    side_req = {**CAPITAL, "max_tokens": 96, "min_tokens": 96}
    expected_long = generate(server, long_req).json()
    expected_side = generate(server, side_req).json()["text_output"]
    assert expected_long["num_input_tokens"] >= 1400
    mixed_before = metric_value(colocated, "bucketserve_mixed_iterations_total")
    sides = len(kv_blocks(colocated))
    texts: list[str] = []
    started = [threading.Event() for _ in range(sides)]

    def run_side(i: int) -> None:
        events = []
        for event in iter_stream(colocated, side_req):
            events.append(event)
            started[i].set()
        texts.append("".join(e["text_output"] for e in events))

    threads = [threading.Thread(target=run_side, args=(i,)) for i in range(sides)]
    for t, ev in zip(threads, started, strict=True):
        t.start()
        assert ev.wait(120)  # decoding before the next is sent: least loaded spreads them
    got = generate(colocated, long_req).json()
    for t in threads:
        t.join(300)
    assert got["text_output"] == expected_long["text_output"]
    assert texts == [expected_side] * sides
    assert metric_value(colocated, "bucketserve_mixed_iterations_total") > mixed_before
    waited, blocks = wait_all_blocks_free(colocated, timeout_s=10)
    assert all(free == total for free, total in blocks.values()), blocks


def iter_stream(server, payload: dict):
    """SSE events of one generate_stream call, as they arrive."""
    import requests

    url = f"http://{server.http_url}/v2/models/bucketserve/generate_stream"
    with requests.post(url, json={**payload, "stream": True}, timeout=300, stream=True) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith(b"data: "):
                yield json.loads(line[len(b"data: ") :])


@pytest.mark.parametrize("model", ["bucketserve_bls"])
def test_colocated_grpc_cancel_returns_every_block(colocated, model):
    client, col, ids = start_streams(colocated, model)
    client.stop_stream(cancel_requests=True)
    client.close()
    assert_blocks_return(colocated, f"gRPC cancel ({model}, colocated)")


def test_colocated_stop_request_on_ensemble(colocated):
    check_stop_requests(colocated, "stop request (ensemble, colocated)")


@pytest.fixture(scope="module")
def colocated_2(tmp_path_factory):
    srv = start_server(tmp_path_factory, model="dummy:tiny", topology="colocated",
                       decode_devices=["cpu", "cpu"], kv_cache_gb=0.05, chunk_tokens=128,
                       preprocessing_instances=1)  # fmt: skip
    yield srv
    srv.stop()


def test_colocated_placement_over_two_instances(colocated_2):
    srv = colocated_2
    # the reference run under its own cache salt: otherwise the instance that served it holds
    # every prompt, and prefix-aware placement rightly sends all eight there
    sequential = [generate(srv, payload(i) | {"cache_salt": "reference"}).json()["text_output"]
                  for i in range(8)]  # fmt: skip
    before = counts(srv)
    with cf.ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda i: generate(srv, payload(i)).json(), range(8)))
    assert [r["text_output"] for r in together] == sequential
    after = counts(srv)
    placed = {i: after["placed"].get(i, 0) - before["placed"].get(i, 0) for i in after["placed"]}
    done = {i: after["instance"].get(i, 0) - before["instance"].get(i, 0) for i in placed}
    assert set(placed) == {"decode0", "decode1"}, placed
    assert sum(placed.values()) == 8 and placed == done
    assert min(placed.values()) >= 1, placed  # both instances got work
    waited, blocks = wait_all_blocks_free(srv, timeout_s=10)
    assert all(free == total for free, total in blocks.values()), blocks
