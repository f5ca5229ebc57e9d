"""The OpenAI front's concurrency cap (`--max-concurrent-requests`): a real Starlette app behind
the middleware, driven over ASGI."""

from __future__ import annotations

import asyncio

import httpx
from bucketserve.serving.openai.app import ConcurrencyCap, Settings, create_app
from starlette.applications import Starlette
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route


def slow_app(release: asyncio.Event) -> Starlette:
    """POST streams one chunk once `release` is set; GET answers at once."""

    async def stream(request):
        async def body():
            await release.wait()
            yield b"data: done\n\n"

        return StreamingResponse(body(), media_type="text/event-stream")

    async def models(request):
        return JSONResponse({"data": []})

    return Starlette(routes=[Route("/v1/completions", stream, methods=["POST"]),
                             Route("/v1/models", models, methods=["GET"])])  # fmt: skip


async def until(cond, timeout_s: float = 5.0) -> None:
    for _ in range(int(timeout_s / 0.01)):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


def test_posts_beyond_the_cap_are_busy_at_once_and_served_after():
    async def run():
        release = asyncio.Event()
        cap = ConcurrencyCap(slow_app(release), limit=2)
        transport = httpx.ASGITransport(app=cap)
        async with httpx.AsyncClient(transport=transport, base_url="http://front") as c:
            held = [asyncio.create_task(c.post("/v1/completions", json={})) for _ in range(2)]
            await until(lambda: cap.inflight == 2)  # both streams open, neither finished
            busy = await asyncio.wait_for(c.post("/v1/completions", json={}), 2.0)
            assert busy.status_code == 503 and busy.headers["Retry-After"] == "1"
            err = busy.json()["error"]
            assert err["type"] == "server_error"
            assert err["message"].startswith("server busy: 2 requests in flight")
            assert "max_concurrent_requests=2" in err["message"]
            assert (await c.get("/v1/models")).status_code == 200  # not a POST: not capped
            release.set()
            assert [r.status_code for r in await asyncio.gather(*held)] == [200, 200]
            assert cap.inflight == 0
            again = await c.post("/v1/completions", json={})
            assert again.status_code == 200 and again.text == "data: done\n\n"

    asyncio.run(run())


def test_no_cap_by_default():
    async def run():
        release = asyncio.Event()
        cap = ConcurrencyCap(slow_app(release))
        transport = httpx.ASGITransport(app=cap)
        async with httpx.AsyncClient(transport=transport, base_url="http://front") as c:
            held = [asyncio.create_task(c.post("/v1/completions", json={})) for _ in range(20)]
            await asyncio.sleep(0.2)
            release.set()
            assert {r.status_code for r in await asyncio.gather(*held)} == {200}

    asyncio.run(run())


def test_create_app_installs_the_cap():
    settings = Settings(grpc_url="", metrics_url="", model="m", tokenizer=None)
    app = create_app(settings, client=None, pool=None, max_concurrent=3)
    caps = [m for m in app.user_middleware if m.cls is ConcurrencyCap]
    assert len(caps) == 1 and caps[0].kwargs == {"limit": 3}
