"""Only the public API is public, on a real `bucketserve serve --api-key K --admin-key A`:
internal models absent and Triton's admin APIs closed without the admin key over the HTTP and
gRPC edges, the API key required on v2, OpenAI and gRPC, Triton's own ports on loopback only,
internal models refusing messages they did not seal even there (docs/security.md)."""

from __future__ import annotations

import json
import queue
import time

import numpy as np
import openai
import psutil
import pytest
import requests
import tritonclient.grpc as grpcclient
from bucketserve.serving.contract import GenerateParams
from bucketserve.serving.core.messages import Handoff, PrefillBatch, encode
from bucketserve.serving.launch.serve_process import ServeProcess, free_port
from tritonclient.utils import InferenceServerException

pytestmark = [pytest.mark.server, pytest.mark.timeout(900)]

API_KEY, ADMIN_KEY = "client-key-0123", "admin-key-4567"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
ADMIN = {"admin-key": ADMIN_KEY}
GRPC_AUTH = {"triton-grpc-protocol-api-key": API_KEY}
GRPC_ADMIN = {"triton-grpc-protocol-admin-key": ADMIN_KEY}
INTERNAL = ("prefill_0", "decode_0", "scheduler", "preprocessing", "decode_router")
SHM_REGION = {"key": "/bs_anything_p0_kv", "offset": 0, "byte_size": 64}
OPENAI_PORT = free_port()


@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    sp = ServeProcess(tmp_path_factory.mktemp("security") / "run", "--kv-cache-gb", "0.5",
                      "--max-model-len", "2048", "--openai-port", str(OPENAI_PORT),
                      # 1 prefill + 2 decode instances: `decode_router` exists only with
                      # several, and the pool-mapping checks need a prefill instance
                      "--topology", "disaggregated",
                      "--decode-devices", "cpu", "--decode-devices", "cpu",
                      "--api-key", API_KEY, "--admin-key", ADMIN_KEY,
                      # no canary: tests here compare prefill0's free blocks before and after
                      "--canary-interval-s", "0")  # fmt: skip
    sp.start()
    try:
        sp.wait_ready()
        yield sp
    finally:
        sp.stop()


def url(svc, path: str) -> str:
    return f"http://{svc.http_url}{path}"


def triton_grpc_url(svc) -> str:
    """Triton's own gRPC address, behind the gRPC edge (from its command line)."""
    args = psutil.Process(svc.server_pid()).cmdline()
    port = next(a for a in args if a.startswith("--grpc-port=")).split("=")[1]
    return f"127.0.0.1:{port}"


def grpc_generate(svc, headers: dict | None, model: str = "bucketserve") -> tuple[str, str]:
    """One streamed request over the public gRPC port (the edge): (text, error)."""
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(svc.grpc_url)
    inputs = [grpcclient.InferInput("text_input", [1], "BYTES"),
              grpcclient.InferInput("max_tokens", [1], "INT32")]  # fmt: skip
    inputs[0].set_data_from_numpy(np.array([b"Hi"], dtype=np.object_))
    inputs[1].set_data_from_numpy(np.int32([4]))
    client.start_stream(
        callback=lambda result, error: answers.put((result, error)), headers=headers
    )
    text, error = "", ""
    try:
        try:
            client.async_stream_infer(model, inputs, enable_empty_final_response=True)
        except InferenceServerException:  # a refused stream may close before this; the
            pass  # refusal itself comes through the callback
        while True:
            result, err = answers.get(timeout=60)
            if err is not None:
                error = str(err)
                break
            out = result.as_numpy("text_output")
            text += out.reshape(-1)[0].decode() if out is not None else ""
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
    finally:
        client.stop_stream()
        client.close()
    return text, error


def test_health_and_metrics_need_no_key(svc):
    assert requests.get(url(svc, "/v2/health/ready"), timeout=10).status_code == 200
    assert requests.get(url(svc, "/health"), timeout=10).json() == {"status": "ok"}
    assert "bucketserve_server_ready 1.0" in requests.get(url(svc, "/metrics"), timeout=10).text


