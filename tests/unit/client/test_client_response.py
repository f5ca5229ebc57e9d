"""Parsing the server's responses into chunks and completions (no server)."""

import pytest
from bucketserve_client.response import (
    Collector,
    GenerationError,
    StreamState,
    is_final,
    parse_chunk,
)
from tritonclient.utils import InferenceServerException

from tests.unit.client.client_fakes import generation, make_result


def test_parse_chunk_reads_every_output():
    chunk = parse_chunk(make_result(text="Paris", reason="stop", n_in=7, n_out=9), 0.25)
    assert (chunk.text, chunk.finish_reason) == ("Paris", "stop")
    assert (chunk.num_input_tokens, chunk.num_output_tokens, chunk.time) == (7, 9, 0.25)


def test_empty_final_response_is_no_chunk_but_final():
    result = make_result(final=True)
    assert parse_chunk(result, 0.0) is None and is_final(result)
    assert not is_final(make_result(text="a"))  # no parameter: not final


def test_stream_state_follows_the_stream():
    state = StreamState("rid")
    chunks = [state.on_response(r, None) for r in generation(3, finish=True)]
    assert [c.text for c in chunks[:3]] == ["t0 ", "t1 ", "t2 "]
    assert chunks[3].finish_reason == "length" and state.is_final and state.is_finished


def test_finish_reason_marks_finished_before_the_final_flag():
    state = StreamState("rid")
    state.on_response(make_result(text="x", reason="stop", final=False), None)
    assert state.is_finished and not state.is_final
    assert state.on_response(make_result(final=True), None) is None
    assert state.is_final


def test_error_raises_generation_error_with_the_server_message():
    state = StreamState("rid-1")
    error = InferenceServerException(msg="max_tokens must be >= 1, got 0")
    with pytest.raises(GenerationError, match="max_tokens must be >= 1") as info:
        state.on_response(None, error)
    assert info.value.request_id == "rid-1" and state.is_final


def test_collector_joins_deltas_and_measures_ttft():
    state, collector = StreamState("rid"), Collector("rid")
    for r in generation(2, finish=True):
        collector.add(state.on_response(r, None))
    c = collector.completion(latency_s=1.0)
    assert c.text == "t0 t1 " and c.finish_reason == "length" and c.num_output_tokens == 2
    assert c.num_input_tokens == 5 and 0 <= c.ttft_s <= 1.0 and c.latency_s == 1.0
