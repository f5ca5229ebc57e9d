"""Triton entry point; all logic lives in bucketserve.serving.decode_model."""

from bucketserve.serving.decode_model import DecodeModel as TritonPythonModel  # noqa: F401
