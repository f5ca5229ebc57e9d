"""The client and CLI against a real tritonserver (SmolLM2 on CPU): answers, streams, cancellation."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

import pytest
import requests
from bucketserve_client import AsyncClient, Client, GenerationError
from bucketserve_client.cli import main

from tests.server.helpers import wait_all_blocks_free

pytestmark = pytest.mark.server
QUESTION = "What is the capital of France?"
LONG_PROMPT = "Write a very long story about a dragon who learns to cook."
MODELS = ("bucketserve", "bucketserve_bls")


def cancelled_count(server) -> float:
    """Requests that finished with finish_reason "cancelled", over all engine instances."""
    lines = requests.get(server.metrics_url, timeout=10).text.splitlines()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in lines
        if line.startswith("bucketserve_requests_total{") and 'finish_reason="cancelled"' in line
    )


def wait_cancelled(server, before: float, timeout_s: float = 5.0) -> float:
    """Poll until the cancelled-request counter passes `before`; returns its last value."""
    deadline = time.monotonic() + timeout_s
    while (count := cancelled_count(server)) <= before and time.monotonic() < deadline:
        time.sleep(0.05)
    return count


def assert_all_blocks_free(server) -> None:
    """Every instance's bucketserve_kv_blocks_free equals its total within 5 s."""
    waited, blocks = wait_all_blocks_free(server, timeout_s=5.0)
    assert blocks, "no bucketserve_kv_blocks_* samples on the metrics page"
    assert all(free == total for free, total in blocks.values()), (waited, blocks)


def test_cli_generate_answers_paris(server, capsys):
    code = main(
        ["generate", QUESTION, "--max-tokens", "16", "--temperature", "0", "--url", server.grpc_url]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "Paris" in out


@pytest.mark.parametrize("model", MODELS)
def test_stream_concatenation_equals_generate(server, model):
    client = Client(server.grpc_url, model)
    params = {"max_tokens": 24, "temperature": 0.0, "apply_chat_template": True}
    chunks = list(client.stream(QUESTION, **params))
    completion = client.generate(QUESTION, **params)
    assert len(chunks) > 1
    assert "".join(c.text for c in chunks) == completion.text
    assert chunks[-1].finish_reason == completion.finish_reason in ("stop", "length")
    assert chunks[-1].num_output_tokens == completion.num_output_tokens > 0
    assert completion.num_input_tokens > 0 and 0 < completion.ttft_s <= completion.latency_s


def test_async_client_eight_concurrent_streams(server):
    async def one(client: AsyncClient, i: int) -> tuple[str, str, int]:
        parts, last = [], None
        async for chunk in client.stream(
            f"Count from {i} to {i + 5}.", max_tokens=16, temperature=0.0, apply_chat_template=True
        ):
            parts.append(chunk.text)
            last = chunk
        return "".join(parts), last.finish_reason, last.num_output_tokens

    async def run():
        async with AsyncClient(server.grpc_url) as client:
            return await asyncio.wait_for(asyncio.gather(*(one(client, i) for i in range(8))), 300)

    results = asyncio.run(run())
    assert len(results) == 8
    for text, reason, n_out in results:
        assert text and reason in ("stop", "length") and 0 < n_out <= 16


@pytest.mark.parametrize("model", MODELS)
def test_early_break_cancels_and_frees_kv(server, model):
    before, threads = cancelled_count(server), threading.active_count()
    client = Client(server.grpc_url, model)
    stream = client.stream(
        LONG_PROMPT, max_tokens=512, min_tokens=512, temperature=0.0, apply_chat_template=True
    )
    for i, _chunk in enumerate(stream):
        if i == 2:
            break
    start = time.monotonic()
    stream.close()
    assert time.monotonic() - start < 10.0
    assert wait_cancelled(server, before) > before  # the server saw the cancel ...
    assert_all_blocks_free(server)  # ... and gave every KV block back
    assert threading.active_count() <= threads  # no gRPC thread left behind by the cancel


def test_async_early_exit_on_the_ensemble(server):
    before = cancelled_count(server)

    async def run():
        async with AsyncClient(server.grpc_url) as client:
            chunks = client.stream(LONG_PROMPT, max_tokens=512, min_tokens=512)
            async with contextlib.aclosing(chunks):
                async for _ in chunks:
                    break

    asyncio.run(run())
    assert wait_cancelled(server, before) > before
    assert_all_blocks_free(server)


def test_server_error_names_the_field(server):
    with pytest.raises(GenerationError, match="max_tokens"):
        Client(server.grpc_url).generate(QUESTION, max_tokens=1_000_000)
