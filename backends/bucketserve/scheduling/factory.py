"""make_scheduler: the one place a policy name becomes a scheduler object."""

from __future__ import annotations

from collections.abc import Callable

from bucketserve.scheduling.base import BaseScheduler
from bucketserve.scheduling.baselines import (
    DistServeScheduler,
    FcfsScheduler,
    PadAwareFcfsScheduler,
    StaticScheduler,
)
from bucketserve.scheduling.config import SchedulerConfig
from bucketserve.scheduling.orderings import BulletOrderScheduler, EdfScheduler, SjfScheduler
from bucketserve.scheduling.pd_scheduler import BucketServeScheduler
from bucketserve.scheduling.plus import BucketServePlus
from bucketserve.scheduling.scls import SclsScheduler

_CLASSES: dict[str, type[BaseScheduler]] = {
    "static": StaticScheduler,
    "fcfs": FcfsScheduler,
    "distserve": DistServeScheduler,
    "bucketserve": BucketServeScheduler,
    "bucketserve+": BucketServePlus,
}
# simulator-only baselines (the server's KNOWN_POLICIES stay the five above)
_EXTRA: dict[str, type[BaseScheduler]] = {
    "fcfs-pad": PadAwareFcfsScheduler,
    "sjf": SjfScheduler,
    "edf": EdfScheduler,
    "bullet": BulletOrderScheduler,
    "scls": SclsScheduler,
}
POLICIES: tuple[str, ...] = tuple(_CLASSES)
SIM_POLICIES: tuple[str, ...] = POLICIES + tuple(_EXTRA)


def make_scheduler(
    policy: str, config: SchedulerConfig, clock: Callable[[], float]
) -> BaseScheduler:
    """A fresh scheduler of the named policy reading time from `clock` (seconds)."""
    cls = _CLASSES.get(policy) or _EXTRA.get(policy)
    if cls is None:
        raise ValueError(f"policy must be one of {SIM_POLICIES}, got {policy!r}")
    return cls(config, clock)
