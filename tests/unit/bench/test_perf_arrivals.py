"""Arrival processes: rates, burstiness, determinism, trace replay."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from bucketserve.bench.arrivals import Arrivals, load_trace


def test_poisson_rate_and_cv():
    gaps = np.diff(Arrivals("poisson").send_times(20_000, rate=4.0, seed=0), prepend=0.0)
    assert abs(gaps.mean() - 0.25) / 0.25 < 0.03
    assert abs(gaps.std() / gaps.mean() - 1.0) < 0.05


def test_gamma_is_bursty_with_the_requested_cv():
    gaps = Arrivals("gamma", cv=2.0).unit_gaps(50_000, seed=1)
    assert abs(gaps.mean() - 1.0) < 0.05
    assert abs(gaps.std() / gaps.mean() - 2.0) < 0.15


def test_same_seed_same_shape_at_every_rate():
    a = Arrivals("poisson")
    assert np.allclose(a.send_times(50, 1.0, seed=3) / 2.0, a.send_times(50, 2.0, seed=3))
    assert not np.allclose(a.send_times(50, 1.0, seed=3), a.send_times(50, 1.0, seed=4))


def test_trace_replay_scales_to_the_rate(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("timestamp,input_length,output_length\n10,5,7\n10.5,6,8\n12,9,3\n")
    tr = load_trace(path)
    assert list(tr.times_s) == [0.0, 0.5, 2.0]
    assert tr.native_rate == pytest.approx(1.0)
    arr = Arrivals("trace", trace=tr)
    assert np.allclose(arr.send_times(3, rate=1.0, seed=0), [0.0, 0.5, 2.0])
    assert np.allclose(arr.send_times(3, rate=2.0, seed=0), [0.0, 0.25, 1.0])


def test_bad_inputs_are_rejected(tmp_path):
    with pytest.raises(ValueError, match="kind"):
        Arrivals("uniform")
    with pytest.raises(ValueError, match="rate"):
        Arrivals().send_times(3, 0.0, 0)
    bad = tmp_path / "bad.csv"
    bad.write_text("0,1,1\n1,x,2\n")
    with pytest.raises(ValueError, match="bad row"):
        load_trace(bad)


def test_shipped_sample_trace_loads():
    path = Path(__file__).resolve().parents[3] / "perf" / "traces" / "sample_trace.csv"
    tr = load_trace(path)
    assert len(tr.times_s) == 60 and tr.times_s[0] == 0.0
    assert (np.diff(tr.times_s) >= 0).all() and tr.input_lengths.min() >= 1


def test_auto_rates_are_fractions_of_the_probed_capacity():
    from bucketserve.bench.autorates import AutoRates

    auto = AutoRates((0.5, 1.0, 1.5), reqs=[], capacity=0.8, probed_on="static")
    assert auto("unused:0", "fcfs") == (0.4, 0.8, 1.2)  # no second probe once known
    assert "static" in auto.describe() and "0.800" in auto.describe()
