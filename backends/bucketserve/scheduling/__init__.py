"""Scheduling core: gateway metadata, buckets, batch controller, P/D scheduler, policies, monitor.

Pure Python (no torch, no Triton); every time comes from the injected clock.
"""

from bucketserve.scheduling.base import BaseScheduler
from bucketserve.scheduling.batch import PrefillBatch
from bucketserve.scheduling.cluster import ClusterView, InstanceStats
from bucketserve.scheduling.config import SchedulerConfig
from bucketserve.scheduling.factory import POLICIES, SIM_POLICIES, make_scheduler
from bucketserve.scheduling.monitor import MonitorSnapshot
from bucketserve.scheduling.request import DEFAULT_SLOS, RequestMeta, SloDefaults

__all__ = [
    "DEFAULT_SLOS",
    "POLICIES",
    "SIM_POLICIES",
    "BaseScheduler",
    "ClusterView",
    "InstanceStats",
    "MonitorSnapshot",
    "PrefillBatch",
    "RequestMeta",
    "SchedulerConfig",
    "SloDefaults",
    "make_scheduler",
]
