"""The public gRPC port: Triton's inference protocol, entry models only (docs/security.md).

Triton has no per-model access control, so its own gRPC port would run the internal models
(prefill_<i>, decode_<i>, scheduler, preprocessing, decode_router) for anyone who can reach it;
the seal of serving/core/messages.py stops most of that, but not a direct call of `preprocessing`
whose sealed answer a client can hand to `scheduler`. So tritonserver's gRPC listens on an
internal loopback port and this proxy serves `--grpc-port`: each call passes the allow-list
(front/allowlist.py: AccessPolicy.check_rpc), then goes on to Triton as the bytes the client
sent (nothing re-encoded: only the request's model name is read), its answers come back the
same way, one by one as Triton sends them. A refused call gets the answer Triton gives for a
model it does not have, or for a restricted protocol without its key.

Cancelling (or dropping) a call here cancels the call to Triton, so cancellation still reaches
the models (tests/server/test_cancel.py); requests on the `bucketserve` ensemble, which Triton
would leave running, are stopped by id (front/grpc_stops.py). It runs a grpc.aio server on its own thread and event
loop, next to the HTTP edge's.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import AsyncIterator, Mapping

import grpc
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2

from bucketserve.serving.front.allowlist import (
    GRPC_ADMIN,
    GRPC_GROUPS,
    GRPC_MODEL_METHODS,
    AccessPolicy,
    Refusal,
)
from bucketserve.serving.front.grpc_mux import UNLIMITED
from bucketserve.serving.front.grpc_stops import StreamFollower, send_stops
from bucketserve.serving.launch.ports import Port, PortUnavailable

SERVICE = "inference.GRPCInferenceService"
_METHODS = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods_by_name
REQUEST_TYPES = {name: getattr(service_pb2, m.input_type.name) for name, m in _METHODS.items()}
END = object()  # the upstream stream finished
UNREACHABLE = "tritonserver is not reachable (starting, restarting or stopping); retry"
START_TIMEOUT_S = 30.0


class BadRequest(Exception):
    """A request that is not the message its method takes."""


def requested_model(method: str, raw: bytes) -> str | None:
    """The model a request names (None for methods that name none), read with the request's
    own message class: field 1 exactly as Triton's parser reads it (the last occurrence wins)."""
    if method not in GRPC_MODEL_METHODS:
        return None
    try:
        req = REQUEST_TYPES[method].FromString(raw)
    except DecodeError as e:
        raise BadRequest(f"cannot parse {method} request: {e}") from None
    return req.model_name if method in ("ModelInfer", "ModelStreamInfer") else req.name


def stream_request(raw: bytes) -> service_pb2.ModelInferRequest:
    """One request of a ModelStreamInfer call, parsed as Triton parses it."""
    try:
        return service_pb2.ModelInferRequest.FromString(raw)
    except DecodeError as e:
        raise BadRequest(f"cannot parse ModelStreamInfer request: {e}") from None


def refused_answer(method: str, refusal: Refusal, raw: bytes) -> bytes | None:
    """What a refused call answers instead of an error status: Triton answers ModelReady of a
    model it does not have with ready=false, a stream request with an in-stream error carrying
    the request's id. None: answer with status_of(refusal)."""
    if refusal.status != 404:
        return None
    if method == "ModelReady":
        return service_pb2.ModelReadyResponse(ready=False).SerializeToString()
    if method == "ModelStreamInfer":
        rid = service_pb2.ModelInferRequest.FromString(raw).id
        return service_pb2.ModelStreamInferResponse(
            error_message=refusal.message, infer_response=service_pb2.ModelInferResponse(id=rid)
        ).SerializeToString()
    return None


def status_of(method: str, refusal: Refusal) -> grpc.StatusCode:
    """Triton's status codes: a missing key UNAVAILABLE, an absent model NOT_FOUND."""
    return grpc.StatusCode.UNAVAILABLE if refusal.status != 404 else grpc.StatusCode.NOT_FOUND


def upstream_status(e: grpc.aio.AioRpcError, target: str) -> tuple[grpc.StatusCode, str]:
    """Triton's status as Triton sent it; a transport error naming the internal address
    (Triton is not up) says so without it."""
    details = e.details() or ""
    if target in details:
        return grpc.StatusCode.UNAVAILABLE, UNREACHABLE
    return e.code(), details


def method_of(full: str) -> str | None:
    """'/inference.GRPCInferenceService/ModelInfer' -> 'ModelInfer'; None for anything else."""
    service, _, method = full.lstrip("/").partition("/")
    return method if service == SERVICE and method in GRPC_GROUPS else None


