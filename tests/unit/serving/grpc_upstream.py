"""A small real gRPC server speaking Triton's inference protocol, standing in for tritonserver
behind the front: many requests per stream, answers carry their request's id, and what it
answers depends on the model name."""

from __future__ import annotations

import queue
import threading
from concurrent import futures

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

INPUTS = (("text_input", "BYTES", [1]), ("max_tokens", "INT32", [1]), ("stop", "BOOL", [1]))
MODELS = ("m", "stream", "busy", "two")


def text(values: list[str]) -> bytes:
    return b"".join(len(v.encode()).to_bytes(4, "little") + v.encode() for v in values)


def answer(req, out: str | None, final: bool, reason: str = ""):
    r = service_pb2.ModelInferResponse(model_name=req.model_name, model_version="1", id=req.id)
    if out is not None:
        for name, value in (("text_output", out), ("finish_reason", reason)):
            r.outputs.add(name=name, datatype="BYTES", shape=[1])
            r.raw_output_contents.append(text([value]))
        if req.model_name == "bucketserve_bls":  # what the OpenAI routes read besides
            for name in ("num_input_tokens", "num_output_tokens"):
                r.outputs.add(name=name, datatype="INT32", shape=[1])
                r.raw_output_contents.append((1).to_bytes(4, "little"))
    r.parameters["triton_final_response"].bool_param = final
    return service_pb2.ModelStreamInferResponse(infer_response=r)


def is_stop(req) -> bool:
    names = [t.name for t in req.inputs]
    return "stop" in names and req.raw_input_contents[names.index("stop")] == b"\x01"


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

    def ModelInfer(self, request, context):
        self.up.metadata.append(dict(context.invocation_metadata()))
        return service_pb2.ModelInferResponse(model_name=request.model_name, id=request.id)

    def ModelStreamInfer(self, request_iterator, context):
        self.up.metadata.append(dict(context.invocation_metadata()))
        context.add_callback(self.up.ended.set)  # the stream ended: done, cancelled, or broken
        out: queue.Queue = queue.Queue()

        def read() -> None:
            try:
                for req in request_iterator:
                    self.up.seen.append(req)
                    threading.Thread(target=self.serve, args=(req, out.put), daemon=True).start()
            except grpc.RpcError:  # the client or the server closed the stream
                pass
            out.put(None)

        threading.Thread(target=read, daemon=True).start()
        while (resp := out.get()) is not None:
            yield resp

    def serve(self, req, send) -> None:
        m = req.model_name
        if is_stop(req):
            self.up.stopped.add(req.id)
            send(answer(req, "", final=True, reason="cancelled"))
        elif m == "busy":
            send(service_pb2.ModelStreamInferResponse(
                error_message="server busy: 4 requests are already waiting",
                infer_response=service_pb2.ModelInferResponse(id=req.id)))  # fmt: skip
        elif m == "m":  # one answer: the prompt's length, as text
            send(answer(req, str(len(req.raw_input_contents[0]) - 4), final=True, reason="stop"))
        elif m == "two":  # two answers, then the flag alone
            send(answer(req, "a", final=False))
            send(answer(req, "b", final=False, reason="length"))
            send(answer(req, None, final=True))
        else:  # "stream": three tokens, then nothing until stopped or released
            for i in range(3):
                send(answer(req, f"t{i}", final=False))
            while not self.up.release.wait(0.02) and req.id not in self.up.stopped:
                pass
            reason = "cancelled" if req.id in self.up.stopped else "stop"
            send(answer(req, "end", final=True, reason=reason))


class GrpcUpstream:
    """Serves on a free loopback port from a thread pool; stop() drops every open stream."""

    def __init__(self) -> None:
        self.seen: list = []
        self.stopped: set[str] = set()  # ids a stop request named
        self.release = threading.Event()
        self.metadata: list[dict] = []  # each call's invocation metadata
        self.ended = threading.Event()  # set when a stream ends, however it ends
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(Service(self), self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.target = f"127.0.0.1:{self.port}"

    def start(self) -> None:
        self.server.start()

    def stop(self) -> None:
        """What a killed tritonserver does to its clients: every open stream breaks."""
        self.server.stop(grace=None)
