"""Each policy's batch rule, admission bounds, bookkeeping and snapshot."""

from __future__ import annotations

import pytest
from bucketserve.scheduling import POLICIES, ClusterView, SchedulerConfig, make_scheduler

from .conftest import req, stats, view

CFG = SchedulerConfig(max_model_len=4096, block_size=16)


def make(policy: str, clock, **kw):
    return make_scheduler(
        policy, SchedulerConfig(**({"max_model_len": 4096, "block_size": 16} | kw)), clock
    )


def test_unknown_policy_names_valid_ones(clock):
    with pytest.raises(ValueError, match="policy.*bucketserve\\+"):
        make_scheduler("lifo", CFG, clock)
    assert POLICIES == ("static", "fcfs", "distserve", "bucketserve", "bucketserve+")


@pytest.mark.parametrize("policy", POLICIES)
def test_add_cancel_and_validation(policy, clock):
    s = make_scheduler(policy, CFG, clock)
    s.add(req("a", 10))
    s.add(req("b", 20))
    with pytest.raises(ValueError, match="already queued"):
        s.add(req("a", 10))
    with pytest.raises(ValueError, match="max_model_len"):
        s.add(req("c", 4000, max_tokens=200))
    assert s.cancel("a") and not s.cancel("a") and s.num_waiting == 1
    batch = s.next_batch(view())
    assert batch is not None and batch.request_ids == ["b"] and s.num_waiting == 0
    assert not s.cancel("b")  # already scheduled
    snap = s.snapshot().to_dict()
    for key in ("free_blocks", "queue_per_bucket", "bucket_boundaries", "arrival_rate", "mean_prompt_len",
                "batch_latency_s", "padding_ratio", "decisions", "mean_decision_us"):  # fmt: skip
        assert key in snap
    assert snap["free_blocks"] == {"p0": 10_000, "d0": 10_000} and snap["decisions"] == 1


