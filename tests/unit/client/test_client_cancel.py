"""Client and AsyncClient against a scripted tritonclient: results, errors, cancellation."""

import asyncio
import contextlib

import bucketserve_client.aio as aio_module
import bucketserve_client.client as client_module
import pytest
from bucketserve_client import AsyncClient, Client, GenerationError

from tests.unit.client.client_fakes import FakeAioClient, FakeGrpcClient, FakeServer


@pytest.fixture
def server(monkeypatch):
    srv = FakeServer()
    monkeypatch.setattr(
        client_module.grpcclient, "InferenceServerClient", lambda url: FakeGrpcClient(srv)
    )
    monkeypatch.setattr(aio_module.grpcaio, "InferenceServerClient", lambda url: FakeAioClient(srv))
    return srv


def test_generate_collects_the_stream(server):
    c = Client().generate("hi", max_tokens=3, temperature=0)
    assert c.text == "t0 t1 t2 " and c.finish_reason == "length" and c.num_output_tokens == 3
    ((model, rid, values),) = server.requests
    assert model == "bucketserve" and len(rid) == 32 and values["max_tokens"][0] == 3
    assert not values["stream"][0]
    assert server.stops == [False] and server.closed == 1  # finished: plain half-close


def test_each_request_gets_a_new_id(server):
    client = Client()
    client.generate("a")
    client.generate("b")
    assert server.requests[0][1] != server.requests[1][1]


def test_unknown_keyword_is_a_value_error(server):
    with pytest.raises(ValueError, match="unknown generation parameter"):
        Client().generate("hi", max_token=3)


def test_bad_model_name():
    with pytest.raises(ValueError, match="model must be one of"):
        Client(model="llama")


def test_server_error_becomes_generation_error(server):
    server.error = "max_tokens=9999 exceeds the context"
    with pytest.raises(GenerationError, match="exceeds the context"):
        Client().generate("hi")
    assert server.closed == 1


def test_early_break_on_ensemble_sends_stop_with_same_id(server):
    server.finish = False
    stream = Client(model="bucketserve").stream("hi")
    assert next(stream).text == "t0 "
    del stream  # dropping the generator closes it, as a `break` out of a for loop does
    (_, rid, _), (_, stop_rid, stop_values) = server.requests
    assert stop_rid == rid and stop_values["stop"][0]
    assert server.stops == [True, True] and server.closed == 1


def test_early_break_on_bls_cancels_the_stream(server):
    server.finish = False
    stream = Client(model="bucketserve_bls").stream("hi")
    next(stream)
    stream.close()
    assert len(server.requests) == 1 and server.stops == [True]


def test_break_after_finish_reason_sends_no_stop(server):
    for chunk in Client().stream("hi"):
        if chunk.finish_reason:
            break
    assert len(server.requests) == 1


def test_async_generate_and_concurrent_streams(server):
    async def run():
        async with AsyncClient() as client:
            c = await client.generate("hi")

            async def texts():
                return [ch.text async for ch in client.stream("hi")]

            return c, await asyncio.gather(*(texts() for _ in range(4)))

    completion, streams = asyncio.run(run())
    assert completion.text == "t0 t1 t2 " and completion.finish_reason == "length"
    assert all("".join(s) == completion.text for s in streams)
    assert server.stops == [True] * 5  # every RPC is ended after its FINAL


def test_async_early_exit_on_ensemble_sends_stop(server):
    server.finish = False

    async def run():
        async with AsyncClient() as client:
            async with contextlib.aclosing(client.stream("hi")) as chunks:
                async for _ in chunks:
                    break

    asyncio.run(run())
    (_, rid, _), (_, stop_rid, stop_values) = server.requests
    assert stop_rid == rid and stop_values["stop"][0]


def test_async_task_cancellation_cancels_the_bls_stream(server):
    server.finish = False

    async def run():
        async with AsyncClient(model="bucketserve_bls") as client:
            got = asyncio.Event()

            async def consume():
                async for _ in client.stream("hi"):
                    got.set()

            task = asyncio.create_task(consume())
            await got.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(run())
    assert len(server.requests) == 1 and server.stops == [True]


def test_async_error_becomes_generation_error(server):
    server.error = "text_input is required"

    async def run():
        async with AsyncClient() as client:
            await client.generate("hi")

    with pytest.raises(GenerationError, match="text_input is required"):
        asyncio.run(run())


def test_cancelling_ends_the_request_iterator_first():
    import queue

    class Stream:
        _request_queue = queue.Queue()

    class Grpc:
        _stream = Stream()

        def stop_stream(self, cancel_requests):
            assert Stream._request_queue.get_nowait() is None  # grpc's sender thread can exit
            self.cancelled = cancel_requests

    grpc = Grpc()
    client_module.stop_stream(grpc, cancel=True)
    assert grpc.cancelled
