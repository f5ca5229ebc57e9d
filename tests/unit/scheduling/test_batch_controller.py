"""Eq. 6 on a hand-computed Llama-2-13B / A100-40GB case."""

from __future__ import annotations

from bucketserve.scheduling.batch_controller import (
    DynamicBatchingController,
    estimate_n_max,
    kv_bytes_per_token,
    max_batch_size,
    token_capacity,
)

from .conftest import stats

GB = 1e9  # decimal gigabytes, as the paper's "40 GB" / "26 GB"


def test_llama2_13b_a100_40gb_by_hand():
    # Llama-2-13B: 40 layers, 40 heads, head_dim 128, fp16 -> 2*40*40*128*2 = 819,200 B/token
    per_token = kv_bytes_per_token(layers=40, kv_heads=40, head_dim=128, dtype_bytes=2)
    assert per_token == 819_200
    # M_remain = 40 GB - 26 GB weights = 14 GB; M_safe = 0.9 * 14 GB = 12.6 GB
    # 12.6e9 / 819,200 = 15,380.86 -> 15,380 tokens
    capacity = token_capacity((40 - 26) * GB, per_token, safety=0.9)
    assert capacity == 15_380
    # 512-token prompts: 30 * 512 = 15,360 <= 15,380 < 31 * 512 = 15,872 -> N_max = 30
    assert max_batch_size([512] * 100, capacity) == 30
    # Alpaca median (69 tokens): 222 * 69 = 15,318 <= 15,380 < 223 * 69 = 15,387 -> 222
    assert max_batch_size([69] * 500, capacity) == 222
    assert estimate_n_max(capacity, 69.0) == 222


def test_eq6_uses_each_requests_own_length():
    assert max_batch_size([100, 200, 300, 400], 600) == 3  # 100+200+300 = 600
    assert max_batch_size([700, 1], 600) == 0
    assert max_batch_size([], 600) == 0


def test_controller_recomputes_from_live_free_blocks():
    ctl = DynamicBatchingController(0.9)
    assert ctl.n_max(100.0) is None  # nothing seen yet
    # 1,068 free blocks x 16 tokens x 819,200 B = 13,998,489,600 B; x0.9 / 819,200 = 15,379.2
    cap = ctl.capacity(stats("p0", "prefill", 5_000), stats("d0", "decode", 1_068))
    assert cap == 15_379  # the smaller pool (decode) binds
    assert ctl.n_max(512.0) == 30
    cap = ctl.capacity(stats("p0", "prefill", 5_000), stats("d0", "decode", 100))
    assert cap == 1_440 and ctl.n_max(512.0) == 2  # less free memory -> smaller batches
