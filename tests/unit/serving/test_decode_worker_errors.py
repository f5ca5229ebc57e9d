"""The decode loop survives a failing step or KV pull: each affected request gets a FINAL
error, its blocks go back, and the worker keeps serving."""

from __future__ import annotations

import queue
from types import SimpleNamespace

import pytest
from bucketserve.engine.block_manager import BlockManager
from bucketserve.engine.sampler import SampleOutput
from bucketserve.engine.sampling_params import SamplingParams
from bucketserve.engine.sequence import Sequence
from bucketserve.serving.config import ServeConfig
from bucketserve.serving.contract import GenerateParams
from bucketserve.serving.core.decode_stream import Stream
from bucketserve.serving.core.decode_worker import DecodeWorker
from bucketserve.serving.core.messages import KIND_GENERATE, Handoff


class FlakyRunner:
    """Fails its first decode step, then returns token 7 for every sequence."""

    model_config = SimpleNamespace(eos_token_ids=(2,), max_model_len=4096)

    def __init__(self) -> None:
        self.calls = 0

    def step_sampled(self, decodes, chunks):
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        rows = decodes + [c.seq for c in chunks if c.is_last]
        return SampleOutput([7] * len(rows), [None] * len(rows))


def make_worker(run: ServeConfig | None = None):
    blocks, outbox = BlockManager(32, 4), queue.Queue()
    worker = DecodeWorker(FlakyRunner(), blocks, None, None, outbox, timeout_s=5.0, run=run)
    return worker, blocks, outbox


def running_stream(worker: DecodeWorker, key: int) -> Stream:
    """A request decoding on `worker` (its prompt's KV computed, blocks held)."""
    params = SamplingParams(max_tokens=8)
    seq = Sequence([1, 2, 3, 4, 5], params, seq_id=key, num_computed_tokens=4)
    text = SimpleNamespace(push=lambda token: ("x", False), flush=lambda: "")  # detokenizer stub
    s = Stream(key, Handoff(KIND_GENERATE, GenerateParams(sampling=params)), seq=seq, text=text)
    s.first_sent = True
    worker.streams[key] = s
    worker.scheduler.add(seq)
    return s


def drain(outbox: queue.Queue) -> list:
    items = []
    while not outbox.empty():
        items.append(outbox.get_nowait())
    return items


def test_failed_step_finishes_the_batch_with_errors():
    worker, blocks, outbox = make_worker()
    worker.publish = lambda: None
    running_stream(worker, 1), running_stream(worker, 2)
    worker.iterate()
    finals = drain(outbox)
    assert [(d.key, d.finish_reason) for d in finals] == [(1, "error"), (2, "error")]
    assert all("decode step failed: RuntimeError: CUDA error" in d.error for d in finals)
    assert worker.scheduler.running == [] and blocks.num_free_blocks == 32
    running_stream(worker, 3)  # the next batch runs normally
    worker.iterate()
    (delta,) = drain(outbox)
    assert (delta.key, delta.text, delta.finish_reason, delta.num_output_tokens) == (3, "x", "", 1)


@pytest.mark.parametrize("prefill_index", [0, 5])  # 0: its pool never published; 5: not in the run
def test_failed_pull_fails_that_request_only(tmp_path, prefill_index):
    worker, blocks, outbox = make_worker(ServeConfig(run_dir=str(tmp_path), run_id="t1"))
    params = GenerateParams(sampling=SamplingParams(max_tokens=4), num_input_tokens=3)
    bad = Handoff(KIND_GENERATE, params, prompt_ids=[1, 2, 3], first_token=5,
                  prefill_index=prefill_index, block_ids=[0])  # fmt: skip
    worker.publish = lambda: None
    worker.submit(9, bad)
    worker.iterate()
    (final,) = drain(outbox)
    assert (final.key, final.finish_reason) == (9, "error")
    assert final.error.startswith("decode could not pull the KV: ")
    assert not worker.scheduler.has_work
    assert blocks.num_free_blocks == 32
