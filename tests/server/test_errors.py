"""Bad input gets a clear error naming the field and the limit; the server stays healthy."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient

from .helpers import generate

pytestmark = pytest.mark.server

OK = {"text_input": "Say hi.", "max_tokens": 4, "temperature": 0.0}


def grpc_call(server, inputs: list, model: str = "bucketserve") -> tuple[list, list[str]]:
    """One streaming gRPC request with raw InferInputs; returns (results, error messages)."""
    results, errors, done = [], [], threading.Event()

    def callback(result, error):
        if error is not None:
            errors.append(str(error))
            done.set()
            return
        response = result.get_response()
        if response.outputs:
            results.append(result)
        if response.parameters["triton_final_response"].bool_param:
            done.set()

    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=callback)
    try:
        client.async_stream_infer(model, inputs, enable_empty_final_response=True)
        assert done.wait(60), "no final response"
    finally:
        client.stop_stream()
        client.close()
    return results, errors


def tensor(name: str, value, dtype: str, shape=(1,)):
    t = grpcclient.InferInput(name, list(shape), dtype)
    t.set_data_from_numpy(
        np.asarray(value, dtype=np.object_ if dtype == "BYTES" else None).reshape(shape)
    )
    return t


@pytest.mark.parametrize("model", ["bucketserve", "bucketserve_bls"])
@pytest.mark.parametrize(
    "payload, expected",
    [
        ({"text_input": "", "max_tokens": 4}, "text_input must not be empty"),
        ({"text_input": "hi", "max_tokens": 0}, "max_tokens must be >= 1"),
        ({"text_input": "hi", "max_tokens": 5000}, "max_tokens=5000 exceeds the context"),
        ({"text_input": "word " * 3000, "max_tokens": 4}, "the context is 2048 tokens"),
        ({"text_input": "hi", "temperature": -1.0}, "temperature must be >= 0"),
        ({"text_input": "hi", "top_p": 1.5}, "top_p must be in (0, 1]"),
        (
            {"text_input": "hi", "max_tokens": 4, "min_tokens": 9},
            "min_tokens must be in [0, max_tokens=4]",
        ),
        ({"text_input": "hi", "slo_class": "batchy"}, "slo_class must be one of"),
    ],
)
def test_bad_values_name_field_and_limit(server, model, payload, expected):
    r = generate(server, payload, model=model)
    assert r.status_code >= 400, r.text
    assert expected in r.json()["error"], r.json()
    assert generate(server, OK, model=model).status_code == 200


def test_missing_text_input(server):
    _, errors = grpc_call(server, [tensor("max_tokens", np.int32([4]), "INT32")])
    assert errors and "text_input" in errors[0], errors
    assert generate(server, OK).status_code == 200


def test_wrong_dtype(server):
    _, errors = grpc_call(
        server,
        [tensor("text_input", [b"hi"], "BYTES"), tensor("max_tokens", np.float32([4]), "FP32")],
    )
    assert errors and "max_tokens" in errors[0] and "INT32" in errors[0], errors
    assert generate(server, OK).status_code == 200


def test_wrong_shape(server):
    _, errors = grpc_call(
        server,
        [
            tensor("text_input", [b"hi"], "BYTES"),
            tensor("max_tokens", np.int32([4, 5]), "INT32", shape=(2,)),
        ],
    )
    assert errors and "max_tokens" in errors[0], errors
    assert generate(server, OK).status_code == 200


def test_grpc_stream_ok_after_errors(server):
    results, errors = grpc_call(
        server,
        [
            tensor("text_input", [b"What is 2+2?"], "BYTES"),
            tensor("max_tokens", np.int32([6]), "INT32"),
            tensor("stream", np.bool_([True]), "BOOL"),
        ],
    )
    assert not errors and len(results) >= 1
    assert results[-1].as_numpy("finish_reason")[0] in (b"stop", b"length")


def test_bad_sampling_parameters_json(server):
    r = generate(server, {"text_input": "hi", "sampling_parameters": "{not json"})
    assert r.status_code >= 400 and "sampling_parameters" in r.json()["error"]
    r = generate(
        server, {"text_input": "hi", "sampling_parameters": '{"max_tokens": 3, "temperature": 0}'}
    )
    assert r.status_code == 200 and r.json()["num_output_tokens"] <= 3


def test_server_healthy_after_errors(server):
    assert requests.get(f"http://{server.http_url}/v2/health/ready", timeout=5).status_code == 200
