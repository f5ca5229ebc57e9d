"""Triton entry point; all logic lives in bucketserve.serving.models.bls_model."""

from bucketserve.serving.launch.procs import exit_when_orphaned
from bucketserve.serving.models.bls_model import BlsModel as TritonPythonModel  # noqa: F401

exit_when_orphaned()  # a stub whose tritonserver died must not live on: docs/platform-notes.md#p18-orphaned-stubs
