"""GenerationParams validation and the input tensors it builds (no server)."""

import re
from pathlib import Path

import numpy as np
import pytest
from bucketserve_client.params import GenerationParams, build_inputs, stop_inputs

from tests.unit.client.client_fakes import input_values

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_tokens": 0}, r"max_tokens must be in \[1, 2147483647\], got 0"),
        ({"max_tokens": 1.5}, "max_tokens must be an integer"),
        ({"max_tokens": True}, "max_tokens must be an integer"),
        ({"temperature": -0.1}, r"temperature must be a finite number in \[0.0, inf\]"),
        ({"temperature": float("nan")}, "temperature must be a finite number"),
        ({"top_p": 0.0}, r"top_p must be in \(0, 1\], got 0.0"),
        ({"top_p": 1.5}, r"top_p must be a finite number in \[0.0, 1.0\]"),
        ({"top_k": -1}, r"top_k must be in \[0, "),
        ({"seed": -1}, r"seed must be in \[0, 9223372036854775807\]"),
        ({"seed": 2**63}, "seed must be in"),
        ({"max_tokens": 4, "min_tokens": 5}, r"min_tokens must be in \[0, 4\], got 5"),
        ({"stop_words": ["ok", ""]}, "stop_words must be non-empty strings"),
        ({"apply_chat_template": 1}, "apply_chat_template must be True or False"),
        ({"slo_class": "batch"}, "slo_class must be one of"),
        ({"ttft_slo_ms": 0.0}, "ttft_slo_ms must be > 0"),
        ({"tpot_slo_ms": -1.0}, r"tpot_slo_ms must be a finite number in \[0.0, inf\]"),
    ],
)
def test_invalid_params_name_field_and_limit(kwargs, message):
    with pytest.raises(ValueError, match=message):
        GenerationParams(**kwargs)


def test_defaults_send_only_the_contract_minimum():
    inputs = build_inputs("hi", GenerationParams(), stream=False)
    names = sorted(i.name() for i in inputs)
    assert names == sorted(
        [
            "text_input",
            "stream",
            "return_num_input_tokens",
            "return_num_output_tokens",
            "apply_chat_template",
        ]
    )


def all_params() -> GenerationParams:
    return GenerationParams(
        max_tokens=16, temperature=0, top_p=0.9, top_k=40, seed=2**63 - 1, min_tokens=2,
        stop_words=("\n\n", "END"), apply_chat_template=True, exclude_input_in_output=True,
        slo_class="offline", ttft_slo_ms=500, tpot_slo_ms=50.5,
    )  # fmt: skip


def server_contract() -> dict[str, tuple[str, list[int]]]:
    """name -> (datatype, dims) of the server's inputs, as the model configs declare them."""
    from bucketserve.serving.contract import input_declarations

    text = input_declarations()
    rows = re.findall(r'name: "(\w+)" data_type: TYPE_(\w+) dims: \[ ([-\d, ]+) \]', text)
    dtype = {"STRING": "BYTES"}
    return {n: (dtype.get(t, t), [int(d) for d in dims.split(",")]) for n, t, dims in rows}


def test_every_input_matches_the_server_contract():
    contract = server_contract()
    inputs = build_inputs("What is the capital of France?", all_params(), stream=True)
    assert len(inputs) == 16
    for tensor in inputs:
        datatype, dims = contract[tensor.name()]
        assert tensor.datatype() == datatype, tensor.name()
        assert tensor.shape() == ([2] if dims == [-1] else dims), tensor.name()


def test_input_values_survive_serialisation():
    values = input_values(build_inputs("What is the capital of France?", all_params(), True))
    assert values["text_input"][0] == b"What is the capital of France?"
    assert values["temperature"].dtype == np.float32 and values["temperature"][0] == 0.0
    assert values["seed"][0] == 2**63 - 1
    assert list(values["stop_words"]) == [b"\n\n", b"END"]
    assert values["stream"][0] and values["apply_chat_template"][0]
    assert values["slo_class"][0] == b"offline"


def test_prompt_must_not_be_empty():
    with pytest.raises(ValueError, match="prompt"):
        build_inputs("  ", GenerationParams(), stream=False)


def test_stop_request_carries_stop_true():
    values = input_values(stop_inputs())
    assert values["stop"][0] and values["stop"].dtype == np.bool_
    assert set(values) == {"text_input", "stop"}  # text_input is required by the ensemble
