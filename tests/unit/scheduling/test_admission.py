"""Bounded admission: the gate and the memory-derived default limit."""

from __future__ import annotations

import pytest
from bucketserve.scheduling.admission import (
    MAX_LIMIT,
    MIN_LIMIT,
    AdmissionGate,
    default_queue_limit,
)


def test_gate_admits_up_to_the_limit_then_counts_rejections():
    gate = AdmissionGate(limit=3)
    assert [gate.admit(q) for q in range(5)] == [True, True, True, False, False]
    assert gate.rejected == 2
    assert "server busy" in gate.busy_message() and "max_queued_requests=3" in gate.busy_message()


def test_gate_limit_is_validated():
    with pytest.raises(ValueError, match="max_queued_requests"):
        AdmissionGate(limit=0)


def test_default_limit_scales_with_memory_and_context():
    gib = 1024**3
    small, big = default_queue_limit(1 * gib, 2048), default_queue_limit(16 * gib, 2048)
    assert MIN_LIMIT <= small < big <= MAX_LIMIT
    assert default_queue_limit(16 * gib, 131072) < big  # longer prompts: fewer fit
    assert default_queue_limit(0, 2048) == MIN_LIMIT
    assert default_queue_limit(10**15, 2048) == MAX_LIMIT
