"""perf_analyzer export parsing, genai-perf CSV parsing, report sections with missing tools."""

from __future__ import annotations

import json

import pytest
from bucketserve.bench.aiperf_run import aiperf_csv
from bucketserve.bench.fixed_load import FixedLoadResult
from bucketserve.bench.genai_perf import metric, read_csv, run_script, tool_env
from bucketserve.bench.metrics import summarize
from bucketserve.bench.perf_analyzer import input_data, parse_export
from bucketserve.bench.records import RequestRecord
from bucketserve.bench.report_fixed import fixed_load_section
from bucketserve.bench.workloads import BenchRequest

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


def test_a_tool_script_gets_our_prompts_and_a_failed_run_names_its_log(tmp_path):
    script = tmp_path / "tool.sh"
    script.write_text('#!/bin/sh\necho "$1 $CONCURRENCY $REQUESTS $OUTPUT_MEAN $MODEL" > "$2/args"\n'
                      'mkdir -p "$2/concurrency4"; echo "no server" > "$2/concurrency4/aiperf_stdout.txt"\n'
                      "exit 3\n")  # fmt: skip
    script.chmod(0o755)
    env = tool_env([REQ, REQ], 4, tmp_path, MODEL="m")
    assert env["INPUT_FILE"] == str(tmp_path / "prompts.jsonl")
    assert (tmp_path / "prompts.jsonl").read_text().count("some prompt") == 2
    proc = run_script(script, "host:1", tmp_path, env, 10.0)
    assert (tmp_path / "args").read_text() == "host:1 4 2 3 m\n"
    with pytest.raises(RuntimeError, match="aiperf exited 3: no server"):
        aiperf_csv(proc, tmp_path, 4)


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


def test_aiperf_and_genai_perf_csv_figures_in_seconds(tmp_path):
    aiperf = tmp_path / "a.csv"
    aiperf.write_text(
        "Metric,avg,min,max,sum,p50\nTime to First Token (ms),250.00,100.00,400.00,,240.00\n"
        "Inter Token Latency (ms),40.00,30.00,50.00,,41.00\n\n"
        "Metric,Value\nRequest Throughput (requests/sec),1.25\n"
    )
    got = read_csv(aiperf)
    assert metric(got, "Time To First Token", "avg") == pytest.approx(0.25)
    assert metric(got, "inter token latency", "p50") == pytest.approx(0.041)
    assert metric(got, "Request Throughput", "value") == pytest.approx(1.25)
    assert metric(got, "Request Latency", "avg") is None


def test_fixed_load_section_has_a_column_per_external_tool():
    r = RequestRecord(0, "fixed", 0.0, 0.0, 84, 3, 2.0, 0.15)
    r.add_chunk(0.5, 1)
    r.add_chunk(0.7, 3)
    r.finish(0.7)
    ours = summarize("loadgen", 0.0, [r])
    csv = {"Request Throughput (requests/sec)": {"value": 2 * ours.served_rate},
           "Time to First Token (ms)": {"avg": 500.0, "p50": 500.0}}  # fmt: skip
    fx = FixedLoadResult(2, 1, ours, ext={"aiperf": csv}, ext_errors={"genai-perf trtllm": "x"})
    text = "\n".join(fixed_load_section(fx, 0.1))
    head = next(line for line in text.splitlines() if line.startswith("| metric"))
    assert "aiperf" in head and "genai-perf vllm" in head and "genai-perf trtllm" in head
    row = next(line for line in text.splitlines() if line.startswith("| throughput"))
    assert "+100.0%" in row  # AIPerf's throughput, twice ours
    assert "genai-perf trtllm did not complete: `x`" in text


def test_fixed_load_section_survives_missing_tools():
    r = RequestRecord(0, "fixed", 0.0, 0.0, 84, 3, 2.0, 0.15)
    r.add_chunk(0.5, 1)
    r.add_chunk(0.7, 3)
    r.finish(0.7)
    fx = FixedLoadResult(2, 1, summarize("loadgen", 0.0, [r]), pa_error="boom")
    text = "\n".join(fixed_load_section(fx, 0.1))
    assert "perf_analyzer did not complete: `boom`" in text and "| throughput" in text


def test_policy_comparison_targets_name_their_topology():
    """bench-smoke compares prefill batching: every server it starts says which topology it
    runs (left out, the server's default, auto, would make them all colocated)."""
    from bucketserve.bench.compare import SMOKE, parse_args, select_targets
    from bucketserve.serving.config import ServeConfig

    targets, _ = select_targets(parse_args(["--smoke", "--ablations"]), SMOKE)
    assert len(targets) >= 8  # five policies and three ablations
    for t in targets:
        cfg = ServeConfig(policy=t.policy, **t.overrides)
        assert cfg.topology == "disaggregated", t
    both, _ = select_targets(parse_args(["--smoke", "--topologies", "colocatedx2"]), SMOKE)
    for t in both:  # the policies on two colocated instances; the fixed-load host as before
        cfg = ServeConfig(**t.overrides)
        if t.label.endswith("@colocatedx2"):
            assert (cfg.topology, cfg.decode_devices) == ("colocated", ["cpu", "cpu"]), t
        else:
            assert cfg.topology == "disaggregated", t
    assert sum(t.label.endswith("@colocatedx2") for t in both) == 5


def test_dtype_comparison_runs_each_policy_in_each_dtype():
    """--dtypes float32,bfloat16: one server per (policy, dtype), labelled @dtype; none given:
    no dtype override (the server's auto) and no suffix."""
    from bucketserve.bench.compare import SMOKE, parse_args, select_targets
    from bucketserve.serving.config import ServeConfig

    args = ["--smoke", "--policies", "bucketserve", "--skip-fixed-load"]
    targets, _ = select_targets(parse_args([*args, "--dtypes", "float32,bfloat16"]), SMOKE)
    assert [t.label for t in targets] == ["bucketserve@float32", "bucketserve@bfloat16"]
    assert [ServeConfig(**t.overrides).dtype for t in targets] == ["float32", "bfloat16"]
    plain, _ = select_targets(parse_args(args), SMOKE)
    assert [t.label for t in plain] == ["bucketserve"] and "dtype" not in plain[0].overrides


def test_benchmark_clients_share_one_event_loop():
    """bench.aio.run keeps one loop per process: grpc.aio's poller, bound to the first loop,
    must not be left calling into a closed one by a second sweep (a second asyncio.run)."""
    import asyncio

    from bucketserve.bench import aio

    async def current():
        await asyncio.sleep(0)
        return asyncio.get_running_loop()

    first, second = aio.run(current()), aio.run(current())
    assert first is second and not first.is_closed()