def test_v2_and_openai_need_the_api_key(svc):
    body = {"text_input": "Hi", "max_tokens": 4}
    r = requests.post(url(svc, "/v2/models/bucketserve/generate"), json=body, timeout=120)
    assert r.status_code == 401 and "API key" in r.json()["error"]
    assert r.headers["WWW-Authenticate"] == "Bearer"
    r = requests.post(url(svc, "/v2/models/bucketserve/generate"), json=body, headers=AUTH,
                      timeout=120)  # fmt: skip
    assert r.status_code == 200 and r.json()["text_output"]
    base = f"http://127.0.0.1:{OPENAI_PORT}/v1"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=base, api_key="wrong-key").models.list()
    client = openai.OpenAI(base_url=base, api_key=API_KEY, timeout=300)
    c = client.completions.create(model="smollm2", prompt="The capital of France is",
                                  max_tokens=4, temperature=0)  # fmt: skip
    assert c.choices[0].text


def test_grpc_needs_the_api_key(svc):
    text, error = grpc_generate(svc, None)
    assert not text and "restricted" in error, error
    text, error = grpc_generate(svc, GRPC_AUTH)
    assert text and not error, error


@pytest.mark.parametrize("model", INTERNAL)
def test_internal_models_are_absent_at_the_edge(svc, model):
    for path in (f"/v2/models/{model}", f"/v2/models/{model}/generate",
                 f"/v2/models/{model}/infer", f"/v2/models/{model}/ready"):  # fmt: skip
        r = requests.post(url(svc, path), json={"input_ids": [1, 2, 3], "seq_lens": [3]},
                          headers=AUTH, timeout=30)  # fmt: skip
        assert r.status_code == 404, (path, r.status_code, r.text[:200])
        assert r.json() == {"error": f"Request for unknown model: '{model}' is not found"}


def test_shared_memory_is_closed_without_the_admin_key(svc):
    reg = "/v2/systemsharedmemory/region/x/register"
    for headers in ({}, AUTH, {**AUTH, "admin-key": "not-the-key"}):
        r = requests.post(url(svc, reg), json=SHM_REGION, headers=headers, timeout=10)
        assert r.status_code in (401, 403), r.text
        r = requests.post(url(svc, "/v2/cudasharedmemory/region/x/register"), json={},
                          headers=headers, timeout=10)  # fmt: skip
        assert r.status_code in (401, 403), r.text
    status = requests.get(url(svc, "/v2/systemsharedmemory/status"), headers=ADMIN, timeout=10)
    assert status.status_code == 200 and status.json() == []  # nothing was registered
    client = grpcclient.InferenceServerClient(svc.grpc_url)
    for headers in (None, GRPC_AUTH):
        with pytest.raises(InferenceServerException, match="restricted"):
            client.register_system_shared_memory("x", SHM_REGION["key"], 64, headers=headers)
        with pytest.raises(InferenceServerException, match="restricted"):
            client.get_system_shared_memory_status(headers=headers)
    assert client.get_system_shared_memory_status(headers=GRPC_ADMIN).regions == {}
    client.close()


def test_repository_trace_logging_are_closed_without_the_admin_key(svc):
    for method, path in (("POST", "/v2/repository/index"),
                         ("POST", "/v2/repository/models/bucketserve/unload"),
                         ("POST", "/v2/repository/models/prefill_0/load"),
                         ("GET", "/v2/trace/setting"), ("GET", "/v2/logging")):  # fmt: skip
        r = requests.request(method, url(svc, path), headers=AUTH, timeout=10)
        assert r.status_code == 403 and "administrator API" in r.json()["error"], r.text
    r = requests.post(url(svc, "/v2/repository/index"), headers=ADMIN, timeout=10)
    assert r.status_code == 200 and {m["name"] for m in r.json()} >= {"bucketserve", "prefill_0"}
    client = grpcclient.InferenceServerClient(svc.grpc_url)
    for call in (lambda h: client.get_model_repository_index(headers=h),
                 lambda h: client.unload_model("bucketserve", headers=h),
                 lambda h: client.get_log_settings(headers=h)):  # fmt: skip
        with pytest.raises(InferenceServerException, match="restricted"):
            call(GRPC_AUTH)
    client.close()
    assert svc.ready()  # nothing was unloaded


