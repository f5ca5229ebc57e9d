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


def v2_event(event: dict) -> tuple[str | None, bool]:
    """(error message or None, finished) of one Triton generate_stream event."""
    return event.get("error"), bool(event.get("finish_reason"))


def openai_event(event: dict) -> tuple[str | None, bool]:
    """The same for an OpenAI completion chunk (`choices[0].finish_reason` on the last)."""
    error = event.get("error")
    if isinstance(error, dict):
        error = error.get("message", "")
    return error, bool((event.get("choices") or [{}])[0].get("finish_reason"))


async def read_events(resp: httpx.Response, out: Outcome, interpret=v2_event) -> None:
    """Count the events of one stream until its last one (a finish reason) or an error;
    `interpret` reads one event (v2_event, openai_event). OpenAI's `[DONE]` is skipped."""
    async for line in sse_lines(resp):
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        out.last_event = line[6:206]
        try:
            event = json.loads(line[6:])
        except json.JSONDecodeError:
            out.cause = "malformed event: " + line[:80]  # stays LOST: a stream cut mid-event
            return
        error, finished = interpret(event)
        if error is not None:
            out.kind, out.cause = ERRORED, error_cause(error)
            return
        out.tokens += 1
        if finished:
            out.kind = FINISHED
            return


@dataclass(slots=True, frozen=True)
class Target:
    """Where the soak sends: Triton's v2 generate_stream on the public port, or the OpenAI
    front's /v1/completions (which reaches Triton over gRPC)."""

    base: str
    api: str = "v2"  # or "openai"
    model: str = ""  # the OpenAI front's served name

    def request(self, payload: dict) -> tuple[str, dict]:
        if self.api == "v2":
            return f"{self.base}/v2/models/bucketserve_bls/generate_stream", {
                **payload,
                "stream": True,
            }
        body = {"model": self.model, "prompt": payload["text_input"], "stream": True}
        body.update({k: payload[k] for k in ("max_tokens", "seed", "min_tokens") if k in payload})
        return f"{self.base}/v1/completions", body


async def run_one(
    client: httpx.AsyncClient, target: Target, payload: dict, deadline_s: float,
    cancel_after_s: float,
) -> Outcome:  # fmt: skip
    """Send, read to the end; close early after cancel_after_s (> 0) like a client that left."""
    out = Outcome(LOST, start_s=time.monotonic(), max_tokens=payload.get("max_tokens", 0))
    url, body = target.request(payload)
    interpret = v2_event if target.api == "v2" else openai_event
    limit = cancel_after_s if cancel_after_s > 0 else deadline_s
    try:
        async with asyncio.timeout(limit):
            async with client.stream("POST", url, json=body) as resp:
                if resp.status_code != 200:
                    text = (await resp.aread()).decode("utf-8", "replace")
                    out.kind, out.cause = ERRORED, error_cause(text)
                else:
                    await read_events(resp, out, interpret)
    except TimeoutError:
        out.kind = CANCELLED if cancel_after_s > 0 else HUNG
    except httpx.HTTPError as e:
        out.kind, out.cause = ERRORED, "transport: " + type(e).__name__
    out.end_s = time.monotonic()
    return out
