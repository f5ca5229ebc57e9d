"""The Prometheus endpoint carries BucketServe's own metrics, and they move with traffic."""

from __future__ import annotations

import time

import pytest

from .helpers import generate, metric_value

pytestmark = pytest.mark.server


def test_request_metrics_count_a_request(server):
    before = {
        n: metric_value(server, n)
        for n in (
            "bucketserve_time_to_first_token_seconds_count",
            "bucketserve_generation_tokens_total",
            "bucketserve_prompt_tokens_total",
            "bucketserve_prefill_batch_size_count",
        )
    }
    out = generate(
        server,
        {"text_input": "Name a colour.", "max_tokens": 5, "min_tokens": 5, "temperature": 0.0},
    ).json()
    time.sleep(0.5)
    after = {n: metric_value(server, n) for n in before}
    assert (
        after["bucketserve_time_to_first_token_seconds_count"]
        == before["bucketserve_time_to_first_token_seconds_count"] + 1
    )
    assert (
        after["bucketserve_generation_tokens_total"] - before["bucketserve_generation_tokens_total"]
        == 5
    )
    assert (
        after["bucketserve_prompt_tokens_total"] - before["bucketserve_prompt_tokens_total"]
        == out["num_input_tokens"]
    )
    assert (
        after["bucketserve_prefill_batch_size_count"]
        >= before["bucketserve_prefill_batch_size_count"] + 1
    )


def test_bucket_metrics_describe_the_buckets(server):
    generate(server, {"text_input": "Hello", "max_tokens": 2, "temperature": 0.0})
    time.sleep(0.6)
    assert metric_value(server, "bucketserve_bucket_count") >= 1
    assert metric_value(server, "bucketserve_bucket_upper_bound") >= 2048  # one bucket [0, context)
    assert metric_value(server, "bucketserve_scheduler_decisions_total") >= 1
