"""Fixtures of the KV tests."""

from __future__ import annotations

import pytest

from tests.unit.kv.kv_workers import ShmNames


@pytest.fixture
def names():
    """Unique shm names for one test, every leftover segment unlinked at teardown."""
    made = ShmNames()
    yield made
    made.cleanup()
