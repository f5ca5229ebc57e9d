"""Triton entry point; all logic lives in bucketserve.serving.preprocess."""

from bucketserve.serving.preprocess import PreprocessModel as TritonPythonModel  # noqa: F401
