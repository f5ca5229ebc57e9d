"""Triton entry point; all logic lives in bucketserve.serving.bls_model."""

from bucketserve.serving.bls_model import BlsModel as TritonPythonModel  # noqa: F401
