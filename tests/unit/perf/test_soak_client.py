"""The soak client's SSE reading: events split on line feeds only, a cut event counts as lost."""

from __future__ import annotations

import asyncio

import httpx
from soak_client import FINISHED, LOST, Outcome, read_events, sse_lines


def _read(body: bytes, fn):
    async def main():
        transport = httpx.MockTransport(lambda r: httpx.Response(200, content=body))
        async with httpx.AsyncClient(transport=transport) as client:
            async with client.stream("GET", "http://upstream/") as resp:
                return await fn(resp)

    return asyncio.run(main())


def test_text_with_unicode_line_separators_stays_one_event():
    body = 'data: {"text_output": "a\u2028b\x85c"}\n\ndata: {"finish_reason": "length"}\n\n'
    lines = _read(body.encode(), lambda r: _collect(sse_lines(r)))
    assert lines == ['data: {"text_output": "a\u2028b\x85c"}', "", 'data: {"finish_reason": "length"}', ""]  # fmt: skip
    out = Outcome(LOST)
    _read(body.encode(), lambda r: read_events(r, out))
    assert out.kind == FINISHED and out.tokens == 2


def test_half_an_event_is_lost_with_its_text_as_the_cause():
    out = Outcome(LOST)
    _read(b'data: {"text_output": "par', lambda r: read_events(r, out))
    assert out.kind == LOST and out.cause.startswith("malformed event")


async def _collect(agen):
    return [x async for x in agen]
