"""Triton entry point; all logic lives in bucketserve.serving.bls_model."""

from bucketserve.serving.procs import exit_when_orphaned
from bucketserve.serving.bls_model import BlsModel as TritonPythonModel  # noqa: F401

exit_when_orphaned()  # a stub whose tritonserver died must not live on: docs/platform-notes.md#p18-orphaned-stubs
