"""A small real gRPC server speaking Triton's inference protocol, standing in for tritonserver
behind the front: what it answers depends on the model name of the request."""

from __future__ import annotations

import threading
from concurrent import futures

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

INPUTS = (("text_input", "BYTES", [1]), ("max_tokens", "INT32", [1]), ("stream", "BOOL", [1]))
MODELS = ("m", "stream", "busy", "short", "whole", "two")


def text(values: list[str]) -> bytes:
    return b"".join(len(v.encode()).to_bytes(4, "little") + v.encode() for v in values)


def response(
    model: str, out: str, final: bool, reason: str = ""
) -> service_pb2.ModelStreamInferResponse:
    r = service_pb2.ModelInferResponse(model_name=model, model_version="1")
    r.outputs.add(name="text_output", datatype="BYTES", shape=[1])
    r.raw_output_contents.append(text([out]))
    r.outputs.add(name="finish_reason", datatype="BYTES", shape=[1])
    r.raw_output_contents.append(text([reason]))
    r.parameters["triton_final_response"].bool_param = final
    return service_pb2.ModelStreamInferResponse(infer_response=r)


def final_only(model: str) -> service_pb2.ModelStreamInferResponse:
    r = service_pb2.ModelInferResponse(model_name=model, model_version="1")
    r.parameters["triton_final_response"].bool_param = True
    return service_pb2.ModelStreamInferResponse(infer_response=r)


class Service(service_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self, upstream: GrpcUpstream) -> None:
        self.up = upstream

    def ModelMetadata(self, request, context):
        if request.name not in MODELS:
            context.abort(grpc.StatusCode.NOT_FOUND, f"Request for unknown model: '{request.name}'")
        meta = service_pb2.ModelMetadataResponse(name=request.name, versions=["1"])
        for name, dtype, shape in INPUTS:
            meta.inputs.add(name=name, datatype=dtype, shape=shape)
        return meta

    def ModelStreamInfer(self, request_iterator, context):
        request = next(request_iterator)
        self.up.seen.append(request)
        m = request.model_name
        if m == "busy":
            yield service_pb2.ModelStreamInferResponse(
                error_message="server busy: 4 requests are already waiting"
            )
            return
        if m == "m":  # one answer: the prompt's length, as text
            raw = request.raw_input_contents[0]
            yield response(m, str(len(raw) - 4), final=True, reason="stop")
            return
        if m in ("short", "whole"):  # the stream closes; only "whole" sends the FINAL flag
            yield response(m, "a", final=False)
            yield response(m, "b", final=(m == "whole"), reason="length" if m == "whole" else "")
            return
        if m == "two":  # two responses, then the flag alone
            yield response(m, "a", final=False)
            yield response(m, "b", final=False, reason="length")
            yield final_only(m)
            return
        finished = []  # a call ended before this is filled was cancelled by its client
        context.add_callback(lambda: finished or self.up.cancelled.set())
        for i in range(3):  # "stream": three tokens, then silence until released or killed
            yield response(m, f"t{i}", final=False)
        while not self.up.release.wait(0.02) and context.is_active():
            pass
        yield response(m, "end", final=True, reason="stop")
        finished.append(True)


class GrpcUpstream:
    """Serves on a free loopback port from a thread pool; stop() drops every open stream."""

    def __init__(self) -> None:
        self.seen: list = []
        self.release = threading.Event()
        self.cancelled = threading.Event()  # a "stream" call was cancelled by its client
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(Service(self), self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.target = f"127.0.0.1:{self.port}"

    def start(self) -> None:
        self.server.start()

    def stop(self) -> None:
        """What a killed tritonserver does to its clients: every open stream breaks."""
        self.server.stop(grace=None)
