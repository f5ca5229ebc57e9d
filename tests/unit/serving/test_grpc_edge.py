"""The public gRPC port (front/grpc_edge.py) in front of a stand-in Triton: the allow-list per
method and per model in Triton's own words, bytes forwarded unchanged, streams answered as they
come, a client's cancel reaching upstream, the port's flag named when it is taken."""

from __future__ import annotations

import queue
import socket
import time

import grpc
import pytest
from bucketserve.serving.front.allowlist import GRPC_GROUPS, AccessPolicy
from bucketserve.serving.front.grpc_edge import (
    UNREACHABLE,
    BadRequest,
    GrpcEdge,
    method_of,
    refused_answer,
    requested_model,
    status_of,
)
from bucketserve.serving.launch.ports import Port, PortUnavailable, free_port
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from tests.unit.serving.grpc_upstream import GrpcUpstream

ADMIN, KEY = "s3cret-admin", "k3y-for-clients"
AUTH = (("triton-grpc-protocol-api-key", KEY),)
AS_ADMIN = (("triton-grpc-protocol-admin-key", ADMIN),)


def test_the_model_is_read_as_protobuf_reads_it():
    raw = pb.ModelInferRequest(model_name="bucketserve", id="1").SerializeToString()
    assert requested_model("ModelInfer", raw) == "bucketserve"
    assert requested_model("ModelStreamInfer", raw) == "bucketserve"
    for method, cls in (("ModelMetadata", pb.ModelMetadataRequest), ("ModelReady", pb.ModelReadyRequest),
                        ("ModelConfig", pb.ModelConfigRequest),
                        ("ModelStatistics", pb.ModelStatisticsRequest)):  # fmt: skip
        assert requested_model(method, cls(name="m", version="1").SerializeToString()) == "m"
    # a name sent twice: the last one is the one Triton's parser keeps, so is it here
    twice = raw + pb.ModelInferRequest(model_name="prefill_0").SerializeToString()
    assert requested_model("ModelInfer", twice) == "prefill_0"
    assert requested_model("ServerLive", b"anything") is None
    with pytest.raises(BadRequest):
        requested_model("ModelInfer", b"\x0a\xff")  # a length past the end


def test_every_method_of_the_service_has_a_group():
    from tritonclient.grpc import service_pb2

    names = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods_by_name
    assert set(names) == set(GRPC_GROUPS)
    assert method_of("/inference.GRPCInferenceService/ModelInfer") == "ModelInfer"
    assert method_of("/inference.GRPCInferenceService/Nope") is None
    assert method_of("/grpc.health.v1.Health/Check") is None


def test_check_rpc_rules():
    policy = AccessPolicy(admin_key=ADMIN)
    assert policy.check_rpc("ModelInfer", "bucketserve", {}) is None
    assert policy.check_rpc("ModelStreamInfer", None, {}) is None
    assert policy.check_rpc("ServerMetadata", None, {}) is None
    r = policy.check_rpc("ModelMetadata", "prefill_0", {})
    assert (r.status, r.message) == (404, "Request for unknown model: 'prefill_0' is not found")
    assert status_of("ModelMetadata", r) == grpc.StatusCode.NOT_FOUND
    # read-only views of every model: perf_analyzer reads an ensemble's steps and statistics
    assert policy.check_rpc("ModelStatistics", "scheduler", {}) is None
    assert policy.check_rpc("ModelStatistics", "", {}) is None  # every model's
    assert policy.check_rpc("ModelConfig", "preprocessing", {}) is None
    r = policy.check_rpc("ModelReady", "decode_0", {})
    assert (r.status, r.message) == (404, "Request for unknown model: 'decode_0' is not found")
    for method in ("SystemSharedMemoryRegister", "CudaSharedMemoryStatus", "RepositoryIndex",
                   "RepositoryModelLoad", "TraceSetting", "LogSettings"):  # fmt: skip
        r = policy.check_rpc(method, None, {})
        assert r.status == 403 and status_of(method, r) == grpc.StatusCode.UNAVAILABLE
        assert (
            r.message
            == "This protocol is restricted, expecting header 'triton-grpc-protocol-admin-key'"
        )
        assert policy.check_rpc(method, None, {"triton-grpc-protocol-admin-key": "wrong-key"})
        assert policy.check_rpc(method, None, dict(AS_ADMIN)) is None
    assert policy.check_rpc("ModelInfer", "decode_0", dict(AS_ADMIN)) is None  # operator's view
    assert AccessPolicy().check_rpc("LogSettings", None, dict(AS_ADMIN)).status == 403  # no key set


