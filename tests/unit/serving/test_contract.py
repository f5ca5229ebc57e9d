"""The tensor contract: both stock conventions parse into one record; bad values name the input."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from bucketserve.serving.contract import (
    INPUTS,
    GenerateParams,
    input_declarations,
    output_declarations,
    parse_params,
)
from bucketserve.serving.core.messages import Handoff, PackedDelta, PrefillBatch, decode, encode


def t(value, dtype, batched: bool = False) -> np.ndarray:
    arr = np.array([value], dtype=dtype)
    return arr.reshape(1, 1) if batched else arr


def trtllm(**extra) -> dict[str, np.ndarray]:
    """What TensorRT-LLM's end-to-end client sends: every tensor [1, 1]."""
    inputs = {
        "text_input": t(b"Hello", np.object_, True),
        "max_tokens": t(12, np.int32, True),
        "bad_words": np.array([[b""]], dtype=np.object_),
        "stop_words": np.array([[b"END", b""]], dtype=np.object_),
        "end_id": t(2, np.int32, True),
        "pad_id": t(2, np.int32, True),
        "beam_width": t(1, np.int32, True),
        "num_return_sequences": t(1, np.int32, True),
        "temperature": t(0.5, np.float32, True),
        "random_seed": t(7, np.uint64, True),
        "repetition_penalty": t(1.1, np.float32, True),
        "presence_penalty": t(0.5, np.float32, True),
        "frequency_penalty": t(0.25, np.float32, True),
        "return_log_probs": t(True, np.bool_, True),
        "stream": t(True, np.bool_, True),
    }
    return {**inputs, **extra}


def test_trtllm_inputs_are_honoured():
    p = parse_params(trtllm(), default_max_tokens=64)
    s = p.sampling
    assert (s.max_tokens, s.temperature, s.seed) == (12, 0.5, 7)
    assert s.stop_token_ids == (2,) and s.ignore_eos  # end_id replaces the model's EOS
    assert s.repetition_penalty == pytest.approx(1.1) and s.presence_penalty == 0.5
    assert s.frequency_penalty == 0.25 and s.logprobs == 0
    assert p.stream and p.stop_words == ["END"]


def test_vllm_sampling_parameters_json():
    params = {"temperature": "0.2", "top_p": 0.9, "max_tokens": 5, "stop": "\n", "logprobs": 3,
              "n": 1, "seed": 11, "user": "ignored", "presence_penalty": 0.1}  # fmt: skip
    inputs = {
        "text_input": t(b"Hi", np.object_),
        "sampling_parameters": t(json.dumps(params).encode(), np.object_),
        "return_logprobs": t(True, np.bool_),
    }
    p = parse_params(inputs, default_max_tokens=64)
    s = p.sampling
    assert (s.temperature, s.top_p, s.max_tokens, s.seed, s.logprobs) == (0.2, 0.9, 5, 11, 3)
    assert p.stop_words == ["\n"] and s.presence_penalty == pytest.approx(0.1)


@pytest.mark.parametrize(
    ("name", "value", "dtype", "message"),
    [
        ("beam_width", 4, np.int32, r"beam_width=4 is not supported; supported: 1"),
        ("num_return_sequences", 2, np.int32, r"num_return_sequences=2 is not supported"),
        ("return_context_logits", True, np.bool_, r"return_context_logits=True is not supported"),
        ("presence_penalty", 3.0, np.float32, r"presence_penalty must be in \[-2.0, 2.0\]"),
        ("repetition_penalty", 0.0, np.float32, r"repetition_penalty must be in \(0, 10\]"),
    ],
)
def test_unsupported_values_name_the_input(name, value, dtype, message):
    with pytest.raises(ValueError, match=message):
        parse_params(trtllm(**{name: t(value, dtype, True)}), default_max_tokens=64)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"n": 2}, r"sampling_parameters.n=2 is not supported"),
        ({"use_beam_search": True}, r"sampling_parameters.use_beam_search"),
        ({"logit_bias": {"1": 2}}, r"sampling_parameters.logit_bias is not supported"),
        ({"logprobs": 21}, r"logprobs must be in \[0, 20\]"),
        ({"stop": 5}, r"sampling_parameters.stop must be a string or a list"),
        ({"top_p": "x"}, r"sampling_parameters.top_p must be a number"),
    ],
)
def test_unsupported_vllm_parameters(params, message):
    inputs = {"text_input": t(b"Hi", np.object_),
              "sampling_parameters": t(json.dumps(params).encode(), np.object_)}  # fmt: skip
    with pytest.raises(ValueError, match=message):
        parse_params(inputs, default_max_tokens=64)


def test_min_length_alias_and_defaults():
    p = parse_params({"min_length": t(3, np.int32)}, default_max_tokens=9)
    assert (p.sampling.min_tokens, p.max_tokens, p.sampling.logprobs) == (3, 9, None)


def test_record_round_trips_through_json_unchanged():
    p = parse_params(trtllm(bad_words=np.array([[b"x"]], dtype=np.object_)), 64)
    p.request_id = "r1"
    h = Handoff("generate", p, prompt_ids=[1, 2], first_logprob=[-0.5, [3], [-0.4]])
    back = decode(Handoff, encode(h))
    assert back == h and back.first_logprob == [-0.5, [3], [-0.4]]
    batch = PrefillBatch.of([p, GenerateParams()])
    assert decode(PrefillBatch, encode(batch)).sampling == [p.sampling, GenerateParams().sampling]


def test_declarations_cover_the_table():
    text = input_declarations()
    names = re.findall(r'name: "(\w+)" data_type: TYPE_\w+ dims: \[ -?1 \] optional: true', text)
    assert names == [i.name for i in INPUTS]
    assert "output_log_probs" in output_declarations()


def test_packed_delta_round_trips_through_json():
    entries = [{"42": {"logprob": -0.5, "rank": 1, "decoded_token": "ü\u2028"}}]
    d = PackedDelta("héllo\u2028 wörld", "length", 7, 3, entries, -0.5, 32)
    raw = encode(d)  # as it travels: a BYTES tensor
    assert decode(PackedDelta, raw) == d
    empty = PackedDelta("", "", 0, 0)
    assert decode(PackedDelta, encode(empty)) == empty


def test_cache_salt_from_its_tensor_or_sampling_parameters_and_validated():
    assert parse_params({}, 64).cache_salt is None
    p = parse_params({"cache_salt": t(b"tenant-a", np.object_)}, 64)
    assert p.cache_salt == "tenant-a" and decode(GenerateParams, encode(p)) == p
    raw = json.dumps({"cache_salt": "tenant-b", "max_tokens": 3}).encode()
    p = parse_params({"sampling_parameters": t(raw, np.object_)}, 64)
    assert (p.cache_salt, p.max_tokens) == ("tenant-b", 3)
    with pytest.raises(ValueError, match="cache_salt must be a non-empty string of at most 256"):
        parse_params({"cache_salt": t(b"x" * 300, np.object_)}, 64)
    raw = json.dumps({"cache_salt": 7}).encode()
    with pytest.raises(ValueError, match="cache_salt must be a non-empty string"):
        parse_params({"sampling_parameters": t(raw, np.object_)}, 64)
