"""Length distributions, truncation, arrivals, determinism."""

from __future__ import annotations

import numpy as np
import pytest
from bucketserve.sim.workload import ALPACA_PROMPT, WorkloadSpec, arrival_times, make_requests


def test_alpaca_lognormal_matches_paper_statistics():
    x = ALPACA_PROMPT.sample(np.random.default_rng(0), 200_000)
    assert np.median(x) == pytest.approx(69, rel=0.02)
    assert np.mean(x) == pytest.approx(83.7, rel=0.02)


def test_longbench_truncated_to_context_minus_max_tokens():
    reqs = make_requests(WorkloadSpec("longbench", 500, 1.0, seed=1))
    lengths = [r.meta.prompt_len for r in reqs]
    assert max(lengths) == 4096 - 512
    assert np.mean([n == 3584 for n in lengths]) > 0.99  # median 41k tokens: nearly all capped
    assert all(2 <= r.output_len <= 512 for r in reqs)


def test_mixed_share_and_determinism():
    a = make_requests(WorkloadSpec("mixed", 2000, 4.0, seed=3))
    b = make_requests(WorkloadSpec("mixed", 2000, 4.0, seed=3))
    assert [(r.meta.prompt_len, r.output_len, r.meta.arrival_s) for r in a] == [
        (r.meta.prompt_len, r.output_len, r.meta.arrival_s) for r in b
    ]
    share = np.mean([r.meta.task_type == "summarization" for r in a])
    assert share == pytest.approx(0.1, abs=0.02)


@pytest.mark.parametrize(("kind", "cv"), [("poisson", 1.0), ("gamma", 2.0), ("gamma", 3.0)])
def test_arrival_rate_and_burstiness(kind, cv):
    t = arrival_times(np.random.default_rng(0), 50_000, 8.0, kind, cv)
    gaps = np.diff(t)
    assert 1 / gaps.mean() == pytest.approx(8.0, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.06)


def test_workload_validation():
    with pytest.raises(ValueError, match="workload"):
        WorkloadSpec("sharegpt")
    with pytest.raises(ValueError, match="arrival"):
        WorkloadSpec(arrival="uniform")
    with pytest.raises(ValueError, match="long_fraction"):
        WorkloadSpec(long_fraction=2.0)


def test_offline_fraction_keeps_lengths_and_arrivals():
    base = make_requests(WorkloadSpec("mixed", num_requests=2000, seed=4))
    mixed = make_requests(WorkloadSpec("mixed", num_requests=2000, seed=4, offline_fraction=0.3))
    assert all(r.meta.slo_class == "online" for r in base)
    share = sum(r.meta.slo_class == "offline" for r in mixed) / len(mixed)
    assert 0.27 < share < 0.33
    for a, b in zip(base, mixed, strict=True):
        assert (a.meta.prompt_len, a.meta.arrival_s, a.output_len) == (
            b.meta.prompt_len, b.meta.arrival_s, b.output_len,
        )  # fmt: skip
    with pytest.raises(ValueError, match="offline_fraction must be in"):
        WorkloadSpec(offline_fraction=1.5)
