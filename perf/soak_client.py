"""One soak request over HTTP generate_stream, classified by how it ended.

Every request must end one of four ways: finished (a last event with a finish reason), a clean
error event or error status (by cause), cancelled by the client on purpose, or hung (nothing
final within its deadline). "lost" is a stream that closed with none of these.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

import httpx

FINISHED, ERRORED, CANCELLED, HUNG, LOST = "finished", "errored", "cancelled", "hung", "lost"


@dataclass(slots=True)
class Outcome:
    """How one request ended, and when (monotonic seconds)."""

    kind: str
    cause: str = ""
    start_s: float = 0.0
    end_s: float = 0.0
    tokens: int = 0
    max_tokens: int = 0
    # the last SSE data line (first 200 characters): what a lost stream ended on
    last_event: str = ""


def error_cause(message: str) -> str:
    """A short, countable label for an error message."""
    m = message.lower()
    for key, label in (
        ("server busy", "busy"),
        ("server went away", "server restarting"),
        ("server unavailable", "server restarting"),
        ("shutting down", "shutting down"),
        ("cancel", "cancelled"),
    ):
        if key in m:
            return label
    return "other: " + message[:80]


async def sse_lines(resp: httpx.Response):
    """Lines of an SSE body, split on line feeds only. httpx's aiter_lines splits like
    str.splitlines, also at U+2028, U+0085 ..., which a model's text (raw, legal in JSON) can
    contain, and would cut an event in two."""
    buf = b""
    async for chunk in resp.aiter_bytes():
        *lines, buf = (buf + chunk).split(b"\n")
        for line in lines:
            yield line.rstrip(b"\r").decode("utf-8", "replace")
    if buf:
        yield buf.decode("utf-8", "replace")


async def read_events(resp: httpx.Response, out: Outcome) -> None:
    async for line in sse_lines(resp):
        if not line.startswith("data: "):
            continue
        out.last_event = line[6:206]
        try:
            event = json.loads(line[6:])
        except json.JSONDecodeError:
            out.cause = "malformed event: " + line[:80]  # stays LOST: a stream cut mid-event
            return
        if "error" in event:
            out.kind, out.cause = ERRORED, error_cause(event["error"])
            return
        out.tokens += 1
        if event.get("finish_reason"):
            out.kind = FINISHED
            return


async def run_one(
    client: httpx.AsyncClient, base: str, payload: dict, deadline_s: float, cancel_after_s: float
) -> Outcome:
    """Send, read to the end; close early after cancel_after_s (> 0) like a client that left."""
    out = Outcome(LOST, start_s=time.monotonic(), max_tokens=payload.get("max_tokens", 0))
    url = f"{base}/v2/models/bucketserve_bls/generate_stream"
    limit = cancel_after_s if cancel_after_s > 0 else deadline_s
    try:
        async with asyncio.timeout(limit):
            async with client.stream("POST", url, json={**payload, "stream": True}) as resp:
                if resp.status_code != 200:
                    body = (await resp.aread()).decode("utf-8", "replace")
                    out.kind, out.cause = ERRORED, error_cause(body)
                else:
                    await read_events(resp, out)
    except TimeoutError:
        out.kind = CANCELLED if cancel_after_s > 0 else HUNG
    except httpx.HTTPError as e:
        out.kind, out.cause = ERRORED, "transport: " + type(e).__name__
    out.end_s = time.monotonic()
    return out