@pytest.mark.parametrize("policy", POLICIES)
def test_admission_bounded_by_decode_free_blocks(policy, clock):
    s = make_scheduler(policy, CFG, clock)
    for i in range(4):
        s.add(req(f"r{i}", 100, t=0.0))
    # static reserves prompt + max_tokens (16): 8 blocks per request; others 7 (100 + 1 token);
    # the 1 % watermark keeps 1 of the 100 blocks
    assert s.next_batch(view(d_free=5, total=100)) is None
    batch = s.next_batch(view(d_free=16, total=100))
    assert batch is not None and batch.size <= 2
    assert sum(-(-(r.prompt_len + 1) // 16) for r in batch.requests) <= 16


@pytest.mark.parametrize("policy", POLICIES)
def test_admission_bounded_by_prefill_free_blocks(policy, clock):
    s = make_scheduler(policy, CFG, clock)
    for i in range(4):
        s.add(req(f"r{i}", 100))
    assert s.next_batch(view(p_free=6)) is None  # one prompt needs 7 blocks
    assert s.next_batch(view(p_free=14)).size <= 2


def test_pending_handoffs_count_against_decode(clock):
    s = make("fcfs", clock)
    for i in range(3):
        s.add(req(f"r{i}", 100))
    first = s.next_batch(view(d_free=20, total=100))
    assert first.size == 2  # 2 x 7 blocks of 19 (20 less the watermark)
    s.add(req("r9", 100))
    # the decode instance has not allocated the first batch yet (2 pending, 20 still free)
    assert s.next_batch(view(d_free=20, total=100, d_pending=2)) is None


def test_fcfs_token_budget_and_order(clock):
    s = make("fcfs", clock)
    for i, n in enumerate([3000, 3000, 100]):
        s.add(req(f"r{i}", n, t=float(i)))
    assert s.next_batch(view()).request_ids == ["r0"]
    assert s.next_batch(view()).request_ids == ["r1", "r2"]


def test_static_waits_for_the_whole_batch(clock):
    s = make("static", clock, static_batch_size=2)
    for i in range(4):
        s.add(req(f"r{i}", 50))
    b = s.next_batch(view())
    assert b.request_ids == ["r0", "r1"]
    assert s.next_batch(view()) is None  # ours still unfinished
    s.on_batch_done(b, 0.1)
    s.on_request_finished("r0", 10)
    assert s.next_batch(view()) is None
    s.on_request_finished("r1", 10)
    assert s.next_batch(view(d_running=1)) is None  # decode still busy
    assert s.next_batch(view()).request_ids == ["r2", "r3"]


def test_aggregated_instance_keeps_its_batch(clock):
    s = make("fcfs", clock)
    s.add(req("a", 10))
    g0, g1 = stats("g0", "mixed", 5000), stats("g1", "mixed", 9000)
    b = s.next_batch(ClusterView([g0], [g0, g1]))
    assert (b.prefill_id, b.decode_id) == ("g0", "g0")


def test_bucketserve_serves_bucket_of_oldest_online_request(clock):
    s = make("bucketserve", clock)
    s.add(req("long", 3000, t=0.0))
    s.add(req("off", 50, t=0.5, slo_class="offline"))
    for i in range(6):
        s.add(req(f"s{i}", 50 + i, t=1.0 + i))
    # 220 free decode blocks: Eq. 6 capacity 0.9 x 220 x 16 = 3,168 tokens; mean length ~420
    # -> N_max = 7 < 8 queued, 7/8 below 2048: Algorithm 1 splits [0, 4096) once
    small = view(d_free=220, total=1000)
    assert s.next_batch(small).request_ids == ["long"]  # its bucket holds the oldest request
    assert s.buckets.boundaries() == [(0, 2048), (2048, 4096)]
    b = s.next_batch(small)
    assert b.request_ids[:6] == [f"s{i}" for i in range(6)] and b.request_ids[-1] == "off"


@pytest.mark.parametrize(("order", "expect"), [("sjf", ["a", "c", "b"]), ("ljf", ["b", "c", "a"])])
def test_bucketserve_offline_order(order, expect, clock):
    s = make("bucketserve", clock, offline_order=order)
    for rid, n in (("a", 10), ("b", 30), ("c", 20)):
        s.add(req(rid, n, slo_class="offline"))
    assert s.next_batch(view()).request_ids == expect


def test_bucketserve_eq6_caps_batch(clock):
    s = make("bucketserve", clock)
    for i in range(10):
        s.add(req(f"r{i}", 1000))
    # 200 free blocks x 16 tokens = 3,200 tokens; x0.9 -> 2,880 -> two 1,000-token prompts
    assert s.next_batch(view(p_free=200, total=1000)).size == 2


def test_bucketserve_without_bucketing_keeps_one_bucket(clock):
    full, ablated = make("bucketserve", clock), make("bucketserve", clock, enable_bucketing=False)
    for s in (full, ablated):
        s.add(req("long", 3000, t=0.0))
        for i in range(7):
            s.add(req(f"s{i}", 50 + i, t=1.0 + i))
    small = view(d_free=220, total=1000)  # Eq. 6 capacity 3,168 tokens, as in the test above
    assert full.next_batch(small).request_ids == ["long"]  # alone in its bucket
    assert full.buckets.boundaries() == [(0, 2048), (2048, 4096)]
    # one bucket: the short prompts fill the rest of the Eq. 6 capacity next to the long one
    assert ablated.next_batch(small).request_ids == ["long", "s0", "s1", "s2"]
    assert ablated.buckets.boundaries() == [(0, 4096)]
    assert ablated.snapshot().to_dict()["bucket_boundaries"] == [[0, 4096]]


def test_bucketserve_without_batch_controller_uses_static_size(clock):
    s = make("bucketserve", clock, enable_batch_controller=False, static_batch_size=3)
    for i in range(10):
        s.add(req(f"r{i}", 1000))
    # Eq. 6 would allow two 1,000-token prompts (test_bucketserve_eq6_caps_batch); the static
    # size takes three, still inside the block budget (3 x 63 blocks of 200 free prefill blocks)
    assert s.next_batch(view(p_free=200, total=1000)).size == 3
    assert s.next_batch(view(p_free=100, total=1000)).size == 1  # the block budget still binds


def test_bucketserve_without_priority_serves_oldest_first(clock):
    full, ablated = make("bucketserve", clock), make("bucketserve", clock, enable_priority=False)
    for s in (full, ablated):
        for rid, n, t, slo in (("c", 30, 0.0, "offline"), ("a", 10, 0.5, "offline"),
                               ("b", 20, 1.0, "online")):  # fmt: skip
            s.add(req(rid, n, t=t, slo_class=slo))
    assert full.next_batch(view()).request_ids == ["b", "a", "c"]  # online first, then SJF
    assert ablated.next_batch(view()).request_ids == ["c", "a", "b"]  # arrival order


def test_plus_reserves_expected_output(clock):
    s = make("bucketserve+", clock, expected_output_tokens=16)
    for i in range(3):
        s.add(req(f"r{i}", 100, max_tokens=512))
    # 100 + 16 expected -> 8 blocks each; 17 free - 1 watermark = 16 -> 2 fit
    assert s.next_batch(view(d_free=17, total=100)).size == 2
    for _ in range(200):
        s.on_request_finished("x", 400)  # learned: outputs are long now
    s.add(req("r9", 100, max_tokens=512))
    assert s.next_batch(view(d_free=20, total=100)) is None  # needs ~32 blocks each now


def test_plus_prefers_feasible_deadlines(clock):
    s = make("bucketserve+", clock)
    s.add(req("late", 50, t=0.0))  # TTFT 0.25 s: hopeless at t=1
    s.add(req("tight", 3000, t=0.9, ttft_slo_s=2.0))
    s.add(req("fresh", 60, t=0.95))
    clock.t = 1.0
    b = s.next_batch(view())
    assert b.request_ids[0] == "fresh" and "late" in b.request_ids  # hopeless rides along last


def test_ledger_released_and_expired(clock):
    s = make("fcfs", clock)
    s.add(req("a", 100))
    b = s.next_batch(view(total=1000))
    assert len(s.ledger) == 1
    s.on_batch_done(b, 0.05)
    s.on_request_finished("a", 5)
    assert len(s.ledger) == 0
    s.add(req("b", 100))
    b = s.next_batch(view(total=1000))
    s.on_batch_done(b, 0.05)
    clock.t = 5.0  # never reported finished; decode idle well past the grace period
    s.add(req("c", 100, t=5.0))
    s.next_batch(view(total=1000))
    assert s.ledger.count("d0") == 1  # b forgotten, c reserved
