"""Fixtures for engine unit tests."""

from __future__ import annotations

import pytest
from bucketserve.engine.config import EngineConfig
from bucketserve.engine.runner import ModelRunner


@pytest.fixture
def tiny_runner():
    """A float32 dummy:tiny runner (2 layers, hidden 64), a small pool of 4-token blocks."""
    runner = ModelRunner(
        EngineConfig(model="dummy:tiny", device="cpu", dtype="float32", num_blocks=96, block_size=4)
    )
    yield runner
    runner.close()
