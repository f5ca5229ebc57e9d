"""Workload generation: seed determinism, length statistics, real text of the drawn length."""

from __future__ import annotations

import re

import numpy as np
import pytest
from bucketserve.bench.textsource import TextSource, load_tokenizer, stdlib_documents
from bucketserve.bench.workloads import LengthDist, build_requests, sample_lengths, source, workload


def test_alpaca_lengths_match_the_published_statistics():
    dist = source("alpaca", "paper").input
    x = dist.sample(np.random.default_rng(0), 40_000)
    assert abs(np.median(x) - 69) / 69 < 0.03
    assert abs(x.mean() - 83.7) / 83.7 < 0.03


def test_longbench_is_truncated_to_the_stated_cap():
    src = source("longbench", "cpu", input_cap=1500)
    x = src.input.sample(np.random.default_rng(1), 2000)
    assert x.max() == 1500 and x.min() >= src.input.low
    assert 0.1 < (x == 1500).mean() < 0.4  # scaled shape: median 900, a tail at the cap
    assert abs(np.median(x) - 900) / 900 < 0.05


def test_mixed_has_the_stated_share_of_long_requests():
    wl = workload("mixed", "cpu")
    which, ins, _ = sample_lengths(wl, 5000, seed=3)
    assert abs((which == 1).mean() - 0.2) < 0.02
    assert ins[which == 1].mean() > 5 * ins[which == 0].mean()


@pytest.mark.parametrize("name", ["alpaca", "longbench", "mixed", "sharegpt"])
def test_lengths_are_deterministic_for_a_seed(name):
    wl = workload(name, "cpu")
    a = sample_lengths(wl, 200, seed=7)
    b = sample_lengths(wl, 200, seed=7)
    c = sample_lengths(wl, 200, seed=8)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not np.array_equal(a[1], c[1])


def test_outputs_respect_the_cap():
    wl = workload("sharegpt", "cpu")
    _, _, outs = sample_lengths(wl, 3000, seed=0)
    assert outs.max() <= wl.sources[0].output.high and outs.min() >= 1


def test_length_dist_validates():
    with pytest.raises(ValueError, match="median"):
        LengthDist(100, 50, 1, 10)
    with pytest.raises(ValueError, match="workload"):
        workload("nope")


def test_corpus_is_stdlib_prose():
    docs = stdlib_documents()
    assert len(docs) > 100
    assert any("identifier" in d for d in docs[:100])


@pytest.fixture(scope="module")
def text():
    # the served model's tokenizer (converted on first use): a failure here is a real failure
    return TextSource.build(load_tokenizer(), max_tokens=30_000)


def test_prompts_are_real_text_of_the_drawn_length(text):
    reqs = build_requests(workload("mixed", "cpu", input_cap=600), 40, seed=11, text=text)
    _, ins, outs = sample_lengths(workload("mixed", "cpu", input_cap=600), 40, seed=11)
    for r, n_in, n_out in zip(reqs, ins, outs, strict=True):
        assert abs(r.input_tokens - n_in) <= 2
        assert abs(text.count(r.prompt) - n_in) <= 2
        assert r.output_tokens == n_out
        words = re.findall(r"[A-Za-z]+", r.prompt)
        assert len(words) >= 0.3 * r.input_tokens  # English words, not id soup
    common = {"the", "a", "is", "of", "to"}
    assert all(common & {w.lower() for w in re.findall(r"[A-Za-z]+", r.prompt)} for r in reqs)


def test_requests_are_deterministic_for_a_seed(text):
    wl = workload("alpaca", "cpu")
    a = build_requests(wl, 10, seed=5, text=text)
    b = build_requests(wl, 10, seed=5, text=text)
    c = build_requests(wl, 10, seed=6, text=text)
    assert [r.prompt for r in a] == [r.prompt for r in b]
    assert [r.prompt for r in a] != [r.prompt for r in c]


def test_the_simulator_and_the_load_generator_share_one_length_model():
    from bucketserve.bench import workloads
    from bucketserve.sim import workload as sim

    paper = {name: workloads.source(name, "paper") for name in ("alpaca", "longbench")}
    assert sim.ALPACA_PROMPT is paper["alpaca"].input
    assert sim.ALPACA_OUTPUT is paper["alpaca"].output
    assert sim.LONGBENCH_PROMPT is paper["longbench"].input
    assert sim.LONGBENCH_OUTPUT is paper["longbench"].output
    # the cpu profile scales the shared outputs: Alpaca median 12 / mean 16 as measured runs drew
    cpu = workloads.source("alpaca", "cpu").output
    assert (cpu.median, cpu.mean) == (12, 16)


def test_phased_switches_its_long_share_every_phase():
    from bucketserve.bench.workloads import PHASE_LONG_SHARES, PHASE_REQUESTS

    wl = workload("phased", "cpu")
    which, _, _ = sample_lengths(wl, PHASE_REQUESTS * 400, seed=5)
    blocks = which.reshape(-1, PHASE_REQUESTS).mean(axis=1)  # share of long per phase
    assert abs(blocks[0::2].mean() - PHASE_LONG_SHARES[0]) < 0.02
    assert blocks[1::2].max() == PHASE_LONG_SHARES[1] == 0.0
    assert (sample_lengths(wl, 90, seed=5)[0] == which[:90]).all()  # a prefix of the same list


def test_a_sweep_run_can_name_its_own_prefix_cache_namespace():
    from bucketserve.bench.loadgen import LoadConfig, make_inputs
    from bucketserve.bench.workloads import BenchRequest

    req = BenchRequest(0, "alpaca", "hello", 1, 4, 2.0, 0.15)
    names = [t.name() for t in make_inputs(req, LoadConfig())]
    assert "cache_salt" not in names
    salted = {t.name(): t for t in make_inputs(req, LoadConfig(cache_salt="run-a"))}
    assert "cache_salt" in salted and "ttft_slo_ms" in salted
