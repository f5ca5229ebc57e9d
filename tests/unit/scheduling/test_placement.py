"""Decode placement (SCLS max–min, least-loaded, round-robin) and the prefill token cap."""

from __future__ import annotations

import pytest
from bucketserve.scheduling import POLICIES, ClusterView, SchedulerConfig, make_scheduler
from bucketserve.scheduling.placement import DecodeCandidate, DecodePlacer, request_load

from .conftest import req, stats


def cand(iid: str, room: int = 100, n: int = 0, load: float = 0.0) -> DecodeCandidate:
    return DecodeCandidate(iid, room, n, load)


def test_request_load_sums_context_over_remaining_steps():
    # 3 output tokens after a 10-token prompt read 11 + 12 + 13 tokens
    assert request_load(10, 3) == 36
    assert request_load(10, 0) == 0


def test_unknown_balance_names_the_valid_ones():
    with pytest.raises(ValueError, match="maxmin"):
        DecodePlacer("random")
    with pytest.raises(ValueError, match="decode_balance"):
        SchedulerConfig(max_model_len=64, block_size=16, decode_balance="x")


def test_maxmin_picks_smallest_predicted_load_not_fewest_requests():
    placer = DecodePlacer("maxmin")
    heavy_few = cand("decode0", n=1, load=1e6)
    light_many = cand("decode1", n=9, load=1e3)
    assert placer.choose([heavy_few, light_many]) is light_many
    assert DecodePlacer("least_loaded").choose([heavy_few, light_many]) is heavy_few


def test_instances_without_headroom_are_never_chosen():
    for policy in ("maxmin", "least_loaded", "round_robin"):
        placer = DecodePlacer(policy)
        full = cand("decode0", room=0)
        assert placer.choose([full, cand("decode1", load=5e9, n=99)]).instance_id == "decode1"
        assert placer.choose([full]) is None


def test_round_robin_cycles_and_skips_full_instances():
    placer = DecodePlacer("round_robin")
    seen = []
    for _ in range(4):
        chosen = placer.choose([cand("decode0"), cand("decode1"), cand("decode2")])
        placer.placed(chosen.instance_id)
        seen.append(chosen.instance_id)
    assert seen == ["decode0", "decode1", "decode2", "decode0"]
    chosen = placer.choose([cand("decode0"), cand("decode1", room=0), cand("decode2")])
    assert chosen.instance_id == "decode2"


def two_decode_view() -> ClusterView:
    return ClusterView(
        [stats("p0", "prefill", 10_000)],
        [stats("d0", "decode", 10_000), stats("d1", "decode", 10_000)],
    )


@pytest.mark.parametrize("policy", POLICIES)
def test_scheduler_spreads_batches_by_predicted_load(policy, clock):
    cfg = SchedulerConfig(max_model_len=4096, block_size=16, static_batch_size=1)
    s = make_scheduler(policy, cfg, clock)
    s.add(req("long", 2000, t=0.0, max_tokens=1000))
    first = s.next_batch(two_decode_view())
    assert first is not None and first.decode_id == "d0"
    s.add(req("short", 10, t=0.1, max_tokens=10))
    second = s.next_batch(two_decode_view())
    assert second is not None and second.decode_id == "d1"  # d0 carries the long request
    s.on_request_finished("long", 900)
    s.add(req("next", 10, t=0.2, max_tokens=10))
    third = s.next_batch(two_decode_view())
    assert third is not None and third.decode_id == "d0"  # d0 is empty again


def test_round_robin_scheduler_alternates(clock):
    cfg = SchedulerConfig(max_model_len=4096, block_size=16, decode_balance="round_robin")
    s = make_scheduler("fcfs", cfg, clock)
    ids = []
    for i in range(4):
        s.add(req(f"r{i}", 10, t=float(i)))
        ids.append(s.next_batch(two_decode_view()).decode_id)
    assert ids == ["d0", "d1", "d0", "d1"]


@pytest.mark.parametrize("policy", POLICIES)
def test_max_prefill_tokens_caps_every_policy(policy, clock):
    cfg = SchedulerConfig(
        max_model_len=4096, block_size=16, max_prefill_tokens=1000, static_batch_size=64
    )
    s = make_scheduler(policy, cfg, clock)
    for i in range(20):
        s.add(req(f"r{i}", 300, t=0.0))
    sizes = []
    while s.num_waiting:
        batch = s.next_batch(two_decode_view())
        assert batch is not None
        assert batch.num_tokens <= 1000
        sizes.append(batch.size)
        for rid in batch.request_ids:  # static waits for an idle decode instance
            s.on_request_finished(rid, 16)
    assert sum(sizes) == 20 and max(sizes) == 3


def test_prompt_longer_than_the_cap_still_runs_alone(clock):
    cfg = SchedulerConfig(max_model_len=4096, block_size=16, max_prefill_tokens=500)
    s = make_scheduler("bucketserve", cfg, clock)
    s.add(req("big", 2000))
    s.add(req("small", 2000, t=0.1))
    batch = s.next_batch(two_decode_view())
    assert batch is not None and batch.request_ids == ["big"]
