"""perf_analyzer export parsing, genai-perf CSV parsing, report sections with missing tools."""

from __future__ import annotations

import json

import pytest
from fixed_load import FixedLoadResult
from genai_perf import read_csv
from metrics import summarize
from perf_analyzer import input_data, parse_export
from records import RequestRecord
from report_fixed import fixed_load_section
from workloads import BenchRequest

REQ = BenchRequest(0, "fixed", "some prompt", 84, 3, 2.0, 0.15)


def test_perf_analyzer_export_becomes_records(tmp_path):
    ns = 1_000_000_000
    export = {"experiments": [{"requests": [{
        "timestamp": 5 * ns,
        "response_timestamps": [int(5.5 * ns), int(5.6 * ns), int(5.7 * ns)],
        "response_outputs": [{"num_output_tokens": 1}, {"num_output_tokens": 2},
                             {"num_output_tokens": 3, "finish_reason": "length"}],
    }]}]}  # fmt: skip
    path = tmp_path / "export.json"
    path.write_text(json.dumps(export))
    (rec,) = parse_export(path, [REQ])
    assert rec.ok and rec.ttft_s == pytest.approx(0.5) and rec.e2e_s == pytest.approx(0.7)
    assert rec.output_tokens == 3 and rec.tpot_s == pytest.approx(0.1)


def test_perf_analyzer_input_data_carries_the_contract():
    entry = input_data([REQ])["data"][0]
    assert entry["text_input"] == ["some prompt"] and entry["stream"] == [True]
    assert entry["max_tokens"] == entry["min_tokens"] == [3]


def test_genai_perf_csv(tmp_path):
    path = tmp_path / "g.csv"
    path.write_text(
        "Metric,avg,min,max,p50\nTime To First Token (ms),477.60,168.15,662.15,491.41\n"
        'Request Latency (ms),"1,303.94","1,044.96","1,451.38","1,348.09"\n\n'
        "Metric,Value\nRequest Throughput (per sec),1.50\n"
    )
    got = read_csv(path)
    assert got["Time To First Token (ms)"]["p50"] == pytest.approx(491.41)
    assert got["Request Latency (ms)"]["avg"] == pytest.approx(1303.94)
    assert got["Request Throughput (per sec)"]["value"] == pytest.approx(1.5)


def test_fixed_load_section_survives_missing_tools():
    r = RequestRecord(0, "fixed", 0.0, 0.0, 84, 3, 2.0, 0.15)
    r.add_chunk(0.5, 1)
    r.add_chunk(0.7, 3)
    r.finish(0.7)
    fx = FixedLoadResult(2, 1, summarize("loadgen", 0.0, [r]), pa_error="boom")
    text = "\n".join(fixed_load_section(fx, 0.1))
    assert "perf_analyzer did not complete: `boom`" in text and "| throughput" in text