def test_check_rpc_api_key():
    policy = AccessPolicy(api_key=KEY, admin_key=ADMIN)
    for method in (
        "ModelInfer",
        "ModelStreamInfer",
        "ModelMetadata",
        "ModelConfig",
        "ServerMetadata",
    ):
        r = policy.check_rpc(method, "bucketserve", {})
        assert r.status == 401 and "triton-grpc-protocol-api-key" in r.message
        assert policy.check_rpc(method, "bucketserve", dict(AUTH)) is None
    for method in ("ServerLive", "ServerReady", "ModelReady"):  # health: never keyed
        assert policy.check_rpc(method, "bucketserve", {}) is None
    assert policy.check_rpc("ModelInfer", "prefill_0", dict(AUTH)).status == 404
    assert policy.check_rpc("ModelInfer", "bucketserve", dict(AS_ADMIN)) is None


def test_refused_answers_look_like_an_absent_model():
    r = AccessPolicy().check_rpc("ModelReady", "decode_0", {})
    assert pb.ModelReadyResponse.FromString(refused_answer("ModelReady", r, b"")).ready is False
    raw = pb.ModelInferRequest(model_name="decode_0", id="r7").SerializeToString()
    r = AccessPolicy().check_rpc("ModelStreamInfer", "decode_0", {})
    resp = pb.ModelStreamInferResponse.FromString(refused_answer("ModelStreamInfer", r, raw))
    assert resp.error_message == "Request for unknown model: 'decode_0' is not found"
    assert resp.infer_response.id == "r7"
    assert refused_answer("ModelInfer", r, raw) is None


@pytest.fixture
def edge():
    up = GrpcUpstream()
    up.start()
    rejected = []
    policy = AccessPolicy(public_models=frozenset({"m", "two", "stream"}), admin_key=ADMIN)
    edge = GrpcEdge(policy, up.target, "127.0.0.1", Port(0, "--grpc-port"),
                    metadata=AUTH, on_refusal=rejected.append)  # fmt: skip
    channel = grpc.insecure_channel(f"127.0.0.1:{edge.port}")
    yield service_pb2_grpc.GRPCInferenceServiceStub(channel), up, rejected
    up.release.set()
    channel.close()
    edge.stop(grace_s=0.5)
    up.stop()


def test_unary_calls_are_forwarded_or_refused(edge):
    stub, up, rejected = edge
    r = stub.ModelInfer(pb.ModelInferRequest(model_name="m", id="x1"))
    assert (r.model_name, r.id) == ("m", "x1")
    assert up.metadata[-1]["triton-grpc-protocol-api-key"] == KEY  # the edge's key upstream
    with pytest.raises(grpc.RpcError) as e:
        stub.ModelInfer(pb.ModelInferRequest(model_name="prefill_0", id="x2"))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    assert e.value.details() == "Request for unknown model: 'prefill_0' is not found"
    assert not stub.ModelReady(pb.ModelReadyRequest(name="scheduler")).ready
    assert [s.model_name for s in up.seen] == [] and len(up.metadata) == 1  # nothing went on
    with pytest.raises(grpc.RpcError) as e:
        stub.SystemSharedMemoryRegister(pb.SystemSharedMemoryRegisterRequest(name="x", key="/k"))
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE and "restricted" in e.value.details()
    with pytest.raises(grpc.RpcError) as e:  # with the admin key it goes on to Triton
        stub.SystemSharedMemoryStatus(pb.SystemSharedMemoryStatusRequest(), metadata=AS_ADMIN)
    assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED  # the stand-in has none
    assert rejected == ["not_found", "not_found", "restricted"]