@pytest.mark.parametrize("model", INTERNAL)
def test_internal_models_are_absent_over_grpc(svc, model):
    """With the API key, over the public gRPC port: every call naming an internal model gets
    what Triton answers for a model it does not have, naming only the model asked for."""
    absent = f"Request for unknown model: '{model}' is not found"
    client = grpcclient.InferenceServerClient(svc.grpc_url)
    tensor = grpcclient.InferInput("input_ids", [3], "INT32")
    tensor.set_data_from_numpy(np.int32([1, 2, 3]))
    calls = (lambda: client.infer(model, [tensor], headers=GRPC_AUTH),
             lambda: client.get_model_metadata(model, headers=GRPC_AUTH))  # fmt: skip
    try:
        for call in calls:
            with pytest.raises(InferenceServerException) as e:
                call()
            assert e.value.status() == "StatusCode.NOT_FOUND" and e.value.message() == absent
        assert not client.is_model_ready(model, headers=GRPC_AUTH)
        # read-only views stay (perf_analyzer reads an ensemble's steps): no pool, key or path
        config = client.get_model_config(model, headers=GRPC_AUTH, as_json=True)["config"]
        assert config["name"] == model and "bs_" not in json.dumps(config)
    finally:
        client.close()
    text, error = grpc_generate(svc, GRPC_AUTH, model)
    assert not text and error == absent, error


def test_grpc_edge_serves_the_entry_models(svc):
    client = grpcclient.InferenceServerClient(svc.grpc_url)
    try:
        assert client.is_server_ready()  # health: no key
        meta = client.get_model_metadata("bucketserve", headers=GRPC_AUTH)
        assert "text_input" in {t.name for t in meta.inputs}
        assert client.is_model_ready("bucketserve_bls", headers=GRPC_AUTH)
    finally:
        client.close()
    text, error = grpc_generate(svc, GRPC_AUTH, "bucketserve_bls")
    assert text and not error, error


def test_triton_grpc_listens_on_loopback_only(svc):
    """Triton's gRPC is internal; the public --grpc-port is the launcher's (the gRPC edge)."""
    triton = psutil.Process(svc.server_pid())
    args = triton.cmdline()
    assert "--grpc-address=127.0.0.1" in args
    listening = {c.laddr.port: c.laddr.ip for c in triton.net_connections("tcp") if c.status == "LISTEN"}  # fmt: skip
    internal = int(triton_grpc_url(svc).rsplit(":", 1)[1])
    # gRPC binds an IPv6 socket where it can: 127.0.0.1 shows as ::ffff:127.0.0.1
    assert listening[internal] in ("127.0.0.1", "::ffff:127.0.0.1"), listening
    assert internal != svc.grpc_port
    assert svc.grpc_port not in listening
    launcher = psutil.Process(svc.proc.pid).net_connections("tcp")
    assert any(c.laddr.port == svc.grpc_port and c.status == "LISTEN" for c in launcher)


def test_triton_http_listens_on_loopback_only(svc):
    triton = psutil.Process(svc.server_pid())
    args = triton.cmdline()
    assert "--http-address=127.0.0.1" in args
    ports = {c.laddr.port: c.laddr.ip for c in triton.net_connections("tcp") if c.status == "LISTEN"}  # fmt: skip
    http_port = int(next(a for a in args if a.startswith("--http-port=")).split("=")[1])
    assert ports[http_port] == "127.0.0.1" and http_port != svc.http_port


def infer_internal(svc, model: str, inputs: dict, decoupled: bool) -> tuple[list, str]:
    """One direct call of an internal model on Triton's own (internal, loopback) gRPC port, as
    a local client with the API key could make it: (the responses' output tensors, the error
    text). The gRPC edge answers such calls itself (test_internal_models_are_absent_over_grpc);
    these check the seal behind it."""
    tensors = []
    for name, arr in inputs.items():
        t = grpcclient.InferInput(
            name, list(arr.shape), "BYTES" if arr.dtype == object else "INT32"
        )
        t.set_data_from_numpy(arr)
        tensors.append(t)
    client = grpcclient.InferenceServerClient(triton_grpc_url(svc))
    outs, error = [], ""
    try:
        if not decoupled:
            try:
                r = client.infer(model, tensors, headers=GRPC_AUTH)
                outs.append({o.name: r.as_numpy(o.name) for o in r.get_response().outputs})
            except InferenceServerException as e:
                error = str(e)
            return outs, error
        answers: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: answers.put((result, error)),
                            headers=GRPC_AUTH)  # fmt: skip
        client.async_stream_infer(model, tensors, enable_empty_final_response=True)
        while True:
            res, err = answers.get(timeout=120)
            if err is not None:
                return outs, str(err)
            resp = res.get_response()
            if resp.outputs:
                outs.append({o.name: res.as_numpy(o.name) for o in resp.outputs})
            if resp.parameters["triton_final_response"].bool_param:
                return outs, error
    finally:
        if decoupled:
            client.stop_stream()
        client.close()


