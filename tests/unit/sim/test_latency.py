"""Roofline regimes, KV pool sizing and the fitted bilinear model."""

from __future__ import annotations

import json

import pytest
from bucketserve.sim.hardware import A100_40GB, LLAMA2_13B, kv_pool_blocks
from bucketserve.sim.latency import FittedLatency


def test_llama2_13b_shapes_and_pool():
    assert LLAMA2_13B.kv_bytes_per_token == 819_200
    # 0.9 x 40 GiB - 26.03 GB weights = 12.62 GB -> / (16 x 819,200) = 963 blocks
    assert kv_pool_blocks(A100_40GB, LLAMA2_13B, 16) == 963


def test_roofline_regimes(latency):
    # short prefill: weight-read bound (26 GB / (1.555 TB/s x 0.8) = 20.9 ms) + 5 ms overhead
    assert latency.prefill_time([64]) == pytest.approx(0.0259, rel=0.01)
    # long prefill: compute bound, ~2 x 13e9 x 3584 FLOPs at 187 TFLOP/s, plus attention
    assert 0.5 < latency.prefill_time([3584]) < 0.6
    # padding charges N x longest
    assert latency.prefill_time([100, 3000], padded=True) > latency.prefill_time([100, 3000])
    # decode: memory bound, grows with context
    assert latency.decode_time(32, 32 * 500) > latency.decode_time(32, 32 * 100) > 0.0249
    assert latency.handoff_time(1000) == pytest.approx(1000 * 819_200 / 150e9 + 1e-3)


def test_fitted_model_from_engine_bench_lines(tmp_path):
    rows = []
    for batch in (1, 2, 4, 8):
        for plen in (128, 512, 1024):
            t_pre = 2e-5 * batch * plen + 1e-3 * batch + 1e-5 * plen + 0.01
            rows.append(
                {
                    "impl": "eager",
                    "phase": "prefill",
                    "batch": batch,
                    "prompt_len": plen,
                    "tokens_per_s": batch * plen / t_pre,
                }
            )
            t_dec = 1e-7 * batch * plen + 2e-4 * batch + 1e-6 * plen + 0.02
            rows.append(
                {
                    "impl": "eager",
                    "phase": "decode",
                    "batch": batch,
                    "prompt_len": plen,
                    "tokens_per_s": batch / t_dec,
                }
            )
    rows.append(
        {"impl": "other", "phase": "prefill", "batch": 1, "prompt_len": 1, "tokens_per_s": 1e-9}
    )
    path = tmp_path / "bench.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    fit = FittedLatency.from_jsonl(path, kv_bytes=819_200, impl="eager")
    assert fit.prefill_time([300] * 3) == pytest.approx(2e-5 * 900 + 3e-3 + 3e-3 + 0.01, rel=1e-3)
    assert fit.decode_time(4, 4 * 700) == pytest.approx(1e-7 * 2800 + 8e-4 + 7e-4 + 0.02, rel=1e-3)
    with pytest.raises(ValueError, match="prefill"):
        FittedLatency.from_rows(rows[:2], 819_200)


def test_two_points_fit_the_reduced_forms():
    rows = []
    for batch in (1, 16):  # what engine_bench measures by default on CPU: batch 1 and 16 at 128
        rows.append({"phase": "prefill", "batch": batch, "prompt_len": 128,
                     "tokens_per_s": batch * 128 / (2e-3 * batch * 128 + 0.05)})  # fmt: skip
        rows.append({"phase": "decode", "batch": batch, "prompt_len": 128,
                     "tokens_per_s": batch / (0.03 + 0.001 * batch)})  # fmt: skip
    fit = FittedLatency.from_rows(rows, 46_080)
    assert fit.prefill_time([100, 50]) == pytest.approx(2e-3 * 150 + 0.05, rel=1e-6)
    assert fit.decode_time(8, 8 * 500) == pytest.approx(0.03 + 0.008, rel=1e-6)
