"""Sequence bookkeeping and stop rules."""

from __future__ import annotations

import pytest
from bucketserve.engine.sampling_params import SamplingParams
from bucketserve.engine.sequence import Sequence, check_stop

EOS = (2,)


def _seq(params: SamplingParams, generated: list[int]) -> Sequence:
    seq = Sequence([5, 6, 7], params)
    for t in generated:
        seq.append_token(t)
    return seq


def test_counts_and_views():
    seq = _seq(SamplingParams(), [9, 10])
    assert seq.num_tokens == 5 and seq.num_prompt_tokens == 3 and seq.num_completion_tokens == 2
    assert seq.prompt_token_ids == [5, 6, 7] and seq.completion_token_ids == [9, 10]
    assert seq.last_token_id == 10


def test_empty_prompt_rejected():
    with pytest.raises(ValueError, match="at least 1 token"):
        Sequence([])


def test_eos_stops_unless_ignored_or_below_min_tokens():
    assert check_stop(_seq(SamplingParams(), [2]), EOS, 100) == "stop"
    assert check_stop(_seq(SamplingParams(ignore_eos=True), [2]), EOS, 100) is None
    assert check_stop(_seq(SamplingParams(min_tokens=2), [2]), EOS, 100) is None
    assert check_stop(_seq(SamplingParams(min_tokens=2), [4, 2]), EOS, 100) == "stop"


def test_stop_token_ids_and_length_limits():
    assert check_stop(_seq(SamplingParams(stop_token_ids=[9]), [9]), EOS, 100) == "stop"
    assert check_stop(_seq(SamplingParams(max_tokens=2), [4, 4]), EOS, 100) == "length"
    assert check_stop(_seq(SamplingParams(max_tokens=9), [4, 4]), EOS, 5) == "length"
    assert check_stop(_seq(SamplingParams(max_tokens=9), [4]), EOS, 100) is None
