"""Prefix caching on a real server, in both topologies: a shared ~1,000-token prefix is
computed once; later requests report their cached tokens (v2 `num_cached_tokens`, OpenAI
`usage.prompt_tokens_details.cached_tokens`), answer exactly what an uncached run answers,
salts isolate tenants, the counters count, and every block comes back free or evictable."""

from __future__ import annotations

import inspect
import json.decoder
import uuid

import pytest
import requests

from .helpers import generate, metric_value, wait_all_blocks_free

pytestmark = pytest.mark.server

SYSTEM = inspect.getsource(json.decoder)[:3600]  # ~1,000 tokens shared by every request
QUESTIONS = ["What does scanstring do?", "Name one exception defined here."]
FREE_BOUND_S = 10.0


def ask(server, question: str, salt: str) -> dict:
    payload = {"text_input": f"{SYSTEM}\nQ: {question}\nA:", "max_tokens": 8,
               "temperature": 0.0, "cache_salt": salt}  # fmt: skip
    r = generate(server, payload)
    assert r.status_code == 200, r.text
    return r.json()


def check_prefix_cache(server) -> None:
    salt = uuid.uuid4().hex  # nothing else on this server shares it: the first run is cold
    hits_before = metric_value(server, "bucketserve_prefix_cache_hits_total")
    first = ask(server, QUESTIONS[0], salt)
    assert first["num_cached_tokens"] == 0 and first["num_input_tokens"] > 900
    again = ask(server, QUESTIONS[0], salt)  # a full hit: only the last block is recomputed
    assert again["text_output"] == first["text_output"]
    assert first["num_input_tokens"] - 16 <= again["num_cached_tokens"] < first["num_input_tokens"]
    other = ask(server, QUESTIONS[1], salt)  # the shared prefix, a different question
    assert other["num_cached_tokens"] >= 900
    uncached = ask(server, QUESTIONS[1], uuid.uuid4().hex)  # another tenant: computed afresh
    assert uncached["num_cached_tokens"] == 0
    assert other["text_output"] == uncached["text_output"]
    cached = again["num_cached_tokens"] + other["num_cached_tokens"]
    assert metric_value(server, "bucketserve_prefix_cache_hits_total") - hits_before >= cached
    waited, blocks = wait_all_blocks_free(server, FREE_BOUND_S)
    assert all(free == total for free, total in blocks.values()), blocks
    print(f"prefix cache: {cached} tokens reused; all blocks free after {waited:.2f} s")


def test_disaggregated_prefill_instance_caches(server):
    check_prefix_cache(server)
    assert metric_value(server, "bucketserve_prefix_cache_queries_total") > 0


def test_colocated_instance_caches(colocated):
    check_prefix_cache(colocated)


def test_openai_usage_reports_cached_tokens(colocated):
    url = f"http://{colocated.cfg.host}:{colocated.cfg.openai_port}/v1/chat/completions"
    body = {"model": "smollm2", "max_tokens": 4, "temperature": 0,
            "messages": [{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": QUESTIONS[0]}],
            "cache_salt": uuid.uuid4().hex}  # fmt: skip
    details = []
    for _ in range(2):
        r = requests.post(url, json=body, timeout=300)
        assert r.status_code == 200, r.text
        details.append(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])
    assert details[0] == 0 and details[1] >= 900