def prefill_free_blocks(svc) -> tuple[float, float]:
    """(free, total) KV blocks of prefill0, from its gauges (updated every 0.25 s)."""
    text = requests.get(svc.metrics_url, timeout=10).text
    values = {}
    for kind in ("free", "total"):
        line = next(ln for ln in text.splitlines()
                    if ln.startswith(f"bucketserve_kv_blocks_{kind}{{") and 'instance="prefill0"' in ln)  # fmt: skip
        values[kind] = float(line.rsplit(" ", 1)[1])
    return values["free"], values["total"]


def bytes_of(raw: bytes) -> np.ndarray:
    return np.array([raw], dtype=np.object_)


def test_internal_models_refuse_messages_they_did_not_seal(svc):
    """Direct gRPC calls with well-formed messages built with the project's own classes (and,
    for decode, the real pool handle the prefill instance published) are refused before any
    work: no prefill block is taken, nothing answers with a pool name."""
    ids, lens = np.arange(1, 65, dtype=np.int32), np.asarray([64], dtype=np.int32)
    params = GenerateParams(request_id="x", num_input_tokens=64)
    handoff = Handoff("generate", params, prompt_ids=ids.tolist(), first_token=5,
                      prefill_index=0, handoff_id=0, block_ids=[0, 1, 2, 3])  # fmt: skip
    pool = (svc.run_dir / "kv" / "prefill0.json").read_text()  # what a message used to carry
    old_style = json.dumps({**json.loads(encode(handoff)), "pool": pool}).encode()
    forged_seal = b"bs1:" + b"0" * 32 + b":" + encode(handoff)
    calls = [
        (
            "prefill_0",
            {
                "input_ids": ids,
                "seq_lens": lens,
                "sampling": bytes_of(encode(PrefillBatch.of([params]))),
            },
            False,
        ),  # fmt: skip
        ("scheduler", {"_input_ids": ids, "_params": bytes_of(encode(params))}, True),
        *[
            (m, {"_handoff": bytes_of(raw)}, True)
            for m in ("decode_0", "decode_router")
            for raw in (encode(handoff), old_style, forged_seal)
        ],  # fmt: skip
    ]
    before = prefill_free_blocks(svc)  # an earlier test's hand-off may still hold a block
    for model, inputs, decoupled in calls:
        outs, error = infer_internal(svc, model, inputs, decoupled)
        assert outs == [] and "refused: not a message from this server" in error, (model, error)
        assert "bs_" not in error and "/dev/shm" not in error
    time.sleep(1.0)  # two gauge periods
    after = prefill_free_blocks(svc)  # a prefill of the 64 tokens would hold 4 blocks for 30 s
    assert after[1] == before[1] and after[0] >= before[0], (before, after)


def test_the_public_first_step_discloses_no_pool(svc):
    """`preprocessing` is the `bucketserve` ensemble's first step, so a client of Triton's own
    port can call it (a Triton ensemble step sees only client inputs; the gRPC edge does not
    let it through); what it and the scheduler then answer names no pool, and the hand-off is
    the one the ensemble would pass on: decode_router serves it."""
    inputs = {"text_input": bytes_of(b"The capital of France is"),
              "max_tokens": np.asarray([4], dtype=np.int32)}  # fmt: skip
    (pre,), error = infer_internal(svc, "preprocessing", inputs, False)
    assert not error
    sched, error = infer_internal(svc, "scheduler", pre, True)
    assert not error and len(sched) == 1
    raw = sched[0]["_handoff"].reshape(-1)[0]
    assert b"bs_" not in raw and b"pool" not in raw and b"handoff_table" not in raw
    outs, error = infer_internal(svc, "decode_router", sched[0], True)
    assert not error and "".join(o["text_output"].reshape(-1)[0].decode() for o in outs)
