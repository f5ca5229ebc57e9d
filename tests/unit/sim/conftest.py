"""Small, fast simulation fixtures (Llama-2-13B on A100-40GB, roofline)."""

from __future__ import annotations

import pytest
from bucketserve.sim.cluster import ClusterSpec
from bucketserve.sim.hardware import A100_40GB, LLAMA2_13B
from bucketserve.sim.latency import RooflineLatency


@pytest.fixture
def latency() -> RooflineLatency:
    return RooflineLatency(LLAMA2_13B, A100_40GB)


@pytest.fixture
def cluster() -> ClusterSpec:
    return ClusterSpec.for_hardware(LLAMA2_13B, A100_40GB)
