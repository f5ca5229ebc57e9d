"""Fakes for the client unit tests: real InferResult objects and a scripted tritonclient."""

from __future__ import annotations

import numpy as np
from tritonclient.grpc import InferResult, service_pb2
from tritonclient.utils import (
    InferenceServerException,
    deserialize_bytes_tensor,
    serialize_byte_tensor,
    triton_to_np_dtype,
)


def make_result(text=None, reason=None, n_in=5, n_out=1, final=None, request_id="rid"):
    """An InferResult as tritonclient builds it from the server's ModelInferResponse."""
    resp = service_pb2.ModelInferResponse(model_name="bucketserve", id=request_id)
    for name, value in (("text_output", text), ("finish_reason", reason)):
        if value is not None:
            add_output(resp, name, "BYTES", np.array([value.encode()], dtype=np.object_))
    if text is not None or reason is not None:
        add_output(resp, "num_input_tokens", "INT32", np.array([n_in], dtype=np.int32))
        add_output(resp, "num_output_tokens", "INT32", np.array([n_out], dtype=np.int32))
    if final is not None:
        resp.parameters["triton_final_response"].bool_param = final
    return InferResult(resp)


def add_output(resp, name: str, datatype: str, arr: np.ndarray) -> None:
    out = resp.outputs.add()
    out.name, out.datatype = name, datatype
    out.shape.extend(arr.shape)
    raw = serialize_byte_tensor(arr).item() if datatype == "BYTES" else arr.tobytes()
    resp.raw_output_contents.append(raw)


def input_values(inputs) -> dict[str, np.ndarray]:
    """name -> numpy value of a list of InferInput, decoded from the bytes that would be sent."""
    values = {}
    for inp in inputs:
        content = inp._get_content()
        if inp.datatype() == "BYTES":
            arr = deserialize_bytes_tensor(content)
        else:
            arr = np.frombuffer(content, dtype=triton_to_np_dtype(inp.datatype()))
        values[inp.name()] = arr.reshape(inp.shape())
    return values


def generation(num_chunks: int, finish: bool) -> list:
    """The responses of one streaming generation: deltas, then a FINAL with finish_reason."""
    results = [
        make_result(text=f"t{i} ", reason="", n_out=i + 1, final=False) for i in range(num_chunks)
    ]
    if finish:
        results.append(make_result(text="", reason="length", n_out=num_chunks, final=True))
    return results


class FakeServer:
    """Scripts what tritonclient's streams deliver and records what the client did."""

    def __init__(self, num_chunks: int = 3, finish: bool = True, error: str | None = None) -> None:
        self.num_chunks = num_chunks
        self.finish = finish
        self.error = error
        self.requests: list[tuple[str, str, dict]] = []  # (model, request_id, inputs)
        self.stops: list[bool] = []  # cancel_requests of every stop_stream
        self.closed = 0

    def replies(self, model: str, request_id: str, values: dict) -> list:
        if self.error:
            return [(None, InferenceServerException(msg=self.error))]
        if "stop" in values:
            return [(make_result(text="", reason="cancelled", n_out=0, final=True), None)]
        return [(r, None) for r in generation(self.num_chunks, self.finish)]


class FakeGrpcClient:
    """Stands in for tritonclient.grpc.InferenceServerClient (one stream at a time)."""

    def __init__(self, server: FakeServer) -> None:
        self.server = server
        self.callback = None

    def start_stream(self, callback, stream_timeout=None):
        assert self.callback is None, "one stream at a time"
        self.callback = callback

    def async_stream_infer(
        self, model_name, inputs, request_id="", enable_empty_final_response=False
    ):
        assert enable_empty_final_response
        values = input_values(inputs)
        self.server.requests.append((model_name, request_id, values))
        for result, error in self.server.replies(model_name, request_id, values):
            self.callback(result=result, error=error)

    def stop_stream(self, cancel_requests=False):
        self.server.stops.append(cancel_requests)
        self.callback = None

    def close(self):
        self.server.closed += 1


class FakeAioCall:
    """What tritonclient.grpc.aio's stream_infer returns: an async iterator with cancel()."""

    def __init__(self, server: FakeServer, requests) -> None:
        import asyncio

        self.server = server
        self.queue: asyncio.Queue = asyncio.Queue()
        self.cancelled = False
        self.task = asyncio.get_running_loop().create_task(self.consume(requests))

    async def consume(self, requests) -> None:
        async for req in requests:
            assert req["parameters"] == {"triton_enable_empty_final_response": True}
            values = input_values(req["inputs"])
            self.server.requests.append((req["model_name"], req["request_id"], values))
            for item in self.server.replies(req["model_name"], req["request_id"], values):
                self.queue.put_nowait(item)
        self.queue.put_nowait(None)  # half-closed: the RPC ends once the replies are read

    def __aiter__(self):
        return self

    async def __anext__(self):
        item = await self.queue.get()
        if item is None:
            raise StopAsyncIteration
        return item

    def cancel(self) -> bool:
        self.cancelled = True
        self.server.stops.append(True)
        self.task.cancel()
        return True


class FakeAioClient:
    """Stands in for tritonclient.grpc.aio.InferenceServerClient."""

    def __init__(self, server: FakeServer) -> None:
        self.server = server
        self.calls: list[FakeAioCall] = []

    def stream_infer(self, inputs_iterator, stream_timeout=None):
        call = FakeAioCall(self.server, inputs_iterator)
        self.calls.append(call)
        return call

    async def close(self) -> None:
        self.server.closed += 1
