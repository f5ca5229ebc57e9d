"""The decode worker under KV pressure: on-demand growth, preemption with recompute, detached
hand-offs, and a busy error only for a request that can never fit."""

from __future__ import annotations

import queue
from types import SimpleNamespace

import pytest
from bucketserve.engine.block_manager import BlockManager
from bucketserve.engine.sampler import SampleOutput
from bucketserve.engine.sampling_params import SamplingParams
from bucketserve.serving.contract import GenerateParams
from bucketserve.serving.core import decode_worker as dw
from bucketserve.serving.core.decode_worker import DecodeWorker
from bucketserve.serving.core.kv_intake import KvIntake
from bucketserve.serving.core.messages import KIND_GENERATE, Handoff


def next_token(ids: list[int]) -> int:
    """A deterministic 'model': the next token depends on the whole context, so a recompute
    that lost or reordered any token would change every later token."""
    return 3 + (sum(i * (k + 1) for k, i in enumerate(ids)) % 40)


class ContextRunner:
    """Greedy fake engine; checks that every step sees KV blocks for every stored token."""

    model_config = SimpleNamespace(eos_token_ids=(2,), max_model_len=4096)
    pool, device = None, "cpu"

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.prefills = 0  # prompt chunks run
        self.mixed = 0  # steps with decodes and chunks

    def _check(self, seq) -> None:
        assert len(seq.block_table) * self.block_size >= seq.num_tokens, "KV slot missing"

    def step_sampled(self, decodes, chunks):
        self.prefills += len(chunks)
        self.mixed += bool(decodes and chunks)
        for s in decodes:
            self._check(s)
            assert s.num_computed_tokens == s.num_tokens - 1, "decode over missing KV"
        for c in chunks:
            self._check(c.seq)
            assert c.start == c.seq.num_computed_tokens, "chunk does not continue its prefix"
        rows = decodes + [c.seq for c in chunks if c.is_last]
        return SampleOutput([next_token(s.token_ids) for s in rows], [None] * len(rows))


class Words:
    """Detokenizer stand-in: one word per token."""

    def __init__(self, tokenizer, stop_words) -> None:
        pass

    def push(self, token: int):
        return f"{token} ", False

    def flush(self) -> str:
        return ""


@pytest.fixture(autouse=True)
def no_shared_memory(monkeypatch):
    """Hand-offs without a prefill instance: the copy and the ack always succeed."""
    monkeypatch.setattr(dw, "TextStream", Words)
    monkeypatch.setattr(KvIntake, "copy", lambda self, h, table: None)
    monkeypatch.setattr(KvIntake, "ack", lambda self, h: True)


