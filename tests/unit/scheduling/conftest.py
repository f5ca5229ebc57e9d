"""Shared builders for scheduling tests: requests, instance stats, a manual clock."""

from __future__ import annotations

import pytest
from bucketserve.scheduling import ClusterView, InstanceStats, RequestMeta

KV_13B = 819_200  # Llama-2-13B: 2 x 40 layers x 40 heads x 128 dim x 2 bytes


class Clock:
    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock() -> Clock:
    return Clock()


def req(rid: str, length: int, t: float = 0.0, max_tokens: int = 16, **kw) -> RequestMeta:
    return RequestMeta(request_id=rid, prompt_len=length, max_tokens=max_tokens, arrival_s=t, **kw)


def stats(
    iid: str,
    role: str,
    free: int,
    total: int = 10_000,
    running: int = 0,
    pending: int = 0,
    bs: int = 16,
) -> InstanceStats:
    return InstanceStats(iid, role, total, free, bs, running, 0.03, KV_13B, pending)


def view(
    p_free: int | None = None,
    d_free: int | None = None,
    d_running: int = 0,
    d_pending: int = 0,
    total: int = 10_000,
) -> ClusterView:
    """1 prefill + 1 decode instance; free counts default to `total`."""
    return ClusterView(
        [stats("p0", "prefill", total if p_free is None else p_free, total)],
        [stats("d0", "decode", total if d_free is None else d_free, total, d_running, d_pending)],
    )
