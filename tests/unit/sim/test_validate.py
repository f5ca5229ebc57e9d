"""Simulator-vs-server plumbing: a server run whose measurements ARE the simulation's shows 0 error."""

from __future__ import annotations

import json

import pytest
from bucketserve.sim.evidence_report import write_rows
from bucketserve.sim.validate import compare_run, has_request_logs, read_validation


def bench_rows():
    for phase in ("prefill", "decode"):
        for batch in (1, 2, 4):
            for length in (32, 128, 384):
                per = (
                    2e-3 * batch * length + 0.02
                    if phase == "prefill"
                    else 0.03 + 1e-5 * batch * length
                )
                tokens = batch * length if phase == "prefill" else batch
                yield {"impl": "bucketserve", "phase": phase, "batch": batch, "prompt_len": length,
                       "tokens_per_s": tokens / per}  # fmt: skip


def test_zero_error_when_the_server_behaves_like_the_model(tmp_path):
    bench = tmp_path / "bench.jsonl"
    bench.write_text("".join(json.dumps(r) + "\n" for r in bench_rows()))
    (tmp_path / "run" / "requests").mkdir(parents=True)
    reqs = [{"idx": i, "t_send_s": 1.5 * i, "input_tokens": 60 + 20 * i, "max_tokens": 8 + i,
             "ttft_slo_s": 2.0, "tpot_slo_s": 0.15, "source": "alpaca", "ttft_s": 1.0, "tpot_s": 0.05}
            for i in range(6)]  # fmt: skip
    path = tmp_path / "run" / "requests" / "distserve_rate0.7.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in reqs))
    first, _ = compare_run(tmp_path / "run", bench)
    # feed the simulated means back as the "measured" ones: the error must vanish
    for r in reqs:
        r["ttft_s"], r["tpot_s"] = first[0]["sim_ttft_s"], first[0]["sim_tpot_s"]
    path.write_text("".join(json.dumps(r) + "\n" for r in reqs))
    rows, model = compare_run(tmp_path / "run", bench)
    assert rows[0]["policy"] == "distserve" and rows[0]["rate"] == 0.7
    assert rows[0]["ttft_error"] == pytest.approx(0.0, abs=1e-9)
    assert rows[0]["tpot_error"] == pytest.approx(0.0, abs=1e-9)
    assert rows[0]["sim_attainment"] == 1.0 and "fitted bilinear" in model


def test_stored_validation_rows_read_back_as_compare_run_made_them(tmp_path):
    bench = tmp_path / "bench.jsonl"
    bench.write_text("".join(json.dumps(r) + "\n" for r in bench_rows()))
    (tmp_path / "run" / "requests").mkdir(parents=True)
    assert not has_request_logs(tmp_path / "run")  # a fresh clone: the logs are not committed
    reqs = [{"idx": i, "t_send_s": 1.5 * i, "input_tokens": 60, "max_tokens": 8, "ttft_slo_s": 2.0,
             "tpot_slo_s": 0.15, "source": "alpaca", "ttft_s": 1.0, "tpot_s": 0.05}
            for i in range(4)]  # fmt: skip
    path = tmp_path / "run" / "requests" / "distserve_rate0.5.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in reqs))
    assert has_request_logs(tmp_path / "run")
    rows, _ = compare_run(tmp_path / "run", bench)
    write_rows(rows, tmp_path / "validation.csv")
    back = read_validation(tmp_path / "validation.csv")
    assert back[0].keys() == rows[0].keys()
    for k, v in rows[0].items():
        assert back[0][k] == (pytest.approx(v, nan_ok=True) if isinstance(v, float) else v), k
