"""SchedulerCore without Triton: placement honoured, prefill instances in parallel, errors."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
from bucketserve.engine.block_hash import block_hashes
from bucketserve.engine.sampling_params import SamplingParams
from bucketserve.scheduling import ClusterView, InstanceStats, SchedulerConfig, make_scheduler
from bucketserve.scheduling.prefix_index import PrefixIndex
from bucketserve.serving.contract import GenerateParams
from bucketserve.serving.core.messages import KIND_GENERATE, PrefillReply, PrefillResult
from bucketserve.serving.core.scheduler_core import SchedulerCore, instance_index


class Cluster:
    """Stats of N prefill and M decode instances; prefill free blocks fixed, decode large."""

    def __init__(self, num_prefill: int, num_decode: int, decode_blocks: int = 4096) -> None:
        self.num_prefill, self.num_decode, self.decode_blocks = (
            num_prefill,
            num_decode,
            decode_blocks,
        )

    def view(self) -> ClusterView:
        def st(role: str, i: int, total: int) -> InstanceStats:
            return InstanceStats(f"{role}{i}", role, total, total, 16, 0, 0.01, 1000)

        return ClusterView(
            [st("prefill", i, 4096) for i in range(self.num_prefill)],
            [st("decode", i, self.decode_blocks) for i in range(self.num_decode)],
        )


class Recorder:
    """The injected Triton side: records hand-offs, errors, prefill calls with timestamps."""

    def __init__(self, prefill_s: float = 0.0) -> None:
        self.prefill_s = prefill_s
        self.lock = threading.Lock()
        self.handoffs: list = []
        self.errors: list = []
        self.calls: list[tuple[int, float, float, int]] = []  # index, start, end, size
        self.placed: list[tuple[str, str, int]] = []

    def prefill(self, index: int, items) -> PrefillReply:
        start = time.monotonic()
        time.sleep(self.prefill_s)
        with self.lock:
            self.calls.append((index, start, time.monotonic(), len(items)))
        results = [PrefillResult(7, [0], k) for k in range(len(items))]
        return PrefillReply(index, results, self.prefill_s)

    def send_handoff(self, sender, handoff) -> None:
        with self.lock:
            self.handoffs.append((sender, handoff))

    def send_error(self, sender, message: str, busy: bool) -> None:
        with self.lock:
            self.errors.append((sender, message, busy))

    def metrics(self):
        def placed(p: str, d: str, n: int) -> None:
            self.placed.append((p, d, n))

        return SimpleNamespace(decision=lambda *a: None, batch=lambda *a: None, placed=placed)


def make_core(rec: Recorder, cluster: Cluster, prefix_index=None, **cfg) -> SchedulerCore:
    sched_cfg = SchedulerConfig(max_model_len=2048, block_size=16, **cfg)
    sched = make_scheduler("fcfs", sched_cfg, time.monotonic)
    core = SchedulerCore(sched, cluster.view, rec.prefill, rec.send_handoff, rec.send_error,
                         cluster.num_prefill, rec.metrics(), prefix_index=prefix_index)  # fmt: skip
    core.start()
    return core


def wait_for(cond, timeout_s: float = 10.0) -> None:
    end = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.005)


def test_instance_index():
    assert instance_index("prefill12") == 12 and instance_index("decode0") == 0


def test_two_prefill_instances_run_batches_at_the_same_time():
    rec = Recorder(prefill_s=0.3)
    core = make_core(rec, Cluster(2, 2), max_prefill_tokens=8)  # one 8-token request per batch
    try:
        for i in range(4):
            core.add(
                f"s{i}", list(range(1, 9)), GenerateParams(sampling=SamplingParams(max_tokens=4))
            )
        wait_for(lambda: len(rec.handoffs) == 4)
    finally:
        core.close()
    assert {c[0] for c in rec.calls} == {0, 1}
    first, second = sorted(rec.calls, key=lambda c: c[1])[:2]
    assert first[0] != second[0] and second[1] < first[2], "the two batches did not overlap"


def test_handoffs_carry_the_placement_the_scheduler_counted():
    rec = Recorder()
    core = make_core(rec, Cluster(2, 2), decode_balance="round_robin")
    try:
        for i in range(6):
            core.add(f"s{i}", [1, 2, 3], GenerateParams(sampling=SamplingParams(max_tokens=4)))
            wait_for(lambda i=i: len(rec.handoffs) == i + 1)
    finally:
        core.close()
    assert all(h.kind == KIND_GENERATE for _, h in rec.handoffs)
    by_decode = {}
    for _, h in rec.handoffs:
        by_decode[h.decode_index] = by_decode.get(h.decode_index, 0) + 1
    placed = {}
    for _, d, n in rec.placed:
        placed[instance_index(d)] = placed.get(instance_index(d), 0) + n
    assert by_decode == placed == {0: 3, 1: 3}
    # the prefill that ran each batch is the one the scheduler chose
    assert sorted(p for p, _, _ in rec.placed) == sorted(f"prefill{c[0]}" for c in rec.calls)


def test_request_that_never_fits_any_decode_pool_gets_busy():
    rec = Recorder()
    core = make_core(rec, Cluster(1, 1, decode_blocks=4))  # 64 tokens
    try:
        core.add("big", list(range(1, 40)), GenerateParams(sampling=SamplingParams(max_tokens=40)))
        core.add("ok", list(range(1, 10)), GenerateParams(sampling=SamplingParams(max_tokens=10)))
        wait_for(lambda: rec.errors and rec.handoffs)
    finally:
        core.close()
    ((sender, message, busy),) = rec.errors
    assert sender == "big" and busy and "exceeds the decode KV cache (64 tokens)" in message
    assert [s for s, _ in rec.handoffs] == ["ok"]


def test_failed_prefill_answers_every_request_and_frees_the_instance():
    rec = Recorder()
    calls = []

    rec_prefill = rec.prefill

    def flaky(index, items):
        calls.append(index)
        if len(calls) == 1:
            raise RuntimeError("prefill failed: boom")
        return rec_prefill(index, items)

    rec.prefill = flaky
    core = make_core(rec, Cluster(1, 1))
    try:
        core.add("a", [1, 2], GenerateParams(sampling=SamplingParams(max_tokens=2)))
        wait_for(lambda: rec.errors)
        core.add("b", [1, 2], GenerateParams(sampling=SamplingParams(max_tokens=2)))
        wait_for(lambda: rec.handoffs)
    finally:
        core.close()
    assert rec.errors == [("a", "prefill failed: boom", False)]
    assert [s for s, _ in rec.handoffs] == ["b"] and calls == [0, 0]


def test_close_returns_the_queued_requests():
    rec = Recorder()
    core = make_core(rec, Cluster(1, 1))
    core.view = lambda: None  # instances never ready: requests stay queued
    core.add("q", [1, 2], GenerateParams(sampling=SamplingParams(max_tokens=2)))
    pending = core.close()
    assert [p.sender for p in pending] == ["q"] and not rec.handoffs


class ColocatedCluster:
    """Colocated instances whose published intake counters and prompt backlog a test sets."""

    def __init__(self, num: int) -> None:
        self.received = [0] * num
        self.backlog = [0] * num

    def view(self) -> ClusterView:
        stats = [
            InstanceStats(f"decode{i}", "decode", 4096, 4096, 16, 0, 0.01, 1000,
                          num_received=self.received[i], prefill_backlog=self.backlog[i])
            for i in range(len(self.received))
        ]  # fmt: skip
        return ClusterView([], stats)


def test_colocated_sends_prompts_without_prefill_and_waits_for_intake():
    rec, cluster = Recorder(), ColocatedCluster(1)
    sched = make_scheduler("fcfs", SchedulerConfig(max_model_len=2048, block_size=16,
                                                   max_prefill_tokens=8), time.monotonic)  # fmt: skip
    core = SchedulerCore(sched, cluster.view, rec.prefill, rec.send_handoff, rec.send_error,
                         0, rec.metrics(), chunk_tokens=64)  # fmt: skip
    core.start()
    try:
        for i in range(3):  # 8-token prompts: one per batch
            core.add(
                f"s{i}", list(range(1, 9)), GenerateParams(sampling=SamplingParams(max_tokens=4))
            )
        wait_for(lambda: len(rec.handoffs) == 1)
        time.sleep(0.1)
        assert len(rec.handoffs) == 1, "a second batch went out before the first was taken in"
        cluster.received[0], cluster.backlog[0] = 1, 64  # taken in; a full iteration queued
        time.sleep(0.1)
        assert len(rec.handoffs) == 1, "sent while the instance's prompt backlog was full"
        cluster.backlog[0] = 0
        wait_for(lambda: len(rec.handoffs) == 2)
    finally:
        core.close()
    assert rec.calls == []  # no prefill model in this topology
    (_, first), (_, second) = rec.handoffs
    assert first.prefill_index == -1 and first.prompt_ids == list(range(1, 9))
    assert first.decode_index == second.decode_index == 0


@pytest.mark.parametrize("policy", ["fcfs", "distserve", "bucketserve", "bucketserve+", "edf"])
def test_colocated_offers_the_least_loaded_instance_first(policy):
    rec, cluster = Recorder(), ColocatedCluster(2)
    cluster.backlog = [40, 0]
    sched = make_scheduler(policy, SchedulerConfig(max_model_len=2048, block_size=16),
                           time.monotonic)  # fmt: skip
    core = SchedulerCore(sched, cluster.view, rec.prefill, rec.send_handoff, rec.send_error,
                         0, rec.metrics(), chunk_tokens=64)  # fmt: skip
    core.start()
    try:
        core.add("a", [1, 2, 3], GenerateParams(sampling=SamplingParams(max_tokens=4)))
        wait_for(lambda: len(rec.handoffs) == 1)
    finally:
        core.close()
    assert rec.handoffs[0][1].decode_index == 1


def test_prefix_aware_placement_sends_a_shared_prefix_where_it_went_before():
    """Requests whose 64-token prefix the index places on prefill1 go there, though prefill0
    is as empty and first by name (where they go without an index); an unrelated prompt and
    another tenant's (salt) do not follow."""
    shared = list(range(100, 164))
    index = PrefixIndex()
    index.record("prefill1", block_hashes(shared, 16))
    plain = GenerateParams(sampling=SamplingParams(max_tokens=4))
    salted = GenerateParams(sampling=SamplingParams(max_tokens=4), cache_salt="t")
    rec = Recorder()
    core = make_core(rec, Cluster(2, 1), prefix_index=index)
    prompts = [(shared + [i], plain) for i in range(4)] + [(shared, salted), ([5] * 70, plain)]
    try:
        for i, (ids, params) in enumerate(prompts):
            core.add(f"s{i}", ids, params)
            wait_for(lambda i=i: len(rec.handoffs) == i + 1)
    finally:
        core.close()
    assert [c[0] for c in rec.calls] == [1, 1, 1, 1, 0, 0]


def test_buckets_see_the_uncached_length():
    """A 1,000-token prompt whose first 960 tokens the index places somewhere is a short
    prefill: its RequestMeta carries the cached estimate, and buckets sort it by the rest."""
    shared = list(range(1000, 1960))
    index = PrefixIndex()
    index.record("prefill0", block_hashes(shared, 16))
    rec = Recorder(prefill_s=0.2)
    core = make_core(rec, Cluster(1, 1), prefix_index=index)
    metas = []
    core.sched.add = lambda meta, add=core.sched.add: (metas.append(meta), add(meta))[1]
    params = GenerateParams(sampling=SamplingParams(max_tokens=4))
    try:
        core.add("a", shared + list(range(40)), params)
        core.add("b", list(range(5000, 6000)), params)
        wait_for(lambda: len(rec.handoffs) == 2)
    finally:
        core.close()
    assert [(m.prompt_len, m.num_cached_tokens, m.bucket_len) for m in metas] == [
        (1000, 960, 40),
        (1000, 0, 1000),
    ]
