"""Triton's generate JSON mapping, as the front applies it before the gRPC call."""

from __future__ import annotations

import numpy as np
import pytest
from bucketserve.serving.front.generate_json import InputSpec, fit_shape, to_request, to_response
from tritonclient.grpc import InferResult, service_pb2

SPECS = {
    s.name: s
    for s in (
        InputSpec("text_input", "BYTES", (1,)),
        InputSpec("max_tokens", "INT32", (1,)),
        InputSpec("stream", "BOOL", (1,)),
        InputSpec("temperature", "FP32", (1,)),
        InputSpec("seed", "UINT64", (1,)),
        InputSpec("stop_words", "BYTES", (-1,)),
        InputSpec("end_id", "INT32", (-1, 1)),  # a batching model's [1] input
    )
}


def by_name(inputs) -> dict:
    return {t.name: t for t in inputs}


def test_top_level_and_parameters_keys_become_inputs_or_parameters():
    doc = {"text_input": "hi", "max_tokens": 4, "user": "me",
           "parameters": {"temperature": 0.5, "stream": True, "note": 3, "f": 0.5}}  # fmt: skip
    inputs, params = to_request(doc, SPECS)
    t = by_name(inputs)
    assert sorted(t) == ["max_tokens", "stream", "temperature", "text_input"]
    assert t["text_input"].datatype == "BYTES" and t["text_input"].shape == (1,)
    assert t["max_tokens"].datatype == "INT32" and t["temperature"].datatype == "FP32"
    assert params == {"user": "me", "note": 3, "f": 0.5}


def test_shapes_follow_the_metadata_dims():
    inputs, _ = to_request({"stop_words": ["a", "b", "c"], "end_id": 2}, SPECS)
    t = by_name(inputs)
    assert t["stop_words"].shape == (3,)
    assert t["end_id"].shape == (1, 1)
    assert fit_shape(InputSpec("x", "INT32", (-1, 2)), 6) == (3, 2)
    assert fit_shape(InputSpec("x", "INT32", (-1, -1)), 4) == (1, 4)
    with pytest.raises(ValueError, match="do not fit its shape"):
        fit_shape(InputSpec("x", "INT32", (2,)), 3)


@pytest.mark.parametrize(
    "doc, expected",
    [
        ({"max_tokens": "4"}, "'max_tokens' must be an integer (an INT32 input)"),
        ({"max_tokens": True}, "'max_tokens' must be an integer"),
        ({"max_tokens": 2**31}, "'max_tokens' must be in [-2147483648, 2147483647]"),
        ({"seed": -1}, "'seed' must be in [0, 18446744073709551615]"),
        ({"stream": 1}, "'stream' must be true or false"),
        ({"temperature": "hot"}, "'temperature' must be a number"),
        ({"text_input": 5}, "'text_input' must be a string"),
        ({"text_input": [["nested"]]}, "'text_input' must be a value or a flat list"),
        ({"extra": [1]}, "'extra' is not an input of this model"),
        ({"max_tokens": 1, "parameters": {"max_tokens": 2}}, "'max_tokens' is given twice"),
        ({"parameters": [1]}, "'parameters' must be a JSON object"),
    ],
)
def test_bad_values_name_the_field(doc, expected):
    with pytest.raises(ValueError) as e:
        to_request(doc, SPECS)
    assert expected in str(e.value)


def test_the_body_must_be_an_object():
    with pytest.raises(ValueError, match="must be a JSON object"):
        to_request([1, 2], SPECS)


def test_values_reach_the_tensor_data():
    inputs, _ = to_request({"text_input": "héllo", "max_tokens": 7, "temperature": 1}, SPECS)
    raw = {t.name: t.raw() for t in inputs}  # the serialized tensor bytes
    assert raw["max_tokens"] == np.int32([7]).tobytes()
    assert raw["temperature"] == np.float32([1.0]).tobytes()
    assert raw["text_input"] == len("héllo".encode()).to_bytes(4, "little") + "héllo".encode()


def result(outputs: dict, params: dict) -> InferResult:
    """A real gRPC ModelInferResponse holding these outputs, as Triton sends it."""
    r = service_pb2.ModelInferResponse(model_name="m", model_version="1")
    for name, array in outputs.items():
        dtype = (
            "BYTES"
            if array.dtype == np.object_
            else {"int32": "INT32", "float32": "FP32"}[str(array.dtype)]
        )
        r.outputs.add(name=name, datatype=dtype, shape=list(array.shape))
        if dtype == "BYTES":
            r.raw_output_contents.append(
                b"".join(len(v).to_bytes(4, "little") + v for v in array.reshape(-1))
            )
        else:
            r.raw_output_contents.append(array.tobytes())
    for k, v in params.items():
        r.parameters[k].bool_param = v
    return InferResult(r)


def test_response_strips_one_element_arrays_and_the_final_flag():
    out = result(
        {"text_output": np.array([b"Paris"], dtype=np.object_),
         "num_output_tokens": np.int32([3]), "output_log_probs": np.float32([-0.5, -1.0])},
        {"triton_final_response": True},
    )  # fmt: skip
    doc = to_response(out, "bucketserve", "1")
    assert doc == {"model_name": "bucketserve", "model_version": "1", "text_output": "Paris",
                   "num_output_tokens": 3, "output_log_probs": [-0.5, -1.0]}  # fmt: skip
