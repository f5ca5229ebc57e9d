"""Validation at the boundary and SLO defaults."""

from __future__ import annotations

import pytest
from bucketserve.scheduling import InstanceStats, RequestMeta, SchedulerConfig
from bucketserve.scheduling.batch import PrefillBatch

from .conftest import req


def test_request_validation_names_field():
    with pytest.raises(ValueError, match="prompt_len"):
        req("a", 0)
    with pytest.raises(ValueError, match="max_tokens"):
        RequestMeta("a", 5, 0, 0.0)
    with pytest.raises(ValueError, match="slo_class"):
        req("a", 5, slo_class="batch")
    with pytest.raises(ValueError, match="arrival_s"):
        RequestMeta("a", 5, 5, float("nan"))


def test_slo_defaults_per_class_and_length():
    short = req("a", 69)
    assert short.ttft_slo_s == pytest.approx(0.25) and short.tpot_slo_s == pytest.approx(0.1)
    long = req("b", 3584)
    assert long.ttft_slo_s == pytest.approx(3584 * 1.5e-3)
    off = req("c", 69, slo_class="offline")
    assert off.ttft_slo_s > short.ttft_slo_s and off.tpot_slo_s > short.tpot_slo_s
    given = req("d", 69, ttft_slo_s=1.0, tpot_slo_s=0.2)
    assert (given.ttft_slo_s, given.tpot_slo_s, given.ttft_deadline_s) == (1.0, 0.2, 1.0)


@pytest.mark.parametrize(
    ("field", "value"),
    [("block_size", 0), ("max_wait_s", 0), ("memory_safety", 1.5), ("output_reserve", "all"),
     ("offline_order", "random"), ("max_batched_tokens", 10), ("max_buckets", 0), ("watermark", 0.9)],
)  # fmt: skip
def test_config_validation_names_field(field, value):
    with pytest.raises(ValueError, match=field):
        SchedulerConfig(**({"max_model_len": 4096, "block_size": 16} | {field: value}))


def test_config_token_budget_default_is_vllms():
    assert SchedulerConfig(max_model_len=1024, block_size=16).token_budget() == 2048
    assert SchedulerConfig(max_model_len=4096, block_size=16).token_budget() == 4096


def test_instance_stats_validation():
    with pytest.raises(ValueError, match="role"):
        InstanceStats("x", "both", 10, 5, 16, 0, 0.0, 1)
    with pytest.raises(ValueError, match="free_blocks"):
        InstanceStats("x", "decode", 10, 11, 16, 0, 0.0, 1)


def test_prefill_batch_padding_ratio():
    b = PrefillBatch(0, [req("a", 100), req("b", 300)], (0, 512), "p0", "d0", 0.0)
    assert (b.num_tokens, b.padded_tokens) == (400, 600)
    assert b.padding_ratio == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="requests"):
        PrefillBatch(1, [], (0, 1), "p0", "d0", 0.0)
