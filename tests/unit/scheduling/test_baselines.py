"""The simulator's extra baselines: orderings, padding-aware budget, admission, SCLS, task types."""

from __future__ import annotations

import pytest
from bucketserve.scheduling import SIM_POLICIES, SchedulerConfig, make_scheduler
from bucketserve.scheduling.buckets import TaskTypeBuckets, rebalance

from .conftest import req, view


def make(policy: str, clock, **kw):
    cfg = SchedulerConfig(**({"max_model_len": 4096, "block_size": 16} | kw))
    return make_scheduler(policy, cfg, clock)


def ids(batch) -> list[str]:
    return [m.request_id for m in batch.requests]


def test_sim_policies_extend_the_server_ones():
    assert SIM_POLICIES[:5] == ("static", "fcfs", "distserve", "bucketserve", "bucketserve+")
    assert set(SIM_POLICIES[5:]) == {"fcfs-pad", "sjf", "edf", "bullet", "scls"}


def test_sjf_serves_the_shortest_prompt_first(clock):
    s = make("sjf", clock, max_batched_tokens=4096)
    for rid, length, t in (("long", 3600, 0.0), ("mid", 500, 0.1), ("short", 20, 0.2)):
        s.add(req(rid, length, t))
    clock.t = 0.3
    assert ids(s.next_batch(view())) == ["short", "mid"]  # + long would pass 4096 tokens


def test_edf_serves_the_earliest_ttft_deadline_first(clock):
    s = make("edf", clock)
    s.add(req("loose", 10, 0.0, ttft_slo_s=5.0))
    s.add(req("tight", 10, 1.0, ttft_slo_s=0.5))
    clock.t = 1.0
    assert ids(s.next_batch(view())) == ["tight", "loose"]


def test_bullet_lets_urgent_requests_jump_the_short_ones(clock):
    s = make("bullet", clock, bullet_urgent_s=0.2, max_batched_tokens=4096)
    s.add(req("urgent-long", 3000, 0.0, ttft_slo_s=1.1))
    s.add(req("short", 20, 0.5, ttft_slo_s=5.0))
    s.add(req("late", 30, 0.0, ttft_slo_s=0.3))
    clock.t = 1.0  # urgent-long has 0.1 s of slack; late missed its deadline already
    assert ids(s.next_batch(view())) == ["urgent-long", "short", "late"]


def test_padding_aware_fcfs_budgets_n_times_the_longest(clock):
    s = make("fcfs-pad", clock, max_batched_tokens=4096, max_paddings=10_000)
    for i, length in enumerate((1000, 1000, 1000, 1000, 10)):
        s.add(req(f"r{i}", length, i * 0.01))
    assert len(s.next_batch(view()).requests) == 4  # a 5th row pads to 5 x 1000 > 4096
    t = make("fcfs", clock, max_batched_tokens=4096)
    for i, length in enumerate((1000, 1000, 1000, 1000, 10)):
        t.add(req(f"r{i}", length, i * 0.01))
    assert len(t.next_batch(view()).requests) == 5  # packed: 4010 tokens fit


def test_padding_aware_fcfs_caps_padding_tokens(clock):
    s = make("fcfs-pad", clock, max_batched_tokens=8192, max_paddings=256)
    s.add(req("a", 1000, 0.0))
    s.add(req("b", 10, 0.1))  # would add 990 padding tokens
    s.add(req("c", 900, 0.2))
    assert ids(s.next_batch(view())) == ["a"]


@pytest.mark.parametrize("policy", ["distserve", "sjf", "edf", "bullet", "bucketserve+"])
def test_prefill_only_admission_ignores_decode_headroom(policy, clock):
    s = make(policy, clock, admission="prefill")
    s.add(req("a", 100))
    assert ids(s.next_batch(view(d_free=0, total=100))) == ["a"]
    s.add(req("b", 100))
    assert s.next_batch(view(p_free=3, total=100)) is None  # 7 prompt blocks do not fit 3


def test_headroom_admission_is_the_server_default_for_distserve(clock):
    s = make("distserve", clock)
    s.add(req("a", 100))
    assert s.next_batch(view(d_free=5, total=100)) is None


def test_scls_reserves_a_slice_and_searches_the_batch_size(clock):
    s = make("scls", clock, scls_slice_tokens=64)
    for i in range(6):
        s.add(req(f"r{i}", 100, i * 0.01))
    # decode pool of 50 blocks, 1 % watermark: 11 blocks (100 + 64 tokens) each -> 4 fit
    batch = s.next_batch(view(d_free=50, total=50))
    assert 1 <= len(batch.requests) <= 4
    rate = {n: n / s.slice_time(n, 100) for n in range(1, 5)}
    assert len(batch.requests) == max(rate, key=rate.get)


def test_scls_batch_search_leaves_out_what_slows_the_slice_down(clock):
    s = make("scls", clock, scls_slice_tokens=32)
    for _ in range(20):  # decode steps cost 1 ms per sequence x context token
        for n, length in ((1, 100), (4, 100), (8, 200), (2, 300)):
            s.observe_step(n, length, 1e-3 * n * length)
    s.add(req("short", 10, 0.0))
    for i in range(3):
        s.add(req(f"long{i}", 2000, 0.1 + i))
    assert ids(s.next_batch(view())) == ["short"]  # a long one would slow every step 100x


def test_task_types_never_share_a_bucket(clock):
    s = make("bucketserve", clock)
    s.add(req("chat", 100, 0.0, task_type="chat"))
    s.add(req("summ", 3000, 0.1, task_type="summarization"))
    s.add(req("chat2", 120, 0.2, task_type="chat"))
    batch = s.next_batch(view())
    assert ids(batch) == ["chat", "chat2"]  # the oldest request's bucket, its type only
    assert ids(s.next_batch(view())) == ["summ"]


def test_task_type_bucketing_can_be_turned_off(clock):
    s = make("bucketserve", clock, bucket_by_task_type=False)
    s.add(req("chat", 100, 0.0, task_type="chat"))
    s.add(req("summ", 3000, 0.1, task_type="summarization"))
    assert ids(s.next_batch(view())) == ["chat", "summ"]


def test_algorithm_1_runs_per_task_type():
    b = TaskTypeBuckets(4096)
    for i in range(10):
        b.add(req(f"c{i}", 100 + i, i, task_type="chat"))
    b.add(req("s0", 3000, 20, task_type="summarization"))
    assert rebalance(b, n_max=4) == "split"  # 10 chat requests > 4, all below 2048
    assert len(b.groups["summarization"].buckets) == 1  # 1 request: never split
    assert len(b.groups["chat"].buckets) > 1
    assert b.total == 11 and [m.request_id for m in b.all_requests()][-1] == "s0"
    b.remove("s0")
    assert "s0" not in b and b.total == 10


def test_an_idle_task_type_manager_shows_one_bucket(clock):
    s = make("bucketserve", clock)
    assert s.snapshot().to_dict()["bucket_boundaries"] == [[0, 4096]]
