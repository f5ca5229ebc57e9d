"""Triton entry point; all logic lives in bucketserve.serving.prefill_model."""

from bucketserve.serving.prefill_model import PrefillModel as TritonPythonModel  # noqa: F401
