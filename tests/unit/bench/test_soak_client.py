"""The soak client's SSE reading: events split on line feeds only, a cut event counts as lost."""

from __future__ import annotations

import asyncio

import httpx
from bucketserve.bench.soak_client import (
    ERRORED,
    FINISHED,
    LOST,
    Outcome,
    Target,
    openai_event,
    read_events,
    sse_lines,
)


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


def test_openai_chunks_end_on_a_finish_reason_and_errors_keep_their_cause():
    chunk = 'data: {"choices": [{"text": "%s", "finish_reason": %s}]}\n\n'
    body = chunk % ("a", "null") + chunk % ("b", '"length"') + "data: [DONE]\n\n"
    out = Outcome(LOST)
    _read(body.encode(), lambda r: read_events(r, out, openai_event))
    assert out.kind == FINISHED and out.tokens == 2
    cut = Outcome(LOST)  # no finish reason before the end: lost
    _read(
        (chunk % ("a", "null") + "data: [DONE]\n\n").encode(),
        lambda r: read_events(r, cut, openai_event),
    )
    assert cut.kind == LOST and cut.tokens == 1
    err = Outcome(LOST)
    body = 'data: {"error": {"message": "server busy: 16 waiting", "type": "x"}}\n\n'
    _read(body.encode(), lambda r: read_events(r, err, openai_event))
    assert err.kind == ERRORED and err.cause == "busy"


def test_targets_shape_the_request_for_their_api():
    p = {"text_input": "hi", "max_tokens": 8, "seed": 1, "min_tokens": 8}
    url, body = Target("http://h").request(p)
    assert url.endswith("/v2/models/bucketserve_bls/generate_stream") and body["stream"] is True
    url, body = Target("http://h", "openai", "m").request(p)
    assert url == "http://h/v1/completions"
    assert body == {"model": "m", "prompt": "hi", "stream": True, "max_tokens": 8, "seed": 1,
                    "min_tokens": 8}  # fmt: skip


async def _collect(agen):
    return [x async for x in agen]