class Proxy(grpc.GenericRpcHandler):
    """Every method of Triton's service, forwarded as bytes to `channel` once allowed.

    `metadata`: what every upstream call carries (Triton's API key: the edge checked the
    client's already); a client's admin key goes on with it, so Triton checks that too."""

    def __init__(self, channel: grpc.aio.Channel, target: str, policy: AccessPolicy,
                 metadata=(), on_refusal=None) -> None:  # fmt: skip
        self.channel, self.target = channel, target
        self.policy, self.metadata = policy, tuple(metadata)
        self.on_refusal = on_refusal or (lambda reason: None)
        self.stopping: set[asyncio.Task] = set()  # stops in flight (kept from the collector)

    def service(self, details: grpc.HandlerCallDetails):
        method = method_of(details.method)
        if method is None:
            return None  # grpc answers UNIMPLEMENTED
        if method == "ModelStreamInfer":
            return grpc.stream_stream_rpc_method_handler(self.stream)
        # a partial of a coroutine function: grpc.aio awaits it (a lambda it would not)
        return grpc.unary_unary_rpc_method_handler(functools.partial(self.unary, method))

    def upstream_metadata(self, client: Mapping[str, str]) -> tuple:
        admin = ((GRPC_ADMIN, client[GRPC_ADMIN]),) if GRPC_ADMIN in client else ()
        return self.metadata + admin

    def check(self, method: str, model: str | None, client: Mapping[str, str]) -> Refusal | None:
        refusal = self.policy.check_rpc(method, model, client)
        if refusal is not None:
            self.on_refusal(refusal.reason)
        return refusal

    async def unary(self, method: str, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        client = client_metadata(context)
        try:
            refusal = self.check(method, requested_model(method, raw), client)
        except BadRequest as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        if refusal is not None:
            answer = refused_answer(method, refusal, raw)
            if answer is not None:
                return answer
            await context.abort(status_of(method, refusal), refusal.message)
        call = self.channel.unary_unary(f"/{SERVICE}/{method}")(
            raw, metadata=self.upstream_metadata(client), timeout=context.time_remaining()
        )
        try:
            return await call
        except grpc.aio.AioRpcError as e:
            await context.abort(*upstream_status(e, self.target))
        finally:
            call.cancel()  # the client left (this task was cancelled): so does Triton's call

    async def stream(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        """ModelStreamInfer: allowed requests go on to one upstream stream, refused ones are
        answered here in the same response stream, every response as soon as it is there."""
        client = client_metadata(context)
        refusal = self.check("ModelStreamInfer", None, client)
        if refusal is not None:
            await context.abort(status_of("ModelStreamInfer", refusal), refusal.message)
        out: asyncio.Queue = asyncio.Queue(maxsize=64)  # bounded: a slow client slows Triton
        follower = StreamFollower()  # ensemble requests: stopped by id if the client leaves

        async def allowed() -> AsyncIterator[bytes]:
            async for raw in requests:
                try:
                    req = stream_request(raw)
                except BadRequest as e:
                    await out.put(e)
                    return
                refusal = self.check("ModelStreamInfer", req.model_name, client)
                if refusal is None:
                    yield follower.request(req, raw)
                else:
                    await out.put(refused_answer("ModelStreamInfer", refusal, raw))

        call = self.channel.stream_stream(f"/{SERVICE}/ModelStreamInfer")(
            allowed(), metadata=self.upstream_metadata(client), timeout=context.time_remaining()
        )

        async def pump() -> None:
            try:
                async for resp in call:
                    await out.put(follower.response(resp))
                await out.put(END)
            except grpc.aio.AioRpcError as e:
                await out.put(e)

        reader = asyncio.get_running_loop().create_task(pump())
        try:
            while (item := await out.get()) is not END:
                if isinstance(item, grpc.aio.AioRpcError):
                    await context.abort(*upstream_status(item, self.target))
                if isinstance(item, BadRequest):
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(item))
                yield item
        finally:  # done, failed, or the client cancelled / went away: Triton's call ends too
            call.cancel()
            reader.cancel()
            stops = follower.stops()
            if stops:  # ensemble requests Triton would leave running
                task = asyncio.get_running_loop().create_task(send_stops(
                    self.channel, SERVICE, stops, self.upstream_metadata(client)))  # fmt: skip
                self.stopping.add(task)
                task.add_done_callback(self.stopping.discard)


def client_metadata(context: grpc.aio.ServicerContext) -> dict[str, str]:
    return {k.lower(): v for k, v in context.invocation_metadata() or () if isinstance(v, str)}


def address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class GrpcEdge:
    """The proxy listening on host:port (port 0: a free one), forwarding to `upstream`
    (Triton's internal gRPC address). Binds and serves once constructed (PortUnavailable,
    naming the port's flag, if it cannot bind); stop() ends it."""

    def __init__(self, policy: AccessPolicy, upstream: str, host: str, port: Port,
                 metadata=(), on_refusal=None) -> None:  # fmt: skip
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="grpc-edge", daemon=True)
        self.thread.start()
        self.server: grpc.aio.Server | None = None
        self.channel: grpc.aio.Channel | None = None
        try:
            self.port = self.call(self.open(policy, upstream, host, port, metadata, on_refusal))
        except BaseException:
            self.stop()
            raise

    def call(self, coro, timeout: float = START_TIMEOUT_S):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def open(self, policy, upstream, host, port: Port, metadata, on_refusal) -> int:
        self.channel = grpc.aio.insecure_channel(upstream, options=UNLIMITED)
        # no SO_REUSEPORT: a port another process listens on must fail here, not be shared
        self.server = grpc.aio.server(options=[*UNLIMITED, ("grpc.so_reuseport", 0)])
        self.server.add_generic_rpc_handlers(
            (Proxy(self.channel, upstream, policy, metadata, on_refusal),)
        )
        try:
            bound = self.server.add_insecure_port(address(host, port.port))
        except RuntimeError:  # grpcio raises where older versions returned 0
            bound = 0
        if not bound:
            raise PortUnavailable(host, port.port, port.flag, "address already in use")
        await self.server.start()
        return bound

    async def close(self, grace_s: float) -> None:
        if self.server is not None:
            await self.server.stop(grace_s)
        if self.channel is not None:
            await self.channel.close()

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop taking calls, let running ones finish for `grace_s`, then cancel them."""
        if self.thread.is_alive():
            try:
                self.call(self.close(grace_s), timeout=grace_s + 10)
            finally:
                self.loop.call_soon_threadsafe(self.loop.stop)
                self.thread.join(timeout=10)
        if not self.loop.is_running():
            self.loop.close()