def handoff(prompt: list[int], max_tokens: int, with_kv: bool = True) -> Handoff:
    """A prefill hand-off (KV in a prefill pool), or a bare prompt (colocated)."""
    params = GenerateParams(
        sampling=SamplingParams(max_tokens=max_tokens), num_input_tokens=len(prompt)
    )
    if not with_kv:
        return Handoff(KIND_GENERATE, params, prompt_ids=prompt)
    return Handoff(KIND_GENERATE, params, prompt_ids=prompt, first_token=next_token(prompt),
                   prefill_index=0, block_ids=list(range(-(-len(prompt) // 4))))  # fmt: skip


def run(num_blocks: int, prompts: list[list[int]], max_tokens: int, timeout_s: float = 30.0,
        with_kv: bool = True, token_budget: int = 4096, caching: bool = False):  # fmt: skip
    blocks, outbox = BlockManager(num_blocks, 4, enable_caching=caching), queue.Queue()
    worker = DecodeWorker(ContextRunner(4), blocks, None, None, outbox, timeout_s, watermark=0.0,
                          token_budget=token_budget)  # fmt: skip
    worker.publish = lambda: None
    for key, prompt in enumerate(prompts):
        worker.submit(key, handoff(prompt, max_tokens, with_kv))
    texts: dict[int, str] = {}
    finals = {}
    for _ in range(10_000):
        worker.iterate()
        while not outbox.empty():
            d = outbox.get_nowait()
            texts[d.key] = texts.get(d.key, "") + d.text
            if d.finish_reason:
                finals[d.key] = d
        if len(finals) == len(prompts):
            break
    return worker, blocks, texts, finals


PROMPTS = [[5, 6, 7, 8, 9], [11, 12, 13], [21, 22, 23, 24, 25, 26, 27], [31]]


def test_small_pool_preempts_and_recomputes_with_identical_output():
    _, _, reference, ref_finals = run(64, PROMPTS, max_tokens=12)
    worker, blocks, texts, finals = run(9, PROMPTS, max_tokens=12)  # 4 x up to 5 blocks each
    assert worker.num_preemptions > 0 and worker.num_recomputed_tokens > 0
    assert texts == reference
    assert {k: (d.finish_reason, d.num_output_tokens) for k, d in finals.items()} == {
        k: ("length", 12) for k in range(4)
    }
    assert blocks.num_free_blocks == 9 and ref_finals.keys() == finals.keys()


def test_request_that_can_never_fit_gets_a_busy_error_others_run():
    worker, blocks, texts, finals = run(4, [[1, 2, 3], [4, 5, 6]], max_tokens=30)
    assert all(
        d.busy and "exceeds the decode KV cache (16 tokens)" in d.error for d in finals.values()
    )
    worker, blocks, texts, finals = run(8, [[1, 2, 3], list(range(3, 40))], max_tokens=4)
    assert finals[0].finish_reason == "length" and not finals[0].busy
    assert finals[1].busy and finals[1].finish_reason == "error"
    assert blocks.num_free_blocks == 8


def test_stale_handoff_is_detached_and_recomputed_not_failed():
    """With a zero hand-off timeout every waiting hand-off is detached at once: the first
    token goes out, the prefill blocks are given back, and decode rebuilds the KV itself."""
    _, _, reference, _ = run(64, PROMPTS, max_tokens=6)
    worker, blocks, texts, finals = run(64, PROMPTS, max_tokens=6, timeout_s=0.0)
    assert worker.runner.prefills >= 1 and worker.num_recomputed_tokens > 0
    assert texts == reference and all(d.finish_reason == "length" for d in finals.values())
    assert blocks.num_free_blocks == 64


def test_decode_batch_cap():
    blocks, outbox = BlockManager(64, 4), queue.Queue()
    worker = DecodeWorker(ContextRunner(4), blocks, None, None, outbox, 30.0, max_batch=2)
    worker.publish = lambda: None
    for key, prompt in enumerate(PROMPTS):
        worker.submit(key, handoff(prompt, 50))
    worker.iterate()
    assert len(worker.scheduler.running) == 2 and len(worker.scheduler.waiting) == 2


LONG = [list(range(3, 3 + n)) for n in (1, 9, 23, 40)]


@pytest.mark.parametrize("budget", [4, 7, 64])
def test_colocated_prompts_chunked_fused_with_decodes_give_the_same_text(budget):
    """Bare prompts prefilled here in chunks of the token budget, fused with the running
    decodes, produce exactly what prefill hand-offs produce; nothing leaks."""
    _, _, reference, ref_finals = run(64, LONG, max_tokens=8)
    worker, blocks, texts, finals = run(64, LONG, max_tokens=8, with_kv=False, token_budget=budget)
    assert texts == reference
    assert {k: d.num_output_tokens for k, d in finals.items()} == {k: 8 for k in range(4)}
    assert worker.runner.prefills > len(LONG) or budget == 64  # long prompts ran in pieces
    assert worker.runner.mixed > 0 and blocks.num_free_blocks == 64


def test_colocated_prompts_under_preemption_keep_their_text():
    _, _, reference, _ = run(64, LONG, max_tokens=10)
    worker, blocks, texts, _ = run(14, LONG, max_tokens=10, with_kv=False, token_budget=8)
    assert worker.num_preemptions > 0 and texts == reference
    assert blocks.num_free_blocks == 14


SHARED = [list(range(3, 24)) + [50 + i] * (i + 1) for i in range(4)] + [list(range(3, 24))] * 2


@pytest.mark.parametrize(("num_blocks", "budget"), [(64, 64), (64, 5), (16, 8)])
def test_colocated_prefix_cache_same_text_cached_counts_and_no_leak(num_blocks, budget):
    """Prompts sharing a 21-token prefix, one iteration after another: the later ones prefill
    only their suffix, report the cached tokens, give the same text; every block comes back
    free (or cached and evictable) whatever the pressure."""
    _, _, reference, _ = run(64, SHARED, max_tokens=6, with_kv=False)
    worker, blocks, texts, finals = run(num_blocks, SHARED, max_tokens=6, with_kv=False,
                                        token_budget=budget, caching=True)  # fmt: skip
    assert texts == reference
    assert 0 < sum(d.num_cached_tokens for d in finals.values()) <= blocks.num_hit_tokens
    assert all(d.num_cached_tokens % 4 == 0 for d in finals.values())
    assert blocks.num_free_blocks == num_blocks and not any(blocks._ref)


def test_handoff_reports_the_prefill_side_cached_tokens():
    h = handoff([5, 6, 7, 8, 9], 3)
    h.num_cached_tokens = 4
    blocks, outbox = BlockManager(16, 4, enable_caching=True), queue.Queue()
    worker = DecodeWorker(ContextRunner(4), blocks, None, None, outbox, 30.0, watermark=0.0)
    worker.publish = lambda: None
    worker.submit(0, h)
    finals = []
    while not finals:
        worker.iterate()
        finals = [d for d in list(outbox.queue) if d.finish_reason]
    assert finals[0].num_cached_tokens == 4
    assert blocks.num_cached_blocks == 1  # the copied prompt's full block joined the cache
