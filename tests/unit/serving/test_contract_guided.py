"""Structured output at the boundary: every convention's guide becomes SamplingParams' guide,
bad ones name the field, OpenAI's response_format becomes vLLM's structured_outputs."""

from __future__ import annotations

import json

import numpy as np
import pytest
from bucketserve.serving.contract import parse_params
from bucketserve.serving.core.messages import PrefillBatch, decode, encode
from bucketserve.serving.openai.protocol import ChatRequest, OpenAIError

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def vllm(params: dict) -> dict[str, np.ndarray]:
    return {"text_input": np.array([b"Hi"], dtype=np.object_),
            "sampling_parameters": np.array([json.dumps(params).encode()], dtype=np.object_)}  # fmt: skip


def trtllm(kind: str, guide: str | None = None) -> dict[str, np.ndarray]:
    inputs = {"text_input": np.array([[b"Hi"]], dtype=np.object_),
              "guided_decoding_guide_type": np.array([[kind.encode()]], dtype=np.object_)}  # fmt: skip
    if guide is not None:
        inputs["guided_decoding_guide"] = np.array([[guide.encode()]], dtype=np.object_)
    return inputs


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"guided_json": SCHEMA}, ("json", json.dumps(SCHEMA))),
        ({"guided_json": json.dumps(SCHEMA)}, ("json", json.dumps(SCHEMA))),
        ({"guided_regex": "[a-z]+"}, ("regex", "[a-z]+")),
        ({"guided_choice": ["yes", "no"]}, ("choice", '["yes", "no"]')),
        ({"guided_grammar": 'root ::= "a"'}, ("grammar", 'root ::= "a"')),
        ({"structured_outputs": {"json": SCHEMA}}, ("json", json.dumps(SCHEMA))),
        ({"structured_outputs": {"json_object": True}}, ("json_object", "")),
        ({"guided_decoding": {"regex": "x+"}}, ("regex", "x+")),
        ({"guided_decoding": {"choice": ["a"]}}, ("choice", '["a"]')),
    ],
)
def test_vllm_guides(params, expected):
    s = parse_params(vllm(params), 16).sampling
    assert (s.guide_type, s.guide) == expected


@pytest.mark.parametrize(
    ("kind", "guide", "expected"),
    [
        ("json_schema", json.dumps(SCHEMA), ("json", json.dumps(SCHEMA))),
        ("json", None, ("json_object", "")),
        ("regex", "[0-9]+", ("regex", "[0-9]+")),
        ("ebnf_grammar", 'root ::= "a"', ("grammar", 'root ::= "a"')),
    ],
)
def test_trtllm_guides(kind, guide, expected):
    s = parse_params(trtllm(kind, guide), 16).sampling
    assert (s.guide_type, s.guide) == expected


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        (vllm({"guided_json": SCHEMA, "guided_regex": "a"}), "only one guide per request"),
        (
            vllm({"structured_outputs": "json"}),
            "sampling_parameters.structured_outputs must be an object",
        ),  # fmt: skip
        (vllm({"guided_regex": 5}), "sampling_parameters.guided_regex must be a non-empty string"),
        (
            trtllm("structural_tag", "{}"),
            "guided_decoding_guide_type='structural_tag' is not supported",
        ),  # fmt: skip
        (trtllm("regex"), "guided_decoding_guide must not be empty for guide type 'regex'"),
        (
            {"guided_decoding_guide": np.array([b"x"], dtype=np.object_)},
            "needs guided_decoding_guide_type",
        ),  # fmt: skip
        ({**trtllm("regex", "a"), **vllm({"guided_regex": "b"})}, "only one guide per request"),
    ],
)
def test_bad_guides_name_the_field(inputs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        parse_params(inputs, 16)


def test_guide_travels_to_prefill_and_decode():
    p = parse_params(vllm({"guided_json": SCHEMA}), 16)
    assert decode(PrefillBatch, encode(PrefillBatch.of([p]))).sampling == [p.sampling]


def chat(response_format=None, **extra) -> ChatRequest:
    return ChatRequest(model="m", messages=[{"role": "user", "content": "x"}],
                       response_format=response_format, **extra)  # fmt: skip


def test_openai_response_format_maps_to_structured_outputs():
    rf = {"type": "json_schema", "json_schema": {"name": "n", "schema": SCHEMA, "strict": True}}
    assert chat(rf).sampling(8, None)["structured_outputs"] == {"json": SCHEMA}
    assert chat({"type": "json_object"}).sampling(8, None)["structured_outputs"] == {"json_object": True}  # fmt: skip
    assert "structured_outputs" not in chat({"type": "text"}).sampling(8, None)
    assert chat(guided_regex="a+").sampling(8, None)["guided_regex"] == "a+"  # vLLM extra_body


@pytest.mark.parametrize(
    ("rf", "message"),
    [
        ({"type": "xml"}, "response_format type 'xml' is not supported"),
        ({"type": "json_schema"}, "response_format.json_schema.schema must be a JSON schema"),
        ({"type": "json_schema", "json_schema": {"name": "n", "schema": "x"}}, "schema must be"),
    ],
)
def test_openai_bad_response_format_is_400(rf, message):
    with pytest.raises(OpenAIError, match=message) as e:
        chat(rf).check()
    assert e.value.status == 400 and e.value.param == "response_format"
