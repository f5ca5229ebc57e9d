"""A gRPC client that leaves stops its requests on the `bucketserve` ensemble too.

Triton cancels a running ensemble step only between steps
(docs/platform-notes.md#p19-ensemble-cancellation-stops-between-steps): a client that cancels
its stream leaves its `bucketserve` requests queued, prefilling or decoding to their end, KV
blocks held all along. The HTTP edge answers that with a `stop` request carrying the request's
id (grpc_mux.py); the gRPC edge does the same for the streams it forwards. It follows each
request to an ensemble entry model until its FINAL or error; when the stream ends before (the
client cancelled, went away, or closed it early), it sends `stop: true` with that id, which the
scheduler honours for a queued request and decode for a running one. A request sent without an
id gets one (`edge-<hex>`), taken off again in its answers. The BLS entry models need none of
this: Triton cancels them directly.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass

import grpc
import numpy as np
from tritonclient.grpc import service_pb2

from bucketserve.serving.front.generate_json import Tensor, to_proto

ENSEMBLES = frozenset({"bucketserve"})  # the entry models that are Triton ensembles
STOP_INPUTS = [Tensor("text_input", "BYTES", (1,), np.array([b"stop"], dtype=np.object_)),
               Tensor("stop", "BOOL", (1,), np.array([True]))]  # fmt: skip
STOP_DRAIN_S = 10.0  # how long the stops' own answers are read before their stream is closed
FINAL = "triton_final_response"


@dataclass(slots=True, frozen=True)
class Followed:
    model: str
    version: str
    assigned: bool  # the id is the edge's: its answers go back without it


class StreamFollower:
    """The ensemble requests of one forwarded stream that have not ended yet."""

    def __init__(self) -> None:
        self.live: dict[str, Followed] = {}

    def request(self, req: service_pb2.ModelInferRequest, raw: bytes) -> bytes:
        """The bytes to send upstream for `req` (parsed from `raw`)."""
        if req.model_name not in ENSEMBLES:
            return raw
        assigned = not req.id
        if assigned:
            req.id = f"edge-{uuid.uuid4().hex}"
            raw = req.SerializeToString()
        self.live[req.id] = Followed(req.model_name, req.model_version, assigned)
        return raw

    def response(self, raw: bytes) -> bytes:
        """The bytes to send the client for one upstream answer."""
        if not self.live:
            return raw
        resp = service_pb2.ModelStreamInferResponse.FromString(raw)
        rid = resp.infer_response.id
        followed = self.live.get(rid)
        if followed is None:
            return raw
        params = resp.infer_response.parameters
        if resp.error_message or (FINAL in params and params[FINAL].bool_param):
            del self.live[rid]
        if not followed.assigned:
            return raw
        resp.infer_response.id = ""
        return resp.SerializeToString()

    def stops(self) -> list[service_pb2.ModelInferRequest]:
        """A stop request for every followed request that has not ended."""
        return [to_proto(f.model, f.version, rid, STOP_INPUTS, {}) for rid, f in self.live.items()]


async def send_stops(channel: grpc.aio.Channel, service: str, stops: list, metadata) -> None:
    """Send `stops` on a stream of their own and read their answers (each stop ends with a
    FINAL of its own); bounded, and never raises: the client is gone, nobody waits."""

    async def requests():
        for req in stops:
            yield req.SerializeToString()

    call = channel.stream_stream(f"/{service}/ModelStreamInfer")(requests(), metadata=metadata)
    try:
        async with asyncio.timeout(STOP_DRAIN_S):
            finals = 0
            async for raw in call:
                resp = service_pb2.ModelStreamInferResponse.FromString(raw)
                params = resp.infer_response.parameters
                if resp.error_message or (FINAL in params and params[FINAL].bool_param):
                    finals += 1
                    if finals == len(stops):
                        break
    except (TimeoutError, grpc.aio.AioRpcError):
        pass
    finally:
        call.cancel()
