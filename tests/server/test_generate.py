"""The served model answers, streams, matches transformers, and returns every KV block."""

from __future__ import annotations

import concurrent.futures as cf

import pytest

from .helpers import generate, kv_blocks, stream_events, wait_all_blocks_free

pytestmark = pytest.mark.server

CAPITAL = {
    "text_input": "What is the capital of France?",
    "max_tokens": 16,
    "temperature": 0.0,
    "apply_chat_template": True,
}


@pytest.mark.parametrize("model", ["bucketserve", "bucketserve_bls"])
def test_generate_answers_paris(server, model):
    r = generate(server, CAPITAL, model=model)
    assert r.status_code == 200, r.text
    out = r.json()
    assert "Paris" in out["text_output"]
    assert out["finish_reason"] in ("stop", "length")
    assert out["num_input_tokens"] > 5 and out["num_output_tokens"] >= 1


def test_generate_stream_sends_deltas(server):
    events = stream_events(server, {**CAPITAL, "max_tokens": 24})
    assert len(events) >= 3, events
    assert all(e["finish_reason"] == "" for e in events[:-1])
    assert events[-1]["finish_reason"] in ("stop", "length")
    streamed = "".join(e["text_output"] for e in events)
    whole = generate(server, {**CAPITAL, "max_tokens": 24}).json()["text_output"]
    assert streamed == whole
    counts = [e["num_output_tokens"] for e in events]
    assert counts == sorted(counts)


def test_echo_prompt_when_not_excluded(server):
    out = generate(
        server,
        {
            "text_input": "Once upon a time",
            "max_tokens": 4,
            "temperature": 0.0,
            "exclude_input_in_output": False,
        },
    ).json()
    assert out["text_output"].startswith("Once upon a time")


def test_stop_words_cut_the_text(server):
    out = generate(server, {**CAPITAL, "stop_words": ["Paris"]}).json()
    assert "Paris" not in out["text_output"]
    assert out["finish_reason"] == "stop"


def test_seeded_sampling_is_reproducible(server):
    req = {
        "text_input": "Write a word:",
        "max_tokens": 12,
        "temperature": 1.0,
        "top_k": 50,
        "top_p": 0.9,
        "seed": 1234,
    }
    a = generate(server, req).json()["text_output"]
    b = generate(server, req).json()["text_output"]
    assert a == b


def test_64_concurrent_streams_finish_and_free_every_block(server):
    prompts = [f"Count from {i} to {i + 5}:" for i in range(64)]

    def one(i: int) -> list[dict]:
        return stream_events(
            server,
            {"text_input": prompts[i], "max_tokens": 24, "temperature": 0.0, "min_tokens": 8},
            timeout=600,
        )

    with cf.ThreadPoolExecutor(64) as pool:
        results = list(pool.map(one, range(64)))
    for events in results:
        assert events, "a stream returned no responses"
        assert events[-1]["finish_reason"] in ("stop", "length")
        assert events[-1]["num_output_tokens"] >= 8
    waited, blocks = wait_all_blocks_free(server, timeout_s=5.0)
    assert {"prefill0", "decode0"} <= set(blocks), blocks
    assert all(free == total for free, total in blocks.values()), blocks


def test_kv_metrics_report_both_instances(server):
    blocks = kv_blocks(server)
    assert blocks["prefill0"][1] > 0 and blocks["decode0"][1] > 0
