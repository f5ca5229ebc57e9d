"""Triton entry point; all logic lives in bucketserve.serving.scheduler_model."""

from bucketserve.serving.scheduler_model import SchedulerModel as TritonPythonModel  # noqa: F401
