"""Property: under every policy, a request waiting past max_wait_s is served next.

Random arrival sequences (gaps, lengths, online/offline) drive each scheduler on a manual
clock ticking every DT; prefill batches finish within a tick and decode frees them at the next.
Checked: (1) any batch formed while someone is overdue starts with the oldest waiting request;
(2) every request is scheduled within max_wait_s + DT of its arrival.
"""

from __future__ import annotations

from collections import deque

from bucketserve.scheduling import POLICIES, SchedulerConfig, make_scheduler
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .conftest import Clock, req, view

MAX_WAIT = 2.0
DT = 0.05
BATCHES_PER_TICK = 4

arrivals = st.lists(
    st.tuples(st.floats(min_value=DT / 2, max_value=1.0), st.integers(1, 1500), st.booleans()),
    min_size=1,
    max_size=60,
)


def drive(
    policy: str,
    items: list[tuple[float, int, bool]],
    total_blocks: int = 10_000,
    per_tick: int = BATCHES_PER_TICK,
) -> dict[str, float]:
    clock = Clock()
    cfg = SchedulerConfig(max_model_len=2048, block_size=16, max_wait_s=MAX_WAIT)
    sched = make_scheduler(policy, cfg, clock)
    t_arr, pending = 0.0, deque()
    for i, (gap, length, online) in enumerate(items):
        t_arr += gap
        pending.append(req(f"r{i}", length, t=t_arr, slo_class="online" if online else "offline"))
    waiting, waited, running = {}, {}, []
    tick = 0
    while pending or waiting:
        clock.t = t = tick * DT
        for batch in running:
            sched.on_batch_done(batch, DT)
            for r in batch.requests:
                sched.on_request_finished(r.request_id, 8)
        running = []
        while pending and pending[0].arrival_s <= t:
            meta = pending.popleft()
            sched.add(meta)
            waiting[meta.request_id] = meta
        for _ in range(per_tick):
            oldest = min(waiting.values(), key=lambda m: m.arrival_s, default=None)
            batch = sched.next_batch(view(total=total_blocks))
            if batch is None:
                break
            if oldest is not None and t - oldest.arrival_s >= MAX_WAIT:
                assert batch.requests[0].request_id == oldest.request_id, (policy, t, oldest)
            for r in batch.requests:
                waited[r.request_id] = t - r.arrival_s
                del waiting[r.request_id]
            running.append(batch)
        tick += 1
        assert tick < 100_000
    return waited


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy=st.sampled_from(POLICIES), items=arrivals)
def test_every_request_scheduled_within_starvation_bound(policy, items):
    waited = drive(policy, items)
    assert len(waited) == len(items)
    assert max(waited.values()) <= MAX_WAIT + DT + 1e-9


def test_edf_would_starve_a_long_request_without_the_bound():
    """bucketserve+ serves the earliest feasible deadline first: fresh short requests (0.25 s
    TTFT) keep beating a 1,500-token one (2.25 s TTFT) with one batch per tick, and it cannot
    ride along without making them late; the bound serves it once it is overdue."""
    items = [(0.01, 1500, True)] + [(DT / 2, 10, True)] * 300
    waited = drive("bucketserve+", items, per_tick=1)
    assert MAX_WAIT - DT <= waited["r0"] <= MAX_WAIT + DT
