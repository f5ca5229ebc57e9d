"""Stock clients' request shapes, unchanged: TensorRT-LLM's ([1, 1] + its optional inputs, to
`ensemble` / `tensorrt_llm_bls`) and the vLLM backend's ([1] + sampling_parameters JSON, to
`bucketserve` / `bucketserve_bls`), over HTTP generate and gRPC streaming
(HTTP infer takes no decoupled model in Triton 2.51)."""

from __future__ import annotations

import json
import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from .helpers import generate

pytestmark = pytest.mark.server

PROMPT = "The capital of France is"  # no chat template: TensorRT-LLM clients send raw text
TRTLLM_MODELS = ("ensemble", "tensorrt_llm_bls")
VLLM_MODELS = ("bucketserve", "bucketserve_bls")


def trtllm_inputs(module, stream: bool, **extra) -> list:
    """As TensorRT-LLM's end_to_end_grpc_client.py builds them: every tensor [1, 1]."""
    values = {
        "text_input": np.array([[PROMPT.encode()]], dtype=np.object_),
        "max_tokens": np.array([[8]], dtype=np.int32),
        "bad_words": np.array([[b""]], dtype=np.object_),
        "stop_words": np.array([[b""]], dtype=np.object_),
        "end_id": np.array([[2]], dtype=np.int32),
        "pad_id": np.array([[2]], dtype=np.int32),
        "beam_width": np.array([[1]], dtype=np.int32),
        "num_return_sequences": np.array([[1]], dtype=np.int32),
        "temperature": np.array([[0.0]], dtype=np.float32),
        "repetition_penalty": np.array([[1.0]], dtype=np.float32),
        "return_log_probs": np.array([[True]], dtype=np.bool_),
        "return_num_input_tokens": np.array([[True]], dtype=np.bool_),
        "return_num_output_tokens": np.array([[True]], dtype=np.bool_),
        "stream": np.array([[stream]], dtype=np.bool_),
        **extra,
    }
    return [tensor(module, n, a) for n, a in values.items()]


def vllm_inputs(module, stream: bool, **sampling) -> list:
    """As the vLLM backend's clients (and Triton's OpenAI front end) send them: [1] tensors."""
    params = {"temperature": 0, "max_tokens": 8, **sampling}
    values = {
        "text_input": np.array([PROMPT.encode()], dtype=np.object_),
        "stream": np.array([stream], dtype=np.bool_),
        "sampling_parameters": np.array([json.dumps(params).encode()], dtype=np.object_),
        "exclude_input_in_output": np.array([True], dtype=np.bool_),
        "return_logprobs": np.array([True], dtype=np.bool_),
    }
    return [tensor(module, n, a) for n, a in values.items()]


def tensor(module, name: str, arr: np.ndarray):
    dtype = {np.object_: "BYTES", np.int32: "INT32", np.float32: "FP32", np.bool_: "BOOL"}
    t = module.InferInput(name, list(arr.shape), dtype[arr.dtype.type])
    t.set_data_from_numpy(arr)
    return t


def grpc_stream(server, model: str, inputs: list) -> list:
    """All responses of one gRPC streaming request; raises on an error response."""
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    client.async_stream_infer(model, inputs, enable_empty_final_response=True)
    out = []
    while True:
        result, error = results.get(timeout=300)  # a loaded 2-core machine is slow
        if error is not None:
            client.stop_stream()
            raise RuntimeError(str(error))
        if result.get_response().outputs:
            out.append(result)
        if result.get_response().parameters["triton_final_response"].bool_param:
            break
    client.stop_stream()
    return out


def text_of(results: list) -> str:
    return "".join(r.as_numpy("text_output").reshape(-1)[0].decode() for r in results)


@pytest.mark.parametrize("model", TRTLLM_MODELS)
def test_trtllm_client_grpc_whole_answer(server, model):
    (result,) = grpc_stream(server, model, trtllm_inputs(grpcclient, stream=False))
    assert result.as_numpy("text_output").shape == (1, 1)  # batch dimension first
    assert "Paris" in result.as_numpy("text_output")[0, 0].decode()
    n_out = int(result.as_numpy("num_output_tokens")[0, 0])
    log_probs = result.as_numpy("output_log_probs")
    assert log_probs.shape == (1, n_out) and (log_probs <= 0).all()
    assert result.as_numpy("cum_log_probs")[0, 0] == pytest.approx(log_probs.sum(), abs=1e-4)


@pytest.mark.parametrize("model", TRTLLM_MODELS)
def test_trtllm_client_grpc_stream(server, model):
    results = grpc_stream(server, model, trtllm_inputs(grpcclient, stream=True))
    assert len(results) >= 2 and "Paris" in text_of(results)


@pytest.mark.parametrize("model", VLLM_MODELS)
def test_vllm_client_grpc_stream(server, model):
    results = grpc_stream(server, model, vllm_inputs(grpcclient, stream=True))
    assert len(results) >= 2 and "Paris" in text_of(results)
    logprobs = [e for r in results for e in json.loads(r.as_numpy("logprobs")[0] or b"[]")]
    assert len(logprobs) == int(results[-1].as_numpy("num_output_tokens")[0])
    assert all(next(iter(e.values()))["logprob"] <= 0 for e in logprobs)


@pytest.mark.parametrize("model", VLLM_MODELS)
def test_vllm_client_whole_answer_equals_stream(server, model):
    (whole,) = grpc_stream(server, model, vllm_inputs(grpcclient, stream=False))
    streamed = text_of(grpc_stream(server, model, vllm_inputs(grpcclient, stream=True)))
    assert "Paris" in streamed and whole.as_numpy("text_output")[0].decode() == streamed


def test_http_infer_is_refused_for_decoupled_models(server):
    """Every entry model is decoupled (tokens stream), and Triton 2.51's HTTP `infer` takes no
    decoupled model: it answers 501, documented in the README; use generate or gRPC."""
    client = httpclient.InferenceServerClient(server.http_url)
    with pytest.raises(InferenceServerException, match="decoupled"):
        client.infer("bucketserve", vllm_inputs(httpclient, stream=False))


@pytest.mark.parametrize("model", TRTLLM_MODELS + VLLM_MODELS)
def test_http_generate_on_every_entry_model(server, model):
    body = {"text_input": PROMPT, "max_tokens": 8, "temperature": 0.0, "beam_width": 1,
            "end_id": 2, "pad_id": 2, "return_log_probs": True}  # fmt: skip
    r = generate(server, body, model=model)
    assert r.status_code == 200, r.text
    assert "Paris" in r.json()["text_output"]


@pytest.mark.parametrize("model", TRTLLM_MODELS + VLLM_MODELS)
def test_beam_width_4_is_rejected_by_name(server, model):
    r = generate(server, {"text_input": PROMPT, "max_tokens": 4, "beam_width": 4}, model=model)
    assert r.status_code == 400
    assert "beam_width=4 is not supported; supported: 1" in r.json()["error"]


def test_unsupported_inputs_name_themselves_over_grpc(server):
    bad = trtllm_inputs(grpcclient, False, num_return_sequences=np.array([[3]], dtype=np.int32))
    with pytest.raises(RuntimeError, match="num_return_sequences=3 is not supported"):
        grpc_stream(server, "tensorrt_llm_bls", bad)
    with pytest.raises(RuntimeError, match=r"sampling_parameters.n=2 is not supported"):
        grpc_stream(server, "bucketserve", vllm_inputs(grpcclient, False, n=2))
