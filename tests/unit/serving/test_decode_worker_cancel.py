"""Cancellation inside a decode (or colocated) instance at each stage it can reach: a hand-off
waiting for blocks, a prompt half prefilled in chunks, a decoding sequence. Each ends with one
FINAL `cancelled`, gives its prefill blocks back (hand-offs) and frees every decode block."""

from __future__ import annotations

import queue

import pytest
from bucketserve.engine.block_manager import BlockManager
from bucketserve.serving.core.decode_worker import DecodeWorker
from bucketserve.serving.core.kv_intake import KvIntake

from .test_decode_worker_memory import ContextRunner, handoff, no_shared_memory  # noqa: F401


@pytest.fixture
def acks(monkeypatch) -> list[int]:
    """Hand-off ids whose prefill blocks decode gave back."""
    seen: list[int] = []
    monkeypatch.setattr(KvIntake, "ack", lambda self, h: seen.append(h.handoff_id) or True)
    return seen


def worker_of(num_blocks: int = 64, **kw) -> tuple[DecodeWorker, BlockManager, queue.Queue]:
    blocks, outbox = BlockManager(num_blocks, 4), queue.Queue()
    worker = DecodeWorker(ContextRunner(4), blocks, None, None, outbox, 30.0, **kw)
    worker.publish = lambda: None
    return worker, blocks, outbox


def finals(outbox: queue.Queue) -> dict:
    out = {}
    while not outbox.empty():
        d = outbox.get_nowait()
        if d.finish_reason:
            assert d.key not in out, "one FINAL per request"
            out[d.key] = d
    return out


def drain(worker: DecodeWorker, outbox: queue.Queue, n: int) -> dict:
    ends: dict = {}
    for _ in range(1000):
        worker.iterate()
        ends |= finals(outbox)
        if len(ends) >= n:
            break
    return ends


def test_cancel_a_handoff_still_waiting_for_decode(acks):
    worker, blocks, outbox = worker_of(max_batch=1)
    for key in range(3):
        h = handoff([5 + key, 6, 7], max_tokens=20)
        h.handoff_id = 100 + key
        worker.submit(key, h)
    worker.iterate()  # key 0 runs; 1 and 2 wait with their KV still in the prefill pool
    assert len(worker.scheduler.waiting) == 2
    worker.cancel(2)
    ends = drain(worker, outbox, 3)
    assert ends[2].finish_reason == "cancelled" and ends[2].num_output_tokens == 0
    assert 102 in acks, "its prefill blocks go back without being copied"
    assert [ends[k].finish_reason for k in (0, 1)] == ["length", "length"]
    assert blocks.num_free_blocks == blocks.num_total_blocks


def test_cancel_a_prompt_halfway_through_its_chunked_prefill():
    worker, blocks, outbox = worker_of(token_budget=4)
    worker.submit(0, handoff(list(range(3, 43)), max_tokens=8, with_kv=False))
    worker.iterate()
    worker.iterate()
    seq = worker.streams[0].seq
    assert 0 < seq.num_computed_tokens < seq.num_prompt_tokens
    worker.cancel(0)
    ends = drain(worker, outbox, 1)
    assert ends[0].finish_reason == "cancelled" and ends[0].num_output_tokens == 0
    assert blocks.num_free_blocks == blocks.num_total_blocks and not worker.scheduler.has_work


@pytest.mark.parametrize("with_kv", [True, False])
def test_cancel_while_decoding_stops_at_once(with_kv):
    worker, blocks, outbox = worker_of()
    worker.submit(0, handoff([5, 6, 7], max_tokens=200, with_kv=with_kv))
    worker.submit(1, handoff([8, 9], max_tokens=6, with_kv=with_kv))
    for _ in range(4):
        worker.iterate()
    assert worker.streams[0].seq.num_completion_tokens > 1
    worker.cancel(0)
    worker.iterate()
    ends = finals(outbox)
    assert ends[0].finish_reason == "cancelled" and 1 < ends[0].num_output_tokens < 10
    assert 0 not in worker.streams
    ends |= drain(worker, outbox, 1) if 1 not in ends else {}
    assert ends[1].finish_reason == "length"
    assert blocks.num_free_blocks == blocks.num_total_blocks
