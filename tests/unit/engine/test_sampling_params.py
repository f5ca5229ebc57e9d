"""SamplingParams validation: errors name the field and the limit."""

from __future__ import annotations

import pytest
from bucketserve.engine.sampling_params import SamplingParams


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": -1}, "temperature must be >= 0, got -1"),
        ({"temperature": float("nan")}, "temperature must be >= 0"),
        ({"top_p": 0}, r"top_p must be in \(0, 1\], got 0"),
        ({"top_p": 1.5}, r"top_p must be in \(0, 1\], got 1.5"),
        ({"top_k": -2}, "top_k must be >= -1"),
        ({"seed": -1}, "seed must be in"),
        ({"max_tokens": 0}, "max_tokens must be >= 1, got 0"),
        ({"min_tokens": 5, "max_tokens": 4}, r"min_tokens must be in \[0, max_tokens=4\], got 5"),
        ({"stop_token_ids": [-3]}, "stop_token_ids must be >= 0"),
    ],
)
def test_invalid_values_raise(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_defaults_and_flags():
    p = SamplingParams(temperature=0, top_k=-1, stop_token_ids=[3, 4])
    assert p.is_greedy and not p.uses_top_k and not p.uses_top_p
    assert p.stop_token_ids == (3, 4)
    assert SamplingParams(top_k=5, top_p=0.9).uses_top_k
