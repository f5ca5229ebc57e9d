"""The hybrid topology on a real server: colocated instances whose prompt-token budgets the
scheduler's role controller sets, and decodes that move between instances through the KV
hand-off. A moved decode answers exactly as one that stayed (greedy text, counts, log-probs,
stop strings, streaming, both entry models); a client that leaves mid-move gets every block
back; the budgets are in the metrics, and the adaptive controller changes them when the
binding SLO changes."""

from __future__ import annotations

import concurrent.futures as cf
import json
import re
import time

import pytest
import requests

from .conftest import free_port, start_server
from .helpers import (
    generate,
    metric_value,
    openai_client,
    stream_events,
    streams_that_leave,
    wait_all_blocks_free,
)

pytestmark = pytest.mark.server

MOVE = {"tpot_slo_ms": 0.001}  # no step meets this: a decode leaves at the first check
STAY = {"tpot_slo_ms": 1e6}
PROMPTS = [
    "Write a short poem about the sea.",
    "List three uses of copper.",
    "Explain what a hash table is in two sentences.",
    "What is the capital of France?",
]


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    """Two instances in the fixed split layout: decode0 prefill-heavy, decode1 decode-only."""
    srv = start_server(tmp_path_factory, topology="hybrid", hybrid_layout=1,
                       openai_port=free_port())  # fmt: skip
    yield srv
    srv.stop()


def body(prompt: str, **extra) -> dict:
    return {"text_input": prompt, "max_tokens": 40, "temperature": 0.0,
            "apply_chat_template": True, **extra}  # fmt: skip


def budgets(server) -> dict[str, float]:
    text = requests.get(server.metrics_url, timeout=10).text
    found = re.findall(r'^bucketserve_instance_token_budget\{instance="(\w+)"\} (\S+)$', text, re.M)
    return {inst: float(v) for inst, v in found}


def layout(server) -> float:
    return metric_value(server, "bucketserve_hybrid_layout")


@pytest.mark.parametrize("model", ["bucketserve", "bucketserve_bls"])
def test_hybrid_answers_paris(hybrid, model):
    r = generate(hybrid, body("What is the capital of France?", max_tokens=16), model=model)
    assert r.status_code == 200, r.text
    assert "Paris" in r.json()["text_output"]


def test_budgets_and_layout_are_in_the_metrics(hybrid):
    deadline = time.monotonic() + 10
    while budgets(hybrid) != {"decode0": 2048.0, "decode1": 0.0}:
        assert time.monotonic() < deadline, budgets(hybrid)
        time.sleep(0.1)
    assert layout(hybrid) == 1


@pytest.mark.parametrize("model", ["bucketserve", "bucketserve_bls"])
def test_a_moved_decode_answers_as_one_that_stayed(hybrid, model):
    moved_before = metric_value(hybrid, "bucketserve_migrations_out_total")
    for prompt in PROMPTS:
        stayed = generate(hybrid, body(prompt, **STAY), model=model).json()
        moved = generate(hybrid, body(prompt, **MOVE), model=model).json()
        for key in ("text_output", "finish_reason", "num_output_tokens", "num_input_tokens"):
            assert moved[key] == stayed[key], (prompt, key, moved, stayed)
    deadline = time.monotonic() + 5  # decode publishes its counters every 0.25 s
    while metric_value(hybrid, "bucketserve_migrations_out_total") < moved_before + len(PROMPTS):
        assert time.monotonic() < deadline, "the tight-TPOT requests did not move"
        time.sleep(0.1)
    assert metric_value(hybrid, "bucketserve_migrations_in_total") >= len(PROMPTS)
    waited, blocks = wait_all_blocks_free(hybrid, timeout_s=10)
    assert all(free == total for free, total in blocks.values()), blocks


@pytest.mark.parametrize("model", ["bucketserve", "bucketserve_bls"])
def test_a_moved_stream_is_the_whole_answer(hybrid, model):
    prompt = PROMPTS[0]
    whole = generate(hybrid, body(prompt, **STAY), model=model).json()["text_output"]
    events = stream_events(hybrid, body(prompt, **MOVE), model=model)
    assert len(events) > 1
    assert "".join(e["text_output"] for e in events) == whole
    assert events[-1]["finish_reason"] == "length" and events[-1]["num_output_tokens"] == 40


def test_log_probs_and_echo_survive_the_move(hybrid):
    extra = {"return_log_probs": True, "exclude_input_in_output": False}
    stayed = generate(hybrid, body(PROMPTS[1], **STAY, **extra)).json()
    moved = generate(hybrid, body(PROMPTS[1], **MOVE, **extra)).json()
    assert moved["text_output"] == stayed["text_output"]
    assert stayed["text_output"].count("List three uses") == 1  # the echoed prompt, once
    n = stayed["num_output_tokens"]
    assert len(moved["output_log_probs"]) == len(stayed["output_log_probs"]) == n > 1
    assert moved["output_log_probs"] == pytest.approx(stayed["output_log_probs"], abs=1e-3)
    assert moved["cum_log_probs"] == pytest.approx(stayed["cum_log_probs"], abs=1e-2)