def test_a_stream_mixes_forwarded_and_refused_answers(edge):
    stub, up, _ = edge
    reqs = [pb.ModelInferRequest(model_name="decode_0", id="bad"),
            pb.ModelInferRequest(model_name="two", id="ok")]  # fmt: skip
    answers = list(stub.ModelStreamInfer(iter(reqs)))
    assert answers[0].error_message == "Request for unknown model: 'decode_0' is not found"
    assert answers[0].infer_response.id == "bad"
    assert [a.infer_response.id for a in answers[1:]] == ["ok"] * 3
    assert [s.model_name for s in up.seen] == ["two"]


def test_stream_answers_arrive_one_by_one_and_cancel_reaches_upstream(edge):
    stub, up, _ = edge
    outbox: queue.Queue = queue.Queue()
    outbox.put(pb.ModelInferRequest(model_name="stream", id="s1"))
    call = stub.ModelStreamInfer(iter(outbox.get, None))
    first = next(call)  # the stand-in holds the request after three answers: no buffering
    assert first.infer_response.id == "s1" and not first.error_message
    next(call), next(call)
    assert not up.ended.is_set()
    call.cancel()
    assert up.ended.wait(5), "the upstream stream outlived the client's cancel"


def test_a_taken_port_names_its_flag():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        start = time.monotonic()
        with pytest.raises(PortUnavailable, match=rf"\(--grpc-port {port}\)"):
            GrpcEdge(AccessPolicy(), "127.0.0.1:1", "127.0.0.1", Port(port, "--grpc-port"))
        assert time.monotonic() - start < 10


def test_triton_down_is_unavailable_without_its_address():
    dead = f"127.0.0.1:{free_port()}"  # nothing listens: Triton starting or restarting
    edge = GrpcEdge(AccessPolicy(), dead, "127.0.0.1", Port(0, "--grpc-port"))
    channel = grpc.insecure_channel(f"127.0.0.1:{edge.port}")
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    try:
        for call in (lambda: stub.ModelInfer(pb.ModelInferRequest(model_name="bucketserve")),
                     lambda: list(stub.ModelStreamInfer(iter([pb.ModelInferRequest(model_name="bucketserve")])))):  # fmt: skip
            with pytest.raises(grpc.RpcError) as e:
                call()
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE
            assert e.value.details() == UNREACHABLE, e.value.details()
    finally:
        channel.close()
        edge.stop(grace_s=0)


def test_behind_the_edges_triton_listens_on_loopback_ports(tmp_path):
    """What `serve` starts: Triton's HTTP and gRPC on internal 127.0.0.1 ports, whatever --host
    is; the public --grpc-port is the edge's. Without internal ports (tests, benchmarks that
    put a LocalEdge in front) Triton keeps cfg's."""
    from bucketserve.serving.config import ServeConfig
    from bucketserve.serving.launch.launcher import TritonServer

    cfg = ServeConfig(host="0.0.0.0", grpc_port=18001, run_dir=str(tmp_path), model_dir="m")
    behind = TritonServer(cfg, triton_http_port=18100, triton_grpc_port=18101)
    args = behind.command(tmp_path, tmp_path, tmp_path / "tritonserver")
    assert "--grpc-address=127.0.0.1" in args and "--grpc-port=18101" in args
    assert "--http-address=127.0.0.1" in args and "--grpc-port=18001" not in args
    assert behind.grpc_url == "127.0.0.1:18101"
    assert [(h, p.port, p.flag) for h, p in behind.listeners()][:2] == [
        ("127.0.0.1", 18100, "the internal HTTP port"),
        ("127.0.0.1", 18101, "the internal gRPC port"),
    ]
    plain = TritonServer(cfg)
    assert "--grpc-address=0.0.0.0" in plain.command(tmp_path, tmp_path, tmp_path / "t")
    assert plain.grpc_url == "127.0.0.1:18001"  # a wildcard address is reached on loopback
