"""What the supervisor tells the front: can the server take requests now, and if not, why.

Triton's own readiness stays 200 after a stub died
(docs/platform-notes.md#p12-dead-stub-stays-dead): the front's /v2/health/ready checks this first.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

STARTING, READY, DEGRADED, STOPPING = "starting", "ready", "degraded", "stopping"


@dataclass(slots=True)
class Health:
    """Written by the supervisor only; read by the front's request handlers (another thread)."""

    phase: str = STARTING
    cause: str = "server starting"
    upstream: str = ""  # base URL of Triton's internal HTTP endpoint, e.g. http://127.0.0.1:41234
    restarts: int = 0
    changed: threading.Event = field(default_factory=threading.Event)

    @property
    def is_ready(self) -> bool:
        return self.phase == READY

    def set(self, phase: str, cause: str = "", upstream: str | None = None) -> None:
        """Cause first, then phase: a reader that sees the new phase also sees why."""
        self.cause = cause
        if upstream is not None:
            self.upstream = upstream
        self.phase = phase
        self.changed.set()
