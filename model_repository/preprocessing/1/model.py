"""Triton entry point; all logic lives in bucketserve.serving.preprocess."""

from bucketserve.serving.procs import exit_when_orphaned
from bucketserve.serving.preprocess import PreprocessModel as TritonPythonModel  # noqa: F401

exit_when_orphaned()  # a stub whose tritonserver died must not live on: docs/platform-notes.md#p18-orphaned-stubs
