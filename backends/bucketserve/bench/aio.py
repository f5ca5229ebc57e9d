"""One event loop for the benchmark clients of a process.

grpc.aio binds its completion-queue poller to the first event loop it runs on; a later
`asyncio.run` (a new loop) leaves that poller calling into the closed one, which prints
"RuntimeError: Event loop is closed" tracebacks between the runs of a sweep (seen in
`make bench-smoke` with a second server). `run` keeps one loop for the whole process instead.
"""

from __future__ import annotations

import asyncio
import atexit
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

_runner: asyncio.Runner | None = None


def run(coro: Coroutine[Any, Any, T]) -> T:
    """asyncio.run(coro) on the process's one benchmark event loop (created on first use)."""
    global _runner
    if _runner is None:
        _runner = asyncio.Runner()
        atexit.register(_runner.close)
    return _runner.run(coro)
