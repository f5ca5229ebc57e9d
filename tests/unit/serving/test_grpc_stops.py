"""The gRPC edge's follower of ensemble requests (front/grpc_stops.py): ids assigned and taken
off again, requests followed until their FINAL or error, stops for the rest."""

from __future__ import annotations

from bucketserve.serving.front.grpc_stops import StreamFollower
from tritonclient.grpc import service_pb2 as pb


def request(model: str, rid: str = "") -> tuple[pb.ModelInferRequest, bytes]:
    req = pb.ModelInferRequest(model_name=model, id=rid)
    return req, req.SerializeToString()


def answer(rid: str, final: bool = False, error: str = "") -> bytes:
    resp = pb.ModelStreamInferResponse(error_message=error)
    resp.infer_response.id = rid
    resp.infer_response.parameters["triton_final_response"].bool_param = final
    return resp.SerializeToString()


def test_only_ensemble_requests_are_followed_and_bls_bytes_pass_unchanged():
    f = StreamFollower()
    req, raw = request("bucketserve_bls")
    assert f.request(req, raw) is raw and f.live == {}
    assert f.response(answer("x")) == answer("x")  # nothing followed: not even parsed
    assert f.stops() == []


def test_an_id_is_assigned_and_taken_off_the_answers():
    f = StreamFollower()
    req, raw = request("bucketserve")
    sent = pb.ModelInferRequest.FromString(f.request(req, raw))
    rid = sent.id
    assert rid.startswith("edge-") and list(f.live) == [rid]
    back = pb.ModelStreamInferResponse.FromString(f.response(answer(rid)))
    assert back.infer_response.id == "" and rid in f.live  # not final: still followed
    [stop] = f.stops()
    assert stop.id == rid and stop.model_name == "bucketserve"
    assert [t.name for t in stop.inputs] == ["text_input", "stop"]
    f.response(answer(rid, final=True))
    assert f.live == {} and f.stops() == []


def test_a_client_id_is_kept_and_an_error_ends_the_request():
    f = StreamFollower()
    for rid in ("a", "b"):
        req, raw = request("bucketserve", rid)
        assert f.request(req, raw) == raw
    assert f.response(answer("a")) == answer("a")
    f.response(answer("a", error="scheduler: boom"))
    assert [s.id for s in f.stops()] == ["b"]
