"""Triton entry point; all logic lives in bucketserve.serving.scheduler_model."""

from bucketserve.serving.procs import exit_when_orphaned
from bucketserve.serving.scheduler_model import SchedulerModel as TritonPythonModel  # noqa: F401

exit_when_orphaned()  # a stub whose tritonserver died must not live on: docs/platform-notes.md#p18-orphaned-stubs
