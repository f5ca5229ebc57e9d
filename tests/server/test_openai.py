"""The OpenAI-compatible front end, driven by the official `openai` package."""

from __future__ import annotations

import time

import openai
import pytest
import requests

from .helpers import generate, kv_blocks, openai_client, wait_all_blocks_free

pytestmark = pytest.mark.server

MODEL = "smollm2"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
FREE_BOUND_S = 5.0  # generous on a loaded 2-core machine: the measured time is printed


@pytest.fixture(scope="module")
def front(server):
    """The shared server with its OpenAI port; yields (server, openai client)."""
    return server, openai_client(server)


def test_models_and_metrics(front):
    server, client = front
    assert [m.id for m in client.models.list()] == [MODEL]
    base = f"http://{server.cfg.host}:{server.cfg.openai_port}"
    assert "bucketserve_kv_blocks_free" in requests.get(f"{base}/metrics", timeout=10).text


def test_greedy_chat_equals_triton_endpoint(front):
    server, client = front
    r = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=16, temperature=0)
    body = {"text_input": QUESTION[0]["content"], "max_tokens": 16, "temperature": 0.0,
            "apply_chat_template": True}  # fmt: skip
    triton = generate(server, body, model="bucketserve_bls").json()
    assert r.choices[0].message.content == triton["text_output"]
    assert "Paris" in r.choices[0].message.content
    assert r.usage.prompt_tokens == triton["num_input_tokens"]
    assert r.usage.completion_tokens == triton["num_output_tokens"]
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_streamed_chat_equals_whole_and_reports_usage(front):
    _, client = front
    whole = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=16, temperature=0)  # fmt: skip
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=QUESTION, max_tokens=16, temperature=0, stream=True,
        stream_options={"include_usage": True}))  # fmt: skip
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens  # fmt: skip


def test_completion_stream_and_stop(front):
    _, client = front
    whole = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=8, temperature=0)  # fmt: skip
    assert "Paris" in whole.choices[0].text and whole.usage.completion_tokens >= 1
    parts = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=8, temperature=0, stream=True)  # fmt: skip
    assert "".join(p.choices[0].text for p in parts) == whole.choices[0].text
    for stop in ("Paris", [" Paris", "never"]):
        cut = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=8, temperature=0, stop=stop)  # fmt: skip
        assert "Paris" not in cut.choices[0].text and cut.choices[0].finish_reason == "stop"


def test_same_seed_same_text(front):
    _, client = front
    texts = [
        client.completions.create(
            model=MODEL, prompt="Once upon a time", max_tokens=12, temperature=1.0, seed=s
        )
        .choices[0]
        .text  # fmt: skip
        for s in (1234, 1234, 99)
    ]
    assert texts[0] == texts[1]
    print(f"seed 1234: {texts[0]!r}; seed 99: {texts[2]!r}")


def test_logprobs(front):
    _, client = front
    r = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=8, temperature=0, logprobs=True, top_logprobs=3)  # fmt: skip
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for tok in content:
        assert tok.logprob <= 0 and len(tok.top_logprobs) == 3
        assert tok.top_logprobs[0].logprob >= tok.logprob - 1e-6  # greedy: the best one
    c = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=4, temperature=0, logprobs=2)  # fmt: skip
    lp = c.choices[0].logprobs
    assert len(lp.token_logprobs) == 4 and all(len(t) <= 2 for t in lp.top_logprobs)
    assert "".join(lp.tokens) == c.choices[0].text


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"n": 2}, "n"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({"response_format": {"type": "regex"}}, "response_format"),  # json_* are supported
        ({"top_logprobs": 21, "logprobs": True}, "top_logprobs"),
        ({"temperature": 3}, "temperature"),
        ({"max_tokens": 100000}, "max_tokens"),
    ],
)
def test_unsupported_fields_are_400_naming_the_field(front, kwargs, param):
    _, client = front
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=QUESTION, **kwargs)
    assert e.value.status_code == 400 and e.value.body["param"] == param


def test_unknown_model_is_404(front):
    _, client = front
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4o", messages=QUESTION)


def test_disconnect_mid_stream_frees_kv(front):
    server, client = front
    before = kv_blocks(server)
    stream = client.chat.completions.create(
        model=MODEL, messages=QUESTION, max_tokens=512, temperature=0, stream=True,
        extra_body={"min_tokens": 512})  # fmt: skip
    for n, _ in enumerate(stream):
        if n == 3:
            break
    # it is running: the pools' gauges are published periodically, so give them a moment
    deadline = time.monotonic() + 10
    while not any(free < total for free, total in kv_blocks(server).values()):
        assert time.monotonic() < deadline, kv_blocks(server)
        time.sleep(0.05)
    stream.close()
    waited, blocks = wait_all_blocks_free(server, timeout_s=30)
    print(f"KV blocks all free {waited:.2f} s after the client hung up (before: {before})")
    assert all(free == total for free, total in blocks.values()), blocks
    assert waited < FREE_BOUND_S
