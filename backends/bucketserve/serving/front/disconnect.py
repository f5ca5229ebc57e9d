"""The edge's one cancellation path for answers sent whole: a client that hangs up stops its
generation.

A stream notices a client that left when its next chunk cannot be sent (the generator is
closed, which sends the `stop`, front/grpc_mux.py). An answer sent whole has nothing to send
until the end, so it is collected in a task while the connection is watched; a hang-up cancels
the task, which closes the same generator, so the same `stop` goes out (v2 `generate` and
non-streamed OpenAI requests alike).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable

from starlette.requests import Request

POLL_S = 0.2


class ClientGone(Exception):
    """The client closed its connection before the answer was ready."""


async def unless_disconnected(request: Request, work: Awaitable, poll_s: float = POLL_S):
    """The result of `work`; ClientGone (with `work` cancelled) once the client hung up."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=poll_s)
            if done:
                return task.result()
            if await request.is_disconnected():
                raise ClientGone
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
