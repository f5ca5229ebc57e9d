"""make_scheduler: the one place a policy name becomes a scheduler object."""

from __future__ import annotations

from collections.abc import Callable

from bucketserve.scheduling.base import BaseScheduler
from bucketserve.scheduling.baselines import DistServeScheduler, FcfsScheduler, StaticScheduler
from bucketserve.scheduling.config import SchedulerConfig
from bucketserve.scheduling.pd_scheduler import BucketServeScheduler
from bucketserve.scheduling.plus import BucketServePlus

_CLASSES: dict[str, type[BaseScheduler]] = {
    "static": StaticScheduler,
    "fcfs": FcfsScheduler,
    "distserve": DistServeScheduler,
    "bucketserve": BucketServeScheduler,
    "bucketserve+": BucketServePlus,
}
POLICIES: tuple[str, ...] = tuple(_CLASSES)


def make_scheduler(
    policy: str, config: SchedulerConfig, clock: Callable[[], float]
) -> BaseScheduler:
    """A fresh scheduler of the named policy reading time from `clock` (seconds)."""
    cls = _CLASSES.get(policy)
    if cls is None:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    return cls(config, clock)