def test_a_stop_string_after_the_move_ends_it(hybrid):
    whole = generate(hybrid, body(PROMPTS[2], **STAY)).json()["text_output"]
    words = [w for w in whole.split()[len(whole.split()) // 2 :] if len(w) > 3]
    word = words[0]  # a word well after the first tokens (the move happens at the first)
    stayed = generate(hybrid, body(PROMPTS[2], stop_words=[word], **STAY)).json()
    moved = generate(hybrid, body(PROMPTS[2], stop_words=[word], **MOVE)).json()
    assert moved["text_output"] == stayed["text_output"] == whole[: whole.index(word)]
    assert moved["finish_reason"] == "stop"


def test_concurrent_moves_lose_nothing(hybrid):
    with cf.ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(generate, hybrid, body(f"Tell story number {i}.", **MOVE,
                                                      max_tokens=32, min_tokens=32))
                   for i in range(12)]  # fmt: skip
        replies = [f.result() for f in futures]
    assert all(r.status_code == 200 for r in replies), [r.text for r in replies]
    assert all(r.json()["num_output_tokens"] == 32 for r in replies)
    waited, blocks = wait_all_blocks_free(hybrid, timeout_s=10)
    assert all(free == total for free, total in blocks.values()), blocks


@pytest.mark.parametrize("model", ["bucketserve", "bucketserve_bls"])
def test_clients_that_leave_during_moves_free_every_block(hybrid, model):
    url = f"http://{hybrid.http_url}/v2/models/{model}/generate_stream"
    payloads = [body(f"Tell a long story number {i}.", max_tokens=400, min_tokens=400, **MOVE)
                for i in range(6)]  # fmt: skip
    streams_that_leave(url, payloads)
    waited, blocks = wait_all_blocks_free(hybrid, timeout_s=10)
    print(f"hybrid disconnect ({model}): all KV blocks free {waited:.2f}s after: {blocks}")
    assert all(free == total for free, total in blocks.values()), blocks


def test_openai_chat_on_hybrid(hybrid):
    reply = openai_client(hybrid).chat.completions.create(
        model="smollm2", max_tokens=16, temperature=0,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
    )  # fmt: skip
    assert "Paris" in reply.choices[0].message.content


def test_the_prefill_heavy_instance_caches_prefixes(hybrid):
    prompt = "Summarize: " + " ".join(f"item {i} is on shelf {i % 7};" for i in range(120))
    first = generate(hybrid, body(prompt, max_tokens=8)).json()
    second = generate(hybrid, body(prompt + " And the last one?", max_tokens=8)).json()
    # (the chat template's system prompt may be cached from earlier requests already)
    assert second["num_cached_tokens"] >= first["num_cached_tokens"] + 512, (first, second)


def test_a_guided_decode_stays_and_validates(hybrid):
    import jsonschema
    from bucketserve.bench.schemas import PERSON

    r = generate(hybrid, body("Describe a person as JSON.", max_tokens=200, **MOVE,
                              sampling_parameters=json.dumps({"guided_json": PERSON})))  # fmt: skip
    assert r.status_code == 200, r.text
    jsonschema.validate(json.loads(r.json()["text_output"]), PERSON)


def test_adaptive_roles_follow_the_binding_slo(tmp_path_factory):
    """The controller splits the instances when TPOT is what misses (decode interference) and
    goes back to every instance mixed when TTFT misses (too little prefill)."""
    srv = start_server(tmp_path_factory, topology="hybrid", hybrid_period_s=1.0)
    try:
        wait_layout(srv, 0)
        assert all(b > 0 for b in budgets(srv).values()), budgets(srv)  # all mixed
        drive(srv, {"tpot_slo_ms": 0.001, "ttft_slo_ms": 1e6}, want_layout=1)
        deadline = time.monotonic() + 30
        while budgets(srv) != {"decode0": 2048.0, "decode1": 0.0}:  # the instances follow
            assert time.monotonic() < deadline, budgets(srv)
            time.sleep(0.1)
        drive(srv, {"tpot_slo_ms": 1e6, "ttft_slo_ms": 0.001}, want_layout=0)
        assert metric_value(srv, "bucketserve_role_changes_total") >= 2
        waited, blocks = wait_all_blocks_free(srv, timeout_s=10)
        assert all(free == total for free, total in blocks.values()), blocks
    finally:
        srv.stop()


def wait_layout(server, want: int) -> None:
    """Until the scheduler reports `want` and both instances their budgets (published every
    0.25 / 0.5 s; a loaded CI machine may take longer)."""
    deadline = time.monotonic() + 60
    # (an instance's budget gauge reads 0 until its first report: all mixed = all above 0)
    while (
        layout(server) != want
        or set(budgets(server)) != {"decode0", "decode1"}
        or (want == 0 and not all(b > 0 for b in budgets(server).values()))
    ):
        assert time.monotonic() < deadline, (layout(server), budgets(server))
        time.sleep(0.1)


def drive(server, slo: dict, want_layout: int, timeout_s: float = 300) -> None:
    """Short requests with these SLOs, six at a time, until the layout is `want_layout`."""
    deadline = time.monotonic() + timeout_s
    with cf.ThreadPoolExecutor(6) as pool:
        while layout(server) != want_layout:
            assert time.monotonic() < deadline, f"layout stayed {layout(server)}"
            batch = [pool.submit(generate, server, body(f"Count to {i}.", max_tokens=8, **slo))
                     for i in range(6)]  # fmt: skip
            assert all(f.result().status_code == 200 for f in batch)
