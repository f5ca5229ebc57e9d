"""The decode step's memory floor (bench/floor.py): each timed run against the bandwidth
measured around it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from bucketserve.bench.floor import decode_floor, read_bandwidth, step_bytes


def _config(**kw):
    fields = dict(num_params=1000, tie_word_embeddings=True, vocab_size=10, hidden_size=4,
                  dtype="bfloat16", kv_bytes_per_token=8)  # fmt: skip
    return SimpleNamespace(**{**fields, **kw})


def test_step_bytes_counts_the_weights_once_and_the_batch_kv():
    assert step_bytes(_config(), batch=2, context=5) == 1000 * 2 + 2 * 5 * 8
    # An untied LM head: the embedding table is not read by a step (one row per sequence).
    assert step_bytes(_config(tie_word_embeddings=False), 1, 0) == (1000 - 40) * 2


def test_each_round_is_judged_against_its_own_bandwidth():
    mc = _config()  # 2,000 bytes a step at context 0
    # A fast round (2 GB/s: floor 1 us) and two slow ones (1 GB/s: floor 2 us).
    rounds = [(1.5e-3, 2e9), (2.4e-3, 1e9), (2.2e-3, 1e9)]
    out = decode_floor(mc, batch=1, context=0, rounds=rounds)
    assert out["floor_ratios"] == [1.5, 1.2, 1.1]
    assert out["floor_ratio"] == 1.2  # the median ratio, not the median step over the median floor
    assert out["read_bandwidth"] == pytest.approx(1e9)
    assert out["floor_ms"] == pytest.approx(2e-3)


def test_read_bandwidth_is_a_plausible_rate():
    bw = read_bandwidth(nbytes=1 << 24, runs=2)
    assert 1e8 < bw < 1e13
