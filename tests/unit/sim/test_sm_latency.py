"""Bullet's SM-scaling roofline: monotonic in SMs, decode saturates at N_d, partition search."""

from __future__ import annotations

import pytest
from bucketserve.sim.hardware import A100_40GB
from bucketserve.sim.sm_latency import SmPartitionLatency


@pytest.fixture
def srm(latency) -> SmPartitionLatency:
    return SmPartitionLatency(latency)


def test_prefill_time_falls_with_every_sm_added(srm):
    times = [srm.prefill_time([512, 512], sms=s) for s in range(2, A100_40GB.sms + 1, 2)]
    assert all(a > b for a, b in zip(times, times[1:], strict=False))
    assert srm.prefill_time([512, 512]) == pytest.approx(srm.base.prefill_time([512, 512]))


def test_decode_stops_improving_past_the_bandwidth_knee(srm):
    times = [srm.decode_time(8, 8 * 300, sms=s) for s in range(2, A100_40GB.sms + 1, 2)]
    assert all(a >= b for a, b in zip(times, times[1:], strict=False))
    knee = A100_40GB.bandwidth_sms
    assert srm.decode_time(8, 2400, sms=knee) == pytest.approx(srm.decode_time(8, 2400))
    assert srm.decode_time(8, 2400, sms=knee // 2) > 1.5 * srm.decode_time(8, 2400)


def test_corun_contention_slows_both(srm):
    assert srm.prefill_time([1024], sms=60, corun=True) > srm.prefill_time([1024], sms=60)
    assert srm.decode_time(8, 2400, sms=40, corun=True) > srm.decode_time(8, 2400, sms=40)


@pytest.mark.parametrize("target", [0.04, 0.05, 0.1])
def test_min_decode_sms_is_the_fewest_that_meet_the_target(srm, target):
    sms = srm.min_decode_sms(16, 16 * 500, target)
    assert sms % 2 == 0 and srm.decode_time(16, 8000, sms, corun=True) <= target
    assert sms == 2 or srm.decode_time(16, 8000, sms - 2, corun=True) > target


def test_unreachable_target_gets_every_sm(srm):
    assert srm.min_decode_sms(64, 64 * 3000, 0.005) == A100_40GB.sms


def test_bad_sm_counts_raise(srm):
    with pytest.raises(ValueError, match="sms must be in"):
        srm.decode_time(1, 100, sms=0)
